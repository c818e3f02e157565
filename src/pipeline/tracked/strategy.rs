//! A helper of **parse**: the strategy a client may pick for its request.

use crate::error::ApiError;
use crate::state::Snapshot;

/// The header that picks a strategy for one request.
pub(crate) const STRATEGY_HEADER: &str = "x-handoff-strategy";

/// The strategy a client asked for, if it is on `compaction.request_override_allow`.
pub(crate) fn strategy_override<'h>(
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
