//! Reading a request body whole, within `limits.max_body_bytes` and
//! `limits.body_timeout`: what a tracked request and a checked pass-through need.

use std::time::Duration;

use bytes::Bytes;
use http::header;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::config::LimitsConfig;
use crate::error::ApiError;

/// Reads a body within `limits.max_body_bytes` and `limits.body_timeout`.
///
/// An excess, declared or actual, is a 413 sent at once, while the rest of the upload
/// is read and dropped on the side (bounded, like nginx's lingering close): a client
/// that sends its whole body before reading then reads the 413, not a broken pipe.
pub async fn read_body(
    mut body: Incoming,
    limits: &LimitsConfig,
    headers: &http::HeaderMap,
) -> Result<Bytes, ApiError> {
    let limit = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        drain(body, limit);
        return Err(ApiError::body_too_large(limit));
    }
    let mut chunks: Vec<Bytes> = Vec::new();
    let mut total = 0usize;
    let read = tokio::time::timeout(limits.body_timeout, async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|err| {
                ApiError::invalid_request(
                    "body_read_failed",
                    format!("could not read the request body: {err}"),
                )
            })?;
            if let Ok(data) = frame.into_data() {
                total += data.len();
                if total > limit {
                    return Ok(false);
                }
                chunks.push(data);
            }
        }
        Ok(true)
    })
    .await;
    match read {
        Err(_) => Err(ApiError::body_timeout(limits.body_timeout)),
        Ok(Err(err)) => Err(err),
        Ok(Ok(false)) => {
            drain(body, limit);
            Err(ApiError::body_too_large(limit))
        }
        // One chunk (the common case) is passed on without a copy.
        Ok(Ok(true)) if chunks.len() == 1 => Ok(chunks.swap_remove(0)),
        Ok(Ok(true)) => Ok(chunks.concat().into()),
    }
}

/// How long the rest of a refused upload is read, at most, and how long it may stall.
const DRAIN_TIME: Duration = Duration::from_secs(30);
const DRAIN_STALL: Duration = Duration::from_secs(5);

/// Reads and drops the rest of `body` in the background, up to eight times `limit`
/// (64 MiB at least), 30 s, or a 5 s stall; then the connection closes.
fn drain(mut body: Incoming, limit: usize) {
    let cap = limit.saturating_mul(8).max(64 << 20);
    tokio::spawn(async move {
        let _ = tokio::time::timeout(DRAIN_TIME, async {
            let mut read = 0usize;
            while let Ok(Some(Ok(frame))) = tokio::time::timeout(DRAIN_STALL, body.frame()).await {
                read += frame.data_ref().map_or(0, Bytes::len);
                if read > cap {
                    break;
                }
            }
        })
        .await;
    });
}
