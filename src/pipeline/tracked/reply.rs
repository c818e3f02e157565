//! Phase 9, **reply**, of a tracked request: the upstream's answer goes to the client,
//! and its reply to the log. A streamed reply is relayed frame by frame with the
//! capture watching; a non-streamed one is read whole and logged before it is
//! answered; an error is relayed as it is.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::Response;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::body::ProxyBody;
use crate::capture::{ReplyCapture, ReplyTarget};
use crate::dialect::ErrorResponse;
use crate::error::ApiError;
use crate::finish::Finish;
use crate::forward::relay_after;
use crate::relay::Observer;
use crate::rewrite::{Rewrite, Rewritten};
use crate::upstream::Upstream;

/// Largest non-streamed reply read (and logged) before it is answered.
const MAX_JSON_REPLY: usize = 64 * 1024 * 1024;

/// Relays a stream whose `opening` was already read, logging its reply on the way;
/// `rewrite` then takes out of the client's bytes what handoff asked for on its own.
pub(crate) fn answer_stream(
    upstream: &Upstream,
    head: http::response::Parts,
    opening: Bytes,
    rest: Incoming,
    target: ReplyTarget,
    rewrite: Option<Box<dyn Rewrite>>,
) -> Response<ProxyBody> {
    let observer: Box<dyn Observer> = Box::new(ReplyCapture::start(target));
    let response = relay_after(upstream, head, opening, rest, Some(observer));
    match rewrite {
        Some(rewrite) => response.map(|body| Rewritten::new(body, rewrite).boxed_unsync()),
        None => response,
    }
}

/// Logs a non-streamed reply read whole, and only then answers it: a reply that
/// cannot be logged while the store is required becomes a 503, not a silent gap. The
/// client's copy has `reverse`'s markers turned back; the log keeps them.
pub(in crate::pipeline) async fn answer_read(
    head: http::response::Parts,
    body: Bytes,
    target: ReplyTarget,
    reverse: Option<std::sync::Arc<crate::pipeline::hooks::Reverse>>,
) -> Response<ProxyBody> {
    let dialect = target.dialect;
    // A client that leaves now must not cancel the log write: abandoned, it is spawned.
    let logging = {
        let body = body.clone();
        Finish::new(Box::pin(async move { target.log_json(&body).await }))
    };
    match logging.await {
        Ok(Err(unlogged)) => ApiError::storage(unlogged.to_string()).into_response_for(dialect),
        Ok(Ok(())) => crate::forward::buffered(head, reversed(reverse.as_deref(), body)),
        Err(err) => {
            tracing::error!(error = %err, "reply capture failed");
            crate::forward::buffered(head, reversed(reverse.as_deref(), body))
        }
    }
}

fn reversed(reverse: Option<&crate::pipeline::hooks::Reverse>, body: Bytes) -> Bytes {
    match reverse {
        Some(reverse) => reverse.json(&body),
        None => body,
    }
}

/// Reads an upstream reply body, giving up when it stalls for `idle` or passes
/// [`MAX_JSON_REPLY`].
pub(super) async fn read_reply(mut body: Incoming, idle: Duration) -> Result<Bytes, ApiError> {
    let mut out = BytesMut::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err(ApiError::gateway_timeout(format!(
                    "upstream sent nothing for {idle:?} after {} bytes of its reply",
                    out.len()
                )))
            }
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(err))) => {
                return Err(ApiError::bad_gateway(format!(
                    "upstream cut its reply after {} bytes: {err}",
                    out.len()
                )))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Some(data) = frame.data_ref() {
            if out.len() + data.len() > MAX_JSON_REPLY {
                return Err(ApiError::bad_gateway(format!(
                    "upstream reply exceeds {MAX_JSON_REPLY} bytes"
                )));
            }
            out.extend_from_slice(data);
        }
    }
}
