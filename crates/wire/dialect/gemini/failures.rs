//! Gemini: failures and overflow: handoff's errors in the API's shape, and the answers that say the window was full.

use super::*;
use crate::dialect::Failures;

impl Failures for Gemini {
    fn error_json(&self, err: &ApiError) -> Value {
        let status = match err.status {
            StatusCode::UNAUTHORIZED => "UNAUTHENTICATED",
            StatusCode::FORBIDDEN => "PERMISSION_DENIED",
            StatusCode::NOT_FOUND => "NOT_FOUND",
            StatusCode::TOO_MANY_REQUESTS => "RESOURCE_EXHAUSTED",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => "UNAVAILABLE",
            StatusCode::GATEWAY_TIMEOUT => "DEADLINE_EXCEEDED",
            status if status.is_client_error() => "INVALID_ARGUMENT",
            _ => "INTERNAL",
        };
        let message = match err.code {
            Some(code) => format!("{} ({code})", err.message),
            None => err.message.clone(),
        };
        json!({"error": {"code": err.status.as_u16(), "message": message, "status": status}})
    }

    fn is_overflow(&self, body: &Value) -> bool {
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("");
        (message.contains("input token count") && message.contains("exceeds the maximum"))
            || crate::dialect::overflow::is_context_length_error(body)
    }
}
