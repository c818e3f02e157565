//! Calls that continue a conversation in its own API: handoff's summary call over the
//! conversation's cached prefix. The body is the client's, cut after the history, with
//! one user turn appended; each API says how that turn is spelled, how its body asks
//! for one plain reply, and how the reply reads as a chat completion.

use serde_json::{json, Map, Value};

/// How one API's conversation is continued ([`crate::dialect::Pair::continued_call`](super::Pair::continued_call)).
#[derive(Debug, Clone, Copy)]
pub struct ContinuedCall {
    /// Appends a user turn carrying `text` to the list.
    pub append: fn(&mut Vec<Value>, &str),
    /// Readies the body, its turn appended, for one plain reply of at most
    /// `max_tokens`: streaming off, the output limit set, and where the API caches at
    /// explicit marks and the client placed some, one on the appended turn.
    pub settle: fn(&mut Map<String, Value>, u64),
    /// The reply (with its status) as a chat completion.
    pub reply: fn(u16, Value) -> Value,
}

/// Streaming off, and nothing that only a stream or a background run may carry.
pub(super) fn not_streamed(body: &mut Map<String, Value>) {
    body.insert("stream".into(), json!(false));
    for field in ["stream_options", "background", "n"] {
        body.remove(field);
    }
}

/// Appends a user message whose content is `text`.
pub(super) fn push_user_turn(list: &mut Vec<Value>, text: &str) {
    list.push(json!({"role": "user", "content": text}));
}

/// The chat completions reply as it is.
pub(super) fn as_is(_status: u16, body: Value) -> Value {
    body
}
