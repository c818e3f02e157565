//! The Responses API's WebSocket mode: `GET /v1/responses` with `Upgrade: websocket`.
//! The upgrade is admitted as a POST would be (Host and Origin rules, proxy keys), and
//! the socket then carries one `response.create` at a time, each a tracked request run
//! through every phase as `POST /v1/responses` with `stream: true`, its events sent
//! back as the socket's messages ([`session`]).
//!
//! Upstream, each create is bridged to `POST /v1/responses` and its event stream:
//! every Responses upstream serves that. A chain the socket holds with `store: false`
//! (its responses kept on the connection, not by the upstream) is continued from
//! handoff's record ([`crate::pipeline::HeldOnSocket`]).

mod create;
mod session;

use std::net::SocketAddr;
use std::sync::Arc;

use http::{header, HeaderValue, Request, Response, StatusCode};
use hyper::body::Incoming;

use crate::auth::Admission;
use crate::body::{full, ProxyBody};
use crate::dialect::ErrorResponse;
use crate::error::ApiError;
use crate::state::{AppState, Snapshot};

/// The counter of the socket's creates, by how they went upstream.
pub(crate) const SOCKET_CREATES: &str = "handoff_socket_creates_total";

/// True for a WebSocket upgrade of the Responses path.
pub(crate) fn is_upgrade<B>(request: &Request<B>) -> bool {
    let headers = request.headers();
    let has = |name: header::HeaderName, token: &str| {
        (headers.get_all(name).iter())
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|v| v.trim().eq_ignore_ascii_case(token))
    };
    request.method() == http::Method::GET
        && request.uri().path() == "/v1/responses"
        && has(header::UPGRADE, "websocket")
        && has(header::CONNECTION, "upgrade")
}

/// Answers the upgrade (`101 Switching Protocols`) and runs the socket on its own task
/// once hyper hands the connection over.
pub(crate) fn accept(
    state: Arc<AppState>,
    snap: Arc<Snapshot>,
    mut request: Request<Incoming>,
    admission: Admission,
    peer: SocketAddr,
) -> Response<ProxyBody> {
    let version = request.headers().get(header::SEC_WEBSOCKET_VERSION);
    let key = request.headers().get(header::SEC_WEBSOCKET_KEY).cloned();
    let (Some(key), true) = (key, version.is_some_and(|v| v == "13")) else {
        admission.refund(&state.limiter, admission.reserved_tokens);
        let mut refused = ApiError::invalid_request(
            "invalid_upgrade",
            "a WebSocket upgrade needs Sec-WebSocket-Key and Sec-WebSocket-Version: 13",
        )
        .into_response_for(crate::dialect::DialectKind::Responses);
        refused.headers_mut().insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        return refused;
    };
    let accepted = tokio_tungstenite::tungstenite::handshake::derive_accept_key(key.as_bytes());
    let upgrading = hyper::upgrade::on(&mut request);
    let (head, _) = request.into_parts();
    // The upgrade itself reads no body and charges nothing: each create is admitted.
    admission.refund(&state.limiter, admission.reserved_tokens);
    tokio::spawn(async move {
        match upgrading.await {
            Ok(upgraded) => session::run(state, snap, head, upgraded, peer).await,
            Err(err) => {
                tracing::debug!(%peer, error = %err, "the WebSocket upgrade did not complete")
            }
        }
    });
    let mut response = Response::new(full(bytes::Bytes::new()));
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    let headers = response.headers_mut();
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
    headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
    if let Ok(accepted) = HeaderValue::from_str(&accepted) {
        headers.insert(header::SEC_WEBSOCKET_ACCEPT, accepted);
    }
    response
}
