//! How a request's phases end early, and the one place where that becomes the
//! client's answer, in its API's shape: the pipeline's rescue.

use http::Response;

use crate::body::ProxyBody;
use crate::dialect::{DialectKind, ErrorResponse};
use crate::error::ApiError;

/// Why a phase ended the request early.
pub(super) enum Halt {
    /// An error, answered in the API's shape.
    Error(ApiError),
    /// A complete answer (an upstream error passed on, an untracked forward).
    Respond(Box<Response<ProxyBody>>),
    /// The upstream refused the API's own context management the request asked:
    /// handoff serves it and sends the request again (never leaves the tracked route).
    ServeAsks,
}

impl From<ApiError> for Halt {
    fn from(err: ApiError) -> Self {
        Halt::Error(err)
    }
}

/// The response of a request its phases ran, or ended early, in `dialect`'s shape.
pub(super) fn answered(
    ran: Result<Response<ProxyBody>, Halt>,
    dialect: DialectKind,
) -> Response<ProxyBody> {
    match ran {
        Ok(response) => response,
        Err(Halt::Respond(response)) => *response,
        Err(Halt::Error(err)) => err.into_response_for(dialect),
        Err(Halt::ServeAsks) => ApiError::internal(
            "the upstream refused the API's own compaction, and it was not served",
        )
        .into_response_for(dialect),
    }
}
