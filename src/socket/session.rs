//! One client socket: its messages read one at a time, each `response.create` run and
//! answered before the next is read (one response at a time, as the API serves a
//! socket), within the idle limit; anything else answered with an `error` event.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::protocol::{CloseFrame, Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};
use tokio_tungstenite::WebSocketStream;

use crate::state::{AppState, Snapshot};

/// The read and write buffer of a socket: an event is a few hundred bytes, a create
/// rarely more than a few kilobytes past the history a socket does not resend.
const SOCKET_BUFFER: usize = 16 * 1024;

/// The client's socket.
pub(super) type Socket = WebSocketStream<TokioIo<Upgraded>>;

/// What a socket keeps between its creates.
pub(super) struct Session {
    pub(super) state: Arc<AppState>,
    /// The upgrade request's head: its credentials and API headers go with each create.
    pub(super) head: http::request::Parts,
    pub(super) peer: SocketAddr,
    /// The ids of the warm-up responses (`generate: false`) answered here: nothing
    /// upstream holds them, so a create that continues one starts afresh.
    pub(super) warmups: HashSet<String>,
    /// The upstream's own socket, once the first create asked for one.
    pub(super) upstream: Link,
}

/// Whether the upstream serves this socket a socket of its own.
pub(super) enum Link {
    /// Not asked yet: the first create asks.
    Untried,
    /// Its socket, to the upstream it was opened on, for every create of this one that
    /// goes to that upstream.
    Open(
        Box<crate::upstream::Upstream>,
        Arc<crate::upstream_socket::UpstreamSocket>,
    ),
    /// It refused, could not be reached, or its socket closed under a create: every
    /// create is bridged to `POST` (a chain the upstream's socket held is gone with it,
    /// and is sent from the record from then on).
    Bridged,
}

/// Runs the socket until the client closes it, it idles past `limits.idle_timeout`,
/// or a protocol error ends it.
pub(super) async fn run(
    state: Arc<AppState>,
    snap: Arc<Snapshot>,
    head: http::request::Parts,
    upgraded: Upgraded,
    peer: SocketAddr,
) {
    let limits = &snap.config.limits;
    // Small buffers: an idle socket holds little, and each event is flushed as sent.
    let config = WebSocketConfig::default()
        .read_buffer_size(SOCKET_BUFFER)
        .write_buffer_size(SOCKET_BUFFER)
        .max_message_size(Some(limits.max_body_bytes))
        .max_frame_size(Some(limits.max_body_bytes));
    let idle = limits.idle_timeout;
    let mut socket =
        WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, Some(config)).await;
    state.metrics.add("handoff_sockets_total", &[], 1.0);
    tracing::debug!(%peer, "WebSocket opened on /v1/responses");
    let mut session = Session {
        state,
        head,
        peer,
        warmups: HashSet::new(),
        upstream: Link::Untried,
    };
    loop {
        let message = match tokio::time::timeout(idle, socket.next()).await {
            Err(_) => {
                close(
                    &mut socket,
                    CloseCode::Away,
                    "idle past limits.idle_timeout",
                )
                .await;
                return;
            }
            Ok(None) => return,
            Ok(Some(Err(WsError::Capacity(err)))) => {
                let reason = format!("message too large: {err} (limits.max_body_bytes)");
                close(&mut socket, CloseCode::Size, &reason).await;
                return;
            }
            Ok(Some(Err(err))) => {
                tracing::debug!(%peer, error = %err, "WebSocket ended with an error");
                return;
            }
            Ok(Some(Ok(message))) => message,
        };
        let text = match message {
            Message::Text(text) => text,
            Message::Binary(_) => {
                let error = error_event(
                    "invalid_request_error",
                    "invalid_message",
                    "binary messages are not events: send each event as JSON text",
                );
                if send(&mut socket, &error).await.is_err() {
                    return;
                }
                continue;
            }
            Message::Close(_) => return,
            Message::Ping(_) | Message::Pong(_) | Message::Frame(_) => continue,
        };
        let event = match serde_json::from_str::<Value>(text.as_str()) {
            Ok(event) if event.is_object() => event,
            Ok(_) | Err(_) => {
                let error = error_event(
                    "invalid_request_error",
                    "invalid_json",
                    "the message is not a JSON event object",
                );
                if send(&mut socket, &error).await.is_err() {
                    return;
                }
                continue;
            }
        };
        let kind = event["type"].as_str().unwrap_or("").to_owned();
        let sent = match kind.as_str() {
            "response.create" => session.create(&mut socket, text.as_str(), &event).await,
            other => {
                tracing::info!(peer = %session.peer, event = other, "a socket event handoff does not bridge; answered with an error");
                let error = error_event(
                    "invalid_request_error",
                    "unsupported_event",
                    &format!("handoff bridges this socket to the HTTP Responses API, which has no {other:?} event: only response.create is served"),
                );
                send(&mut socket, &error).await
            }
        };
        if sent.is_err() {
            return;
        }
    }
}

/// The API's WebSocket `error` event.
pub(super) fn error_event(kind: &str, code: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "code": code, "message": message}})
}

/// Sends one event; `Err` when the client is gone.
pub(super) async fn send(socket: &mut Socket, event: &Value) -> Result<(), WsError> {
    socket.send(Message::text(event.to_string())).await
}

/// Closes the socket with `code`, saying why.
pub(super) async fn close(socket: &mut Socket, code: CloseCode, reason: &str) {
    let frame = CloseFrame {
        code,
        reason: reason.chars().take(120).collect::<String>().into(),
    };
    let _ = socket.close(Some(frame)).await;
}
