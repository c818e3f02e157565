//! StubDialect: failures and overflow: handoff's errors in the API's shape, and the answers that say the window was full.

use super::*;
use crate::dialect::Failures;

impl Failures for StubDialect {
    fn error_json(&self, err: &ApiError) -> Value {
        json!({"fault": {"code": err.code.unwrap_or(err.kind), "detail": err.message}})
    }

    fn is_overflow(&self, body: &Value) -> bool {
        body.pointer("/fault/code").and_then(Value::as_str) == Some("window_exceeded")
    }

    fn opening_event(&self, event: &Value) -> crate::dialect::Opening {
        match event.get("fault") {
            Some(_) if self.is_overflow(event) => crate::dialect::Opening::Overflow,
            _ => crate::dialect::Opening::Relay,
        }
    }
}
