//! What the admin API answers for each error its handlers meet: the one place where an
//! error of the store or of compaction becomes an HTTP status and an error code.

use crate::compaction::job::CompactError;
use crate::error::ApiError;
use crate::store::layout::ResolveError;

/// A conversation id or prefix that resolves to none, several, or an invalid one.
pub(super) fn resolve_error(err: ResolveError) -> ApiError {
    match err {
        ResolveError::Unknown { .. } => ApiError::not_found(err.to_string()),
        ResolveError::Ambiguous { .. } => {
            ApiError::invalid_request("ambiguous_conversation", err.to_string())
        }
        ResolveError::Id(_) => {
            ApiError::invalid_request("invalid_conversation_id", err.to_string())
        }
        ResolveError::Tenant(_) => ApiError::invalid_request("invalid_tenant", err.to_string()),
        ResolveError::Io(_) | ResolveError::Store(_) => ApiError::storage(err.to_string()),
    }
}

/// A compaction the admin API ran that made no view.
pub(super) fn compact_error(err: CompactError) -> ApiError {
    match err {
        CompactError::TooLarge { .. } => {
            ApiError::invalid_request("nothing_to_compact", err.to_string())
        }
        CompactError::Uncompactable(_) => {
            ApiError::invalid_request("invalid_tool_pairs", err.to_string())
        }
        other => ApiError::internal(other.to_string()),
    }
}

/// A tenant name that is no valid tenant.
pub(super) fn invalid_tenant(err: impl std::fmt::Display) -> ApiError {
    ApiError::invalid_request("invalid_tenant", err.to_string())
}
