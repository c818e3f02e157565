//! Gemini: the handoff pair: its continuation and handoff messages, their shape, and a summary call that continues the conversation.

use super::*;
use crate::dialect::Pair;

impl Pair for Gemini {
    fn continuation(&self) -> Value {
        json!({"role": "user", "parts": [{"text": CONTINUATION}]})
    }

    fn handoff(&self, text: &str, _reasoning_marker: bool) -> Value {
        json!({"role": "model", "parts": [{"text": text}]})
    }

    fn handoff_ok(&self, handoff: &Value) -> bool {
        handoff["parts"].is_array()
    }

    /// A `model` content after the pair would make two model turns in a row, which
    /// also ends the user turn the signature rules count from: the pair goes as one
    /// user content instead.
    fn joined_pair(&self, _continuation: &Value, handoff: &Value, next: &Message) -> Option<Value> {
        if next.role != Role::Assistant {
            return None;
        }
        let mut parts = vec![json!({"text": CONTINUATION_JOINED})];
        parts.extend(content::parts(handoff).iter().cloned());
        Some(json!({"role": "user", "parts": parts}))
    }
}
