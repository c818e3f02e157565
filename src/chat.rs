//! The chat-completions pipeline: read the body whole (bounded), check it, log its new
//! originals, forward it, and capture the reply.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::Request;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::access_log::RequestLog;
use crate::body::{full, ProxyBody};
use crate::capture::{ReplyCapture, ReplyTarget};
use crate::conversation::{identify, CONVERSATION_HEADER};
use crate::dialect::ChatRequest;
use crate::error::ApiError;
use crate::forward::{forward, reject};
use crate::relay::Observer;
use crate::state::AppState;

/// Handles `POST …/chat/completions`.
pub async fn handle(
    state: &AppState,
    request: Request<Incoming>,
    mut log: RequestLog,
) -> http::Response<ProxyBody> {
    let (mut parts, body) = request.into_parts();
    let bytes = match read_body(body, state.config.limits.max_body_bytes, &parts.headers).await {
        Ok(bytes) => bytes,
        Err(err) => return reject(log, err),
    };
    let chat = match ChatRequest::parse(&bytes) {
        Ok(chat) => chat,
        Err(err) => return reject(log, err.into()),
    };
    let header = match parts.headers.get(CONVERSATION_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(text)) => Some(text),
        Some(Err(_)) => {
            return reject(
                log,
                ApiError::invalid_request(
                    "invalid_conversation_id",
                    format!("{CONVERSATION_HEADER} is not visible ASCII"),
                ),
            )
        }
    };
    let id = match identify(header, &chat) {
        Ok(id) => id,
        Err(err) => {
            return reject(
                log,
                ApiError::invalid_request(
                    "invalid_conversation_id",
                    format!("{CONVERSATION_HEADER}: {err}"),
                ),
            )
        }
    };
    log.set_conversation(id.as_str());

    let observer: Option<Box<dyn Observer>> = match state.tracker.track(id.clone(), &chat).await {
        Ok(tracked) => Some(Box::new(ReplyCapture::new(ReplyTarget {
            tracker: state.tracker.clone(),
            parent: tracked.head(),
            id: tracked.id,
            model: chat.model.clone(),
        }))),
        Err(err) if state.config.store.required => {
            tracing::error!(conversation = %id, error = %err, "refusing the request: its originals cannot be stored");
            return reject(
                log,
                ApiError::storage(format!("{err}; the request was not forwarded")),
            );
        }
        Err(err) => {
            tracing::warn!(conversation = %id, error = %err, "forwarding untracked: store.required is false");
            None
        }
    };

    // The reply is read on the side (tracking, usage); a compressed body could not be.
    parts.headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    forward(&state.upstream, parts, full(bytes), log, observer).await
}

/// Reads a body up to `limit` bytes; a declared or actual excess is a 413.
async fn read_body(
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
