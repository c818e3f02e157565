//! Which pipeline a request takes: the proxy's own `/handoff/*`, the chat-completions
//! pipeline, or plain pass-through for every other path.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Method, Request, Response};
use hyper::body::Incoming;

use crate::access_log::{Logged, RequestLog};
use crate::body::ProxyBody;
use crate::dialect::DialectKind;
use crate::error::ApiError;
use crate::headers::loggable_target;
use crate::state::AppState;
use crate::{admin, chat};

/// Routes one request and always produces a response, whose body writes the
/// request's access line when it ends.
pub async fn route(
    state: &AppState,
    mut request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Logged> {
    // Made canonical before anything reads it, the access line included.
    let refused = canonicalize(&mut request).err();
    let uri = request.uri();
    let mut log = RequestLog::start(
        request.method().clone(),
        loggable_target(uri.path(), uri.query()),
    )
    .with_metrics(Arc::clone(&state.metrics));
    let response = match refused {
        Some(err) => err.into_response_for(DialectKind::for_path(request.uri().path())),
        None => dispatch(state, request, peer, &mut log).await,
    };
    log.respond(response)
}

/// Puts the canonical form of the request's path in its URI, query untouched.
fn canonicalize<B>(request: &mut Request<B>) -> Result<(), ApiError> {
    let uri = request.uri();
    let path = match crate::path::canonical(uri.path())? {
        Cow::Borrowed(_) => return Ok(()),
        Cow::Owned(path) => path,
    };
    let path_and_query = match uri.query() {
        Some(query) => format!("{path}?{query}"),
        None => path,
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(path_and_query.parse().map_err(|_| {
        ApiError::invalid_request("invalid_path", "the path cannot be spelt canonically")
    })?);
    *request.uri_mut() = http::Uri::from_parts(parts).map_err(|_| {
        ApiError::invalid_request("invalid_path", "the path cannot be spelt canonically")
    })?;
    Ok(())
}

async fn dispatch(
    state: &AppState,
    request: Request<Incoming>,
    peer: SocketAddr,
    log: &mut RequestLog,
) -> Response<ProxyBody> {
    let path = request.uri().path();
    // One snapshot for the whole request: a reload mid-way does not change its config.
    let snap = state.snapshot();
    if let Err(err) = crate::browser_guard::check_host(&snap.config, &request) {
        return err.into_response_for(DialectKind::for_path(path));
    }
    if path == "/handoff" || path.starts_with("/handoff/") {
        // Boxed: the admin API's future is the largest of the three (kilobytes), and
        // every proxied request's future would otherwise carry its size.
        return Box::pin(admin::handle(state, request, peer)).await;
    }
    // Before admission: a web page's request is neither charged, forwarded nor logged.
    if let Err(err) = crate::browser_guard::check_origin(&snap.config, &request) {
        return err.into_response_for(DialectKind::for_path(path));
    }
    // The body's size is the estimate rate limits count before anything is read.
    let estimated_tokens = request
        .headers()
        .get(http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok())
        .map_or(0, |bytes| bytes / 4);
    // Every answer on a dialect's paths, errors included, is in that dialect's shape.
    let dialect = DialectKind::for_path(path);
    let admission = match snap.credentials.admit(
        &state.secret,
        &state.limiter,
        request.headers(),
        estimated_tokens,
    ) {
        Ok(admission) => admission,
        Err(err) => return err.into_response_for(dialect),
    };
    log.set_tenant(&admission.tenant);
    if let Err(err) = admission.check_path(path) {
        return err.into_response_for(dialect);
    }
    if request.method() == Method::POST {
        if let Some(tracking) = DialectKind::tracking(path) {
            return chat::handle(state, snap, request, log, admission, tracking).await;
        }
    }
    crate::passthrough::handle(state, snap, request, log, admission, dialect).await
}
