//! OpenAiChat: failures and overflow: handoff's errors in the API's shape, and the answers that say the window was full.

use super::*;
use crate::dialect::Failures;

impl Failures for OpenAiChat {
    fn error_json(&self, err: &ApiError) -> Value {
        // handoff's own error shape is OpenAI's.
        err.to_json()
    }

    fn is_overflow(&self, body: &Value) -> bool {
        crate::dialect::overflow::is_context_length_error(body)
    }

    fn refused_usage_ask(&self, error_body: &[u8]) -> bool {
        // Servers that predate `stream_options` name it in their refusal.
        memchr::memmem::find(error_body, b"stream_options").is_some()
    }
}
