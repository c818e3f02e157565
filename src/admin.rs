//! The proxy's own endpoints under `/handoff/`. Everything but health is served to
//! loopback clients only, or to clients that present `admin.token`.

use std::net::SocketAddr;

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;
use serde_json::json;

use crate::access_log::RequestLog;
use crate::body::{json, ProxyBody};
use crate::error::ApiError;
use crate::forward::reject;
use crate::state::AppState;

/// Handles a `/handoff/*` request.
pub async fn handle(
    state: &AppState,
    request: Request<Incoming>,
    peer: SocketAddr,
    log: RequestLog,
) -> Response<ProxyBody> {
    let path = request.uri().path();
    if path == "/handoff/health" {
        return ok_json(
            log,
            &json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")}),
        );
    }
    if let Err(err) = authorize(state, &request, peer) {
        return reject(log, err);
    }
    reject(
        log,
        ApiError::not_found(format!("no handoff endpoint at {path}")),
    )
}

/// Loopback peers pass; others need `Authorization: Bearer <admin.token>`.
fn authorize(
    state: &AppState,
    request: &Request<Incoming>,
    peer: SocketAddr,
) -> Result<(), ApiError> {
    if peer.ip().is_loopback() {
        return Ok(());
    }
    let Some(token) = state.config.admin.token.as_deref() else {
        return Err(ApiError::unauthorized(
            "admin endpoints are served to loopback clients only; set admin.token to open them",
        ));
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "));
    if presented.is_some_and(|p| constant_time_eq(p.as_bytes(), token.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::unauthorized(
            "missing or wrong admin bearer token",
        ))
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A 200 JSON answer.
pub fn ok_json(mut log: RequestLog, value: &serde_json::Value) -> Response<ProxyBody> {
    log.set_status(StatusCode::OK);
    let mut response = Response::new(json(value));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
