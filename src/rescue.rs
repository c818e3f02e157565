//! What each failure of the layers below answers: the status and error code of a
//! store, upstream, wire-format or compaction error. The layers return typed errors and
//! choose no status; the two surfaces, the pipeline ([`crate::pipeline`]'s halt) and the
//! admin API, answer with these, each in its API's own error shape.

use crate::compaction::job::CompactError;
use crate::dialect::DialectError;
use crate::error::ApiError;
use crate::store::StoreError;
use crate::upstream::UpstreamError;

/// 507 for a write past the tenant's quota; 503 for any other store failure.
pub(crate) fn store(err: &StoreError) -> ApiError {
    match err {
        StoreError::QuotaExceeded { .. } => ApiError::quota_exceeded(err.to_string()),
        _ => ApiError::storage(err.to_string()),
    }
}

/// 504 when the provider took too long; 502 when it could not be reached.
pub(crate) fn upstream(err: UpstreamError) -> ApiError {
    match err {
        UpstreamError::ConnectTimeout { .. } | UpstreamError::ReadTimeout { .. } => {
            ApiError::gateway_timeout(err.to_string())
        }
        UpstreamError::BadTarget { .. } | UpstreamError::Unreachable { .. } => {
            ApiError::bad_gateway(err.to_string())
        }
    }
}

/// 400, with the code that says what was wrong with the body.
pub(crate) fn dialect(err: DialectError) -> ApiError {
    let code = match &err {
        DialectError::Json { .. } => "invalid_json",
        DialectError::NotAnObject { .. }
        | DialectError::MissingRole { .. }
        | DialectError::Shape { .. } => "invalid_message",
        DialectError::OrphanToolResult { .. } | DialectError::UnansweredToolCalls { .. } => {
            "invalid_tool_pairs"
        }
    };
    ApiError::invalid_request(code, err.to_string())
}

/// The answer when a compaction the request needed could not make it fit.
pub(crate) fn compaction(err: CompactError) -> ApiError {
    tracing::warn!(error = %err, "compaction failed");
    match &err {
        CompactError::TooLarge { .. } => {
            ApiError::invalid_request("context_length_exceeded", err.to_string())
        }
        CompactError::Uncompactable(_) => {
            ApiError::invalid_request("invalid_tool_pairs", err.to_string())
        }
        CompactError::Store(err) => store(err),
        CompactError::Cancelled => {
            ApiError::unavailable("handoff is shutting down; retry the request")
        }
        CompactError::Busy(_) => ApiError::unavailable(err.to_string()),
        CompactError::View(_) | CompactError::NoHandoff(_) => ApiError::internal(err.to_string()),
    }
}
