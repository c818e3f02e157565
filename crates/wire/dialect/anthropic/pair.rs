//! AnthropicMessages: the handoff pair: its continuation and handoff messages, their shape, and a summary call that continues the conversation.

use super::*;
use crate::dialect::Pair;

impl Pair for AnthropicMessages {
    fn continuation(&self) -> Value {
        json!({"role": "user", "content": [{"type": "text", "text": CONTINUATION}]})
    }

    fn handoff(&self, text: &str, _reasoning_marker: bool) -> Value {
        json!({"role": "assistant", "content": [{"type": "text", "text": text}]})
    }

    fn joined_pair(&self, _continuation: &Value, handoff: &Value, next: &Message) -> Option<Value> {
        if next.role != Role::Assistant {
            return None;
        }
        let mut content = vec![json!({"type": "text", "text": CONTINUATION_JOINED})];
        match handoff.get("content") {
            Some(Value::String(text)) => content.push(json!({"type": "text", "text": text})),
            Some(Value::Array(blocks)) => content.extend(blocks.iter().cloned()),
            _ => {}
        }
        Some(json!({"role": "user", "content": content}))
    }

    fn continued_call(&self) -> Option<crate::dialect::ContinuedCall> {
        Some(crate::dialect::ContinuedCall {
            append: summary::append_user_text,
            settle: summary::settle_continued,
            reply: summary::to_completion,
        })
    }
}
