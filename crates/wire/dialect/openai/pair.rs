//! OpenAiChat: the handoff pair: its continuation and handoff messages, their shape, and a summary call that continues the conversation.

use super::*;
use crate::dialect::Pair;

impl Pair for OpenAiChat {
    fn handoff_ok(&self, handoff: &Value) -> bool {
        handoff["content"].is_string()
    }

    fn continuation(&self) -> Value {
        json!({"role": "user", "content": crate::dialect::pair::CONTINUATION})
    }

    fn handoff(&self, text: &str, reasoning_marker: bool) -> Value {
        if reasoning_marker {
            json!({"role": "assistant", "content": text, "reasoning_content": crate::dialect::pair::REASONING_MARKER})
        } else {
            json!({"role": "assistant", "content": text})
        }
    }

    fn continued_call(&self) -> Option<crate::dialect::ContinuedCall> {
        Some(crate::dialect::ContinuedCall {
            append: crate::dialect::continued::push_user_turn,
            settle: |body, max_tokens| {
                crate::dialect::continued::not_streamed(body);
                // Reasoning models refuse max_tokens; a client that sent the newer
                // field has its limit there.
                let field = if body.contains_key("max_completion_tokens") {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                };
                body.insert(field.into(), max_tokens.into());
            },
            reply: crate::dialect::continued::as_is,
        })
    }
}
