//! Which pipeline a request takes: the proxy's own `/handoff/*`, the chat-completions
//! pipeline, or plain pass-through for every other path.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::access_log::{Logged, RequestLog};
use crate::body::ProxyBody;
use crate::forward::forward;
use crate::headers::loggable_target;
use crate::state::AppState;
use crate::{admin, chat};

/// Routes one request and always produces a response, whose body writes the
/// request's access line when it ends.
pub async fn route(
    state: &AppState,
    request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Logged> {
    let uri = request.uri();
    let mut log = RequestLog::start(
        request.method().clone(),
        loggable_target(uri.path(), uri.query()),
    )
    .with_metrics(Arc::clone(&state.metrics));
    let response = dispatch(state, request, peer, &mut log).await;
    log.respond(response)
}

async fn dispatch(
    state: &AppState,
    request: Request<Incoming>,
    peer: SocketAddr,
    log: &mut RequestLog,
) -> Response<ProxyBody> {
    let path = request.uri().path();
    if path == "/handoff" || path.starts_with("/handoff/") {
        return admin::handle(state, request, peer).await;
    }
    if request.method() == Method::POST && path.ends_with("/chat/completions") {
        return chat::handle(state, request, log).await;
    }
    let (parts, body) = request.into_parts();
    // Uploads and other bodies stream straight through, never collected.
    let body = body.map_err(Into::into).boxed_unsync();
    let snap = state.snapshot();
    forward(&snap.upstream, parts, body, log).await
}
