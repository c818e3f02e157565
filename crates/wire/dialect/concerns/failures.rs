//! A wire format's failures and overflow: handoff's errors in the API's shape, and the answers that say the window was full.

use crate::dialect::Opening;
use crate::error::ApiError;
use serde_json::Value;

/// One wire format's failures and overflow.
pub trait Failures: Send + Sync {
    /// handoff's own error, in the API's error shape.
    fn error_json(&self, err: &ApiError) -> Value;

    /// True when an error body says the input exceeded the model's window.
    fn is_overflow(&self, body: &Value) -> bool;

    /// What one event at the opening of a stream says: an error event is an overflow
    /// or not; a preamble event (Anthropic's `message_start`, `ping`) needs more;
    /// anything else is output.
    fn opening_event(&self, event: &Value) -> Opening {
        let is_error = event.get("error").is_some_and(|e| !e.is_null())
            || event.get("type").and_then(Value::as_str) == Some("error");
        if is_error {
            if self.is_overflow(event) {
                Opening::Overflow
            } else {
                Opening::Relay
            }
        } else {
            Opening::Relay
        }
    }

    /// True when a successful, non-streamed reply (its body as sent) stopped because the
    /// window was full. Bytes, not a parsed value: most dialects never look, and a
    /// reply is parsed whole once, to be logged.
    fn reply_overflowed(&self, _reply: &[u8]) -> bool {
        false
    }

    /// True when `error_body` refuses what [`crate::dialect::Replies::ask_usage`] added, so the request
    /// goes again as the client sent it.
    fn refused_usage_ask(&self, error_body: &[u8]) -> bool {
        let _ = error_body;
        false
    }
}
