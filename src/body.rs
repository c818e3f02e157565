//! The body type every response carries, and the helpers that build one.

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, Full};

/// Errors a body may yield while streaming.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response handoff sends, and of every request it forwards.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// A body made of one buffer.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into())
        .map_err(|never: Infallible| match never {})
        .boxed_unsync()
}

/// A JSON response body.
pub fn json(value: &serde_json::Value) -> ProxyBody {
    full(value.to_string())
}
