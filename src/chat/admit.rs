//! The first stage's helpers: reading the body within its limit, and the strategy a
//! client may pick for its request.

use bytes::Bytes;
use http::header;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::error::ApiError;
use crate::state::Snapshot;

/// The header that picks a strategy for one request.
pub const STRATEGY_HEADER: &str = "x-handoff-strategy";

/// The strategy a client asked for, if it is on `compaction.request_override_allow`.
pub fn strategy_override<'h>(
    snap: &Snapshot,
    headers: &'h http::HeaderMap,
) -> Result<Option<&'h str>, ApiError> {
    let Some(value) = headers.get(STRATEGY_HEADER) else {
        return Ok(None);
    };
    let allowed = &snap.config.compaction.request_override_allow;
    match value.to_str() {
        Ok(name) if allowed.iter().any(|a| a == name) => Ok(Some(name)),
        _ => Err(ApiError::invalid_request(
            "strategy_not_allowed",
            format!(
                "{STRATEGY_HEADER}: {:?} is not allowed; allowed: [{}] (compaction.request_override_allow)",
                String::from_utf8_lossy(value.as_bytes()),
                allowed.join(", ")
            ),
        )),
    }
}

/// Reads a body up to `limit` bytes; a declared or actual excess is a 413.
pub async fn read_body(
    body: Incoming,
    limit: usize,
    headers: &http::HeaderMap,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::body_too_large(limit))
        }
        Err(err) => Err(ApiError::invalid_request(
            "body_read_failed",
            format!("could not read the request body: {err}"),
        )),
    }
}
