//! Which pipeline a request takes: the proxy's own `/handoff/*`, the chat-completions
//! pipeline, or plain pass-through for every other path.

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response};
use hyper::body::Incoming;

use crate::access_log::{Logged, RequestLog};
use crate::body::ProxyBody;
use crate::dialect::{DialectKind, ErrorResponse};
use crate::error::ApiError;
use crate::headers::loggable_target;
use crate::pipeline::{self, Route};
use crate::state::AppState;
use crate::tools::admin;

/// Routes one request and always produces a response, whose body writes the
/// request's access line when it ends.
pub(crate) async fn route(
    state: &Arc<AppState>,
    mut request: Request<Incoming>,
    peer: SocketAddr,
) -> Response<Logged> {
    // Made canonical before anything reads it, the access line included, and a key
    // in the query moved into its header.
    let refused = canonicalize(&mut request)
        .and_then(|()| crate::dialect::lift_query_key(&mut request))
        .err();
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
    state: &Arc<AppState>,
    request: Request<Incoming>,
    peer: SocketAddr,
    log: &mut RequestLog,
) -> Response<ProxyBody> {
    let path = request.uri().path();
    // One snapshot for the whole request: a reload mid-way does not change its config.
    let snap = state.snapshot();
    // Every answer on a dialect's paths, errors included, is in that dialect's shape.
    let dialect = DialectKind::for_path(path);
    let limit = snap.config.limits.max_body_bytes;
    if let Err(err) = crate::browser_guard::check_host(&snap.config, &request) {
        return refuse(request, err, dialect, limit);
    }
    if path == "/handoff" || path.starts_with("/handoff/") {
        // Boxed: the admin API's future is the largest of the three (kilobytes), and
        // every proxied request's future would otherwise carry its size.
        return Box::pin(admin::handle(state, request, peer)).await;
    }
    // Before admission: a web page's request is neither charged, forwarded nor logged.
    if let Err(err) = crate::browser_guard::check_origin(&snap.config, &request) {
        return refuse(request, err, dialect, limit);
    }
    // Reserved before anything is read, settled once the body's size is known.
    let reservation = crate::auth::reservation(request.method(), request.headers());
    let admission = match snap.credentials.admit(
        &state.secret,
        &state.limiter,
        request.headers(),
        reservation,
    ) {
        Ok(admission) => admission,
        Err(err) => return refuse(request, err, dialect, limit),
    };
    log.set_tenant(&admission.tenant);
    if let Err(err) = admission.check_path(path) {
        admission.refund(&state.limiter, admission.reserved_tokens);
        return refuse(request, err, dialect, limit);
    }
    if crate::socket::is_upgrade(&request) {
        return crate::socket::accept(Arc::clone(state), snap, request, admission, peer);
    }
    let route = Route::of(request.method(), path);
    pipeline::handle(state, snap, request, log, admission, route).await
}

/// The answer to a request refused before its body is read: the body is read and
/// dropped on the side, so a client that sends it all before reading reads the error,
/// not a broken pipe.
fn refuse(
    request: Request<Incoming>,
    err: ApiError,
    dialect: DialectKind,
    limit: usize,
) -> Response<ProxyBody> {
    crate::body_read::drain(request.into_body(), limit);
    err.into_response_for(dialect)
}
