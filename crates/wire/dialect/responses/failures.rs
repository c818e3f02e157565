//! OpenAiResponses: failures and overflow: handoff's errors in the API's shape, and the answers that say the window was full.

use super::*;
use crate::dialect::Failures;

impl Failures for OpenAiResponses {
    fn error_json(&self, err: &ApiError) -> Value {
        DialectKind::OpenAiChat.get().error_json(err)
    }

    fn is_overflow(&self, body: &Value) -> bool {
        is_context_length_error(body)
            || body
                .pointer("/response/error")
                .is_some_and(is_context_length_error)
    }

    fn opening_event(&self, event: &Value) -> Opening {
        match event.get("type").and_then(Value::as_str) {
            Some("response.created" | "response.in_progress" | "response.queued") => {
                Opening::NeedMore
            }
            Some("error" | "response.failed") if self.is_overflow(event) => Opening::Overflow,
            _ => Opening::Relay,
        }
    }

    fn reply_overflowed(&self, reply: &[u8]) -> bool {
        #[derive(serde::Deserialize)]
        struct Failed {
            status: Option<String>,
            error: Option<Value>,
        }
        // Nearly every reply lacks the word: its bytes are searched before any parse.
        memchr::memmem::find(reply, b"failed").is_some()
            && crate::dialect::json_body::<Failed>(reply).is_ok_and(|r| {
                r.status.as_deref() == Some("failed")
                    && r.error.as_ref().is_some_and(is_context_length_error)
            })
    }
}
