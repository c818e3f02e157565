//! AnthropicMessages: failures and overflow: handoff's errors in the API's shape, and the answers that say the window was full.

use super::*;
use crate::dialect::Failures;

impl Failures for AnthropicMessages {
    fn error_json(&self, err: &ApiError) -> Value {
        let kind = match err.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            status if status.is_client_error() => "invalid_request_error",
            _ => "api_error",
        };
        let message = match err.code {
            Some(code) => format!("{} ({code})", err.message),
            None => err.message.clone(),
        };
        json!({"type": "error", "error": {"type": kind, "message": message}})
    }

    fn is_overflow(&self, body: &Value) -> bool {
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("");
        message.contains("prompt is too long")
            || message.contains("exceed context limit")
            || crate::dialect::overflow::is_context_length_error(body)
    }

    fn opening_event(&self, event: &Value) -> Opening {
        match event.get("type").and_then(Value::as_str) {
            Some("message_start" | "ping") => Opening::NeedMore,
            Some("error") if self.is_overflow(event) => Opening::Overflow,
            _ => Opening::Relay,
        }
    }

    fn reply_overflowed(&self, reply: &[u8]) -> bool {
        #[derive(serde::Deserialize)]
        struct Stopped {
            stop_reason: Option<String>,
        }
        const STOP: &str = "model_context_window_exceeded";
        // Nearly every reply lacks the word: its bytes are searched before any parse.
        memchr::memmem::find(reply, STOP.as_bytes()).is_some()
            && crate::dialect::json_body::<Stopped>(reply)
                .is_ok_and(|r| r.stop_reason.as_deref() == Some(STOP))
    }
}
