//! A wire format's the handoff pair: its continuation and handoff messages, their shape, and a summary call that continues the conversation.

use crate::dialect::ContinuedCall;
use crate::dialect::Message;
use serde_json::Value;

/// One wire format's the handoff pair.
pub trait Pair: Send + Sync {
    /// The user continuation message of a handoff pair.
    fn continuation(&self) -> Value;

    /// The assistant handoff message; `reasoning_marker` only where the API allows one.
    fn handoff(&self, text: &str, reasoning_marker: bool) -> Value;

    /// True when a record's handoff message has a shape this API takes (its text as a
    /// string or as blocks).
    fn handoff_ok(&self, handoff: &Value) -> bool {
        let content = &handoff["content"];
        content.is_string() || content.is_array()
    }

    /// The pair as one message, when it may not stand as two before `next` (roles must
    /// alternate); `None` when the two messages go as they are.
    fn joined_pair(
        &self,
        _continuation: &Value,
        _handoff: &Value,
        _next: &Message,
    ) -> Option<Value> {
        None
    }

    /// How a summary call continues a conversation of this API over its cached
    /// prefix; `None` where handoff renders the history as text instead.
    fn continued_call(&self) -> Option<ContinuedCall> {
        None
    }
}
