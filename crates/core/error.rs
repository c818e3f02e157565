//! The one error handoff answers with. Its own shape, `{"error": {"message", "type",
//! "param", "code"}}` (OpenAI's, which the admin API uses too), is rendered here; a
//! dialect renders it in its API's shape (`ErrorResponse::into_response_for`, in
//! `dialect`), so this module knows no wire format but its own.
//!
//! Other modules return their own typed errors and convert them into [`ApiError`];
//! none of them builds an error response by hand.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};

use crate::body::{full, ProxyBody};

/// An error answered to the client.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{status} {kind}: {message}")]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI's `type`, e.g. `invalid_request_error`.
    pub kind: &'static str,
    /// OpenAI's `code`, e.g. `context_length_exceeded`.
    pub code: Option<&'static str>,
    /// What went wrong, with the values that explain it.
    pub message: String,
    /// Seconds to wait before retrying, sent as `Retry-After`.
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: Option<&'static str>,
        message: String,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message,
            retry_after: None,
        }
    }

    /// 401 for a missing or unknown proxy key.
    pub fn invalid_api_key(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            Some("invalid_api_key"),
            message.into(),
        )
    }

    /// 403 for a model outside the key's allow-list.
    pub fn model_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            Some("model_not_allowed"),
            message.into(),
        )
    }

    /// 507 when a tenant's log has reached `store.tenant_quota_bytes`.
    pub fn quota_exceeded(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INSUFFICIENT_STORAGE,
            "insufficient_storage",
            Some("tenant_quota_exceeded"),
            message.into(),
        )
    }

    /// 403 for a path outside the key's allow-list.
    pub fn path_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            Some("path_not_allowed"),
            message.into(),
        )
    }

    /// 403 for a listing a shared upstream key would answer with every team's objects.
    pub fn listing_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            Some("listing_not_allowed"),
            message.into(),
        )
    }

    /// 403 for an admin request that is neither authenticated nor local.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            Some("forbidden"),
            message.into(),
        )
    }

    /// 403 for a request addressed to a name that is not this listener's (DNS rebinding).
    pub fn host_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            Some("host_not_allowed"),
            message.into(),
        )
    }

    /// 403 for a request a web page sent from an origin not in `allowed_origins`.
    pub fn origin_not_allowed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::FORBIDDEN,
            "permission_error",
            Some("origin_not_allowed"),
            message.into(),
        )
    }

    /// 429 with `Retry-After` when a key's rate limit is hit.
    pub fn rate_limited(message: impl Into<String>, retry_after: std::time::Duration) -> Self {
        let mut err = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            Some("rate_limit_exceeded"),
            message.into(),
        );
        err.retry_after = Some(retry_after.as_secs_f64().ceil().max(1.0) as u64);
        err
    }

    /// 400 for a request the client must fix.
    pub fn invalid_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            Some(code),
            message.into(),
        )
    }

    /// 415 for a body whose content type its path does not take (a form sent for JSON).
    pub fn unsupported_media_type(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            Some("unsupported_media_type"),
            message.into(),
        )
    }

    /// 413 for a body above `limits.max_body_bytes`.
    pub fn body_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            Some("request_too_large"),
            format!("request body exceeds limits.max_body_bytes ({limit} bytes)"),
        )
    }

    /// 408 when a request body does not arrive within `limits.body_timeout`.
    pub fn body_timeout(timeout: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            Some("request_timeout"),
            format!(
                "the request body did not arrive within limits.body_timeout ({})",
                humantime::format_duration(timeout)
            ),
        )
    }

    /// 502 when the upstream cannot be reached or answers garbage.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            Some("upstream_unreachable"),
            message.into(),
        )
    }

    /// 504 when the upstream is too slow.
    pub fn gateway_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_error",
            Some("upstream_timeout"),
            message.into(),
        )
    }

    /// 503 when the originals cannot be stored and `store.required` is set.
    pub fn storage(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "storage_error",
            Some("storage_unavailable"),
            message.into(),
        )
    }

    /// A refusal by a `[middleware]` hook: its 4xx status (403 if it is not one) and its
    /// message.
    pub fn denied_by_hook(status: u16, message: impl Into<String>) -> Self {
        let status = StatusCode::from_u16(status)
            .ok()
            .filter(StatusCode::is_client_error)
            .unwrap_or(StatusCode::FORBIDDEN);
        let kind = match status {
            StatusCode::FORBIDDEN => "permission_error",
            _ => "invalid_request_error",
        };
        Self::new(status, kind, Some("denied_by_hook"), message.into())
    }

    /// 503 when a `[middleware]` hook that fails closed could not decide.
    pub fn hook_failed(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("hook_failed"),
            message.into(),
        )
    }

    /// 503 while the proxy cannot serve, e.g. during shutdown.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            Some("unavailable"),
            message.into(),
        )
    }

    /// 404 for an unknown proxy resource.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            Some("not_found"),
            message.into(),
        )
    }

    /// 401 for admin endpoints without the right token.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            Some("invalid_admin_token"),
            message.into(),
        )
    }

    /// 500 for a failure inside the proxy itself.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "server_error",
            Some("internal_error"),
            message.into(),
        )
    }

    /// The error in handoff's own shape, which is the one an OpenAI SDK expects.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": null,
                "code": self.code,
            }
        })
    }

    /// The error as a complete HTTP response, in handoff's own shape.
    pub fn into_response(self) -> Response<ProxyBody> {
        let body = self.to_json();
        self.into_response_with(&body)
    }

    /// The error as a complete HTTP response with `body`: its status and its
    /// `Retry-After`, whatever shape the body has.
    pub fn into_response_with(self, body: &serde_json::Value) -> Response<ProxyBody> {
        let body = Bytes::from(body.to_string());
        let mut response = Response::new(full(body));
        *response.status_mut() = self.status;
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let Some(seconds) = self.retry_after {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[cfg(test)]
mod tests {
    /// The codes handoff can answer with, read from the code that makes them: the
    /// constructors here, `invalid_request("…")` calls, and the dialect parse errors.
    fn emitted_codes() -> std::collections::BTreeSet<String> {
        // The proxy is `src/` and the layer crates under `crates/`, this one too.
        let crates = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .unwrap();
        let root = crates.parent().unwrap();
        let patterns = [
            regex::Regex::new(r#"invalid_request\(\s*"([a-z_]+)""#).unwrap(),
            regex::Regex::new(r#"Some\("([a-z_]+)"\)"#).unwrap(),
            regex::Regex::new(r#"DialectError::\w+[^=]*=> "([a-z_]+)""#).unwrap(),
        ];
        let mut codes = std::collections::BTreeSet::new();
        let mut stack = vec![crates.to_path_buf(), root.join("src")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                // Unit tests make up codes of their own.
                let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
                let is_error_rs = path.ends_with("error.rs")
                    && path.parent().is_some_and(|p| p.ends_with("crates/core"));
                for (index, pattern) in patterns.iter().enumerate() {
                    if index == 1 && !is_error_rs {
                        continue;
                    }
                    codes.extend(pattern.captures_iter(text).map(|c| c[1].to_owned()));
                }
            }
        }
        codes
    }

    #[test]
    fn the_operations_guide_error_table_names_every_code_handoff_emits() {
        let readme = include_str!("../../docs/operations.md");
        let table = readme.split("## Errors").nth(1).unwrap_or("");
        let codes = emitted_codes();
        assert!(codes.len() >= 25, "the scan found only {codes:?}");
        let missing: Vec<&String> = codes
            .iter()
            .filter(|code| !table.contains(&format!("`{code}`")))
            .collect();
        assert!(
            missing.is_empty(),
            "docs/operations.md's error table lacks {missing:?}"
        );
    }
}
