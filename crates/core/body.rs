//! The body type every response carries, and the helpers that build one.

use std::convert::Infallible;

use bytes::Bytes;

use crate::base::chunks::Chunks;
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

/// A body made of `parts`, sent in order without joining them; its length is known.
pub fn parts(parts: Vec<Bytes>) -> ProxyBody {
    Parts(parts.into()).boxed_unsync()
}

/// A body read as frames, sent on as those frames (shared, not copied).
pub fn chunked(body: &Chunks) -> ProxyBody {
    match body.parts() {
        [one] => full(one.clone()),
        many => parts(many.to_vec()),
    }
}

struct Parts(std::collections::VecDeque<Bytes>);

impl http_body::Body for Parts {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, BoxError>>> {
        std::task::Poll::Ready(
            self.0
                .pop_front()
                .map(|part| Ok(http_body::Frame::data(part))),
        )
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_empty()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        http_body::SizeHint::with_exact(self.0.iter().map(|part| part.len() as u64).sum())
    }
}

/// A JSON response body.
pub fn json(value: &serde_json::Value) -> ProxyBody {
    full(value.to_string())
}
