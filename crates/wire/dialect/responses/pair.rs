//! OpenAiResponses: the handoff pair: its continuation and handoff messages, their shape, and a summary call that continues the conversation.

use super::*;
use crate::dialect::Pair;

impl Pair for OpenAiResponses {
    fn continuation(&self) -> Value {
        json!({"role": "user", "content": CONTINUATION})
    }

    fn handoff(&self, text: &str, _reasoning_marker: bool) -> Value {
        json!({"role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]})
    }

    fn continued_call(&self) -> Option<crate::dialect::ContinuedCall> {
        Some(crate::dialect::ContinuedCall {
            append: crate::dialect::continued::push_user_turn,
            settle: |body, max_tokens| {
                crate::dialect::continued::not_streamed(body);
                body.insert("max_output_tokens".into(), max_tokens.into());
            },
            reply: summary::to_completion,
        })
    }
}
