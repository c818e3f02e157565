//! A WebSocket of handoff's own to an upstream that serves the Responses API's
//! WebSocket mode, for one client socket. The send phase speaks HTTP to it, over an
//! in-memory connection: a `POST /v1/responses` with `stream: true` goes up as a
//! `response.create` event, and the upstream's events come back as its event stream.
//! So each create through the upstream's socket is sent, relayed, captured and logged
//! as any streamed request is. One create at a time, as the upstream serves a socket.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use http::{header, HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http1;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::handshake::client::generate_key;
use tokio_tungstenite::tungstenite::protocol::{Role, WebSocketConfig};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::access_log::RequestLog;
use crate::body::{full, ProxyBody};
use crate::error::ApiError;
use crate::upstream::{Upgrade, Upstream};

type UpstreamWs = WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>;
type AdapterBody = BoxBody<Bytes, std::io::Error>;

/// The events that end a response on a socket.
const TERMINAL: &[&str] = &[
    "response.completed",
    "response.failed",
    "response.incomplete",
    "error",
];

/// The upstream's socket, as the send phase sends on it.
pub(crate) struct UpstreamSocket {
    sender: Mutex<http1::SendRequest<ProxyBody>>,
}

impl std::fmt::Debug for UpstreamSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UpstreamSocket")
    }
}

impl UpstreamSocket {
    /// Opens `upstream`'s socket with `headers` (the client's, its credentials as the
    /// upstream takes them); `None` when it does not switch: it serves no socket.
    pub(crate) async fn open(
        upstream: &Upstream,
        mut headers: HeaderMap,
        max_message: usize,
    ) -> Result<Option<Arc<Self>>, ApiError> {
        let target = upstream
            .target(Some(&http::uri::PathAndQuery::from_static("/v1/responses")))
            .map_err(crate::rescue::upstream)?;
        crate::headers::strip_hop_by_hop(&mut headers);
        headers.remove(header::HOST);
        headers.remove(header::CONTENT_LENGTH);
        headers.remove(header::CONTENT_TYPE);
        headers.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        headers.insert(
            header::SEC_WEBSOCKET_VERSION,
            HeaderValue::from_static("13"),
        );
        if let Ok(key) = HeaderValue::from_str(&generate_key()) {
            headers.insert(header::SEC_WEBSOCKET_KEY, key);
        }
        let mut request = Request::get(target)
            .body(full(Bytes::new()))
            .map_err(|err| ApiError::internal(err.to_string()))?;
        *request.headers_mut() = headers;
        let upgraded = match upstream
            .upgrade(request)
            .await
            .map_err(crate::rescue::upstream)?
        {
            Upgrade::Switched(upgraded) => upgraded,
            Upgrade::Refused(status) => {
                tracing::info!(
                    status = status.as_u16(),
                    "the upstream serves no Responses WebSocket: its creates are bridged to POST"
                );
                return Ok(None);
            }
        };
        let config = WebSocketConfig::default()
            .max_message_size(Some(max_message))
            .max_frame_size(Some(max_message));
        let ws =
            WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Client, Some(config))
                .await;
        let ws = Arc::new(Mutex::new(ws));
        let (near, far) = tokio::io::duplex(64 * 1024);
        tokio::spawn(async move {
            let service =
                hyper::service::service_fn(move |request| adapt(Arc::clone(&ws), request));
            let served = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(far), service)
                .await;
            if let Err(err) = served {
                tracing::debug!(error = %err, "the upstream socket's adapter ended");
            }
        });
        let (sender, connection) = http1::handshake(TokioIo::new(near))
            .await
            .map_err(|err| ApiError::internal(err.to_string()))?;
        tokio::spawn(async move {
            if let Err(err) = connection.await {
                tracing::debug!(error = %err, "the upstream socket's connection ended");
            }
        });
        Ok(Some(Arc::new(Self {
            sender: Mutex::new(sender),
        })))
    }

    /// Sends one request of the send phase on the upstream's socket, waiting for the
    /// head of its answer (the upstream's first event) within `read_timeout`, as a
    /// POST waits for its head; the time is the request's upstream time.
    pub(crate) async fn send_timed(
        &self,
        request: Request<ProxyBody>,
        read_timeout: Duration,
        log: &mut RequestLog,
    ) -> Result<Response<Incoming>, ApiError> {
        let sent = Instant::now();
        let closed = |err: hyper::Error| {
            ApiError::bad_gateway(format!("the upstream's WebSocket is closed: {err}"))
        };
        let exchange = async {
            let mut sender = self.sender.lock().await;
            sender.ready().await.map_err(closed)?;
            sender.send_request(request).await.map_err(closed)
        };
        let response = tokio::time::timeout(read_timeout, exchange)
            .await
            .map_err(|_| {
                ApiError::gateway_timeout(format!(
                    "the upstream's WebSocket sent nothing for {read_timeout:?}"
                ))
            })??;
        log.set_upstream_time(sent.elapsed());
        Ok(response)
    }

    /// True once the socket can carry no more creates: the upstream closed it, or a
    /// response on it was abandoned mid-way.
    pub(crate) async fn is_closed(&self) -> bool {
        self.sender.lock().await.is_closed()
    }
}

/// One request on the adapter: the create goes up the upstream's socket, and its
/// events come back as an event stream; an `error` event first is an error answer.
async fn adapt(
    ws: Arc<Mutex<UpstreamWs>>,
    request: Request<Incoming>,
) -> Result<Response<AdapterBody>, Infallible> {
    let body = request
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut create: Value = serde_json::from_slice(&body).unwrap_or_default();
    let Some(fields) = create.as_object_mut() else {
        return Ok(error_answer(
            StatusCode::BAD_REQUEST,
            json!({"message": "the create is not a JSON object"}),
        ));
    };
    fields.remove("stream");
    fields.insert("type".to_owned(), json!("response.create"));
    let mut ws = ws.lock_owned().await;
    if let Err(err) = ws.send(Message::text(create.to_string())).await {
        return Ok(error_answer(
            StatusCode::BAD_GATEWAY,
            json!({"message": format!("the upstream's WebSocket is closed: {err}"), "code": "upstream_socket_closed"}),
        ));
    }
    let Some(first) = next_event(&mut ws).await else {
        return Ok(error_answer(
            StatusCode::BAD_GATEWAY,
            json!({"message": "the upstream's WebSocket closed before answering", "code": "upstream_socket_closed"}),
        ));
    };
    if first["type"] == "error" {
        let status = (first["status"].as_u64())
            .and_then(|s| StatusCode::from_u16(s as u16).ok())
            .unwrap_or(StatusCode::BAD_REQUEST);
        return Ok(error_answer(status, first["error"].clone()));
    }
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(16);
    tokio::spawn(async move {
        let mut event = first;
        loop {
            let done = TERMINAL.contains(&event["type"].as_str().unwrap_or(""));
            if tx.send(Ok(Frame::data(sse(&event)))).await.is_err() {
                return;
            }
            if done {
                return;
            }
            // Nobody reads any more (the relay gave up on a stalled upstream): the
            // socket is let go rather than waited on.
            let next = tokio::select! {
                next = next_event(&mut ws) => next,
                () = tx.closed() => return,
            };
            event = match next {
                Some(event) => event,
                None => {
                    let cut = std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "the upstream's WebSocket closed mid-response",
                    );
                    let _ = tx.send(Err(cut)).await;
                    return;
                }
            };
        }
    });
    let body = StreamBody::new(futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    let mut response = Response::new(BodyExt::boxed(body));
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    Ok(response)
}

/// The upstream socket's next event; `None` once it is closed.
async fn next_event(ws: &mut UpstreamWs) -> Option<Value> {
    while let Some(message) = ws.next().await {
        match message {
            Ok(Message::Text(text)) => return serde_json::from_str(text.as_str()).ok(),
            Ok(Message::Close(_)) | Err(_) => return None,
            Ok(_) => continue,
        }
    }
    None
}

fn sse(event: &Value) -> Bytes {
    let kind = event["type"].as_str().unwrap_or("message");
    Bytes::from(format!("event: {kind}\ndata: {event}\n\n"))
}

fn error_answer(status: StatusCode, error: Value) -> Response<AdapterBody> {
    let body = Full::new(Bytes::from(json!({"error": error}).to_string()))
        .map_err(|never| match never {})
        .boxed();
    let mut response = Response::new(body);
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    response
}
