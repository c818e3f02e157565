//! The Responses API's WebSocket mode, as a provider serves it: `GET /v1/responses`
//! with `Upgrade: websocket` (once [`crate::MockUpstream::serve_sockets`] is on), then
//! each `response.create` answered by the mock's responder as the same create posted
//! with `stream: true` would be, its events sent one message each. A chain continued
//! with `store: false` is held on the connection, as the API holds it: the newest
//! responses of the socket, by id. Each create is recorded with `x-mock-socket: 1`,
//! and `x-mock-continued: 1` when it continued such a response.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use http::{HeaderValue, Method, Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use crate::{MockBody, Recorded, Reply, Responder, Shared};

/// True for a WebSocket upgrade of the Responses path.
pub(crate) fn is_upgrade<B>(request: &Request<B>) -> bool {
    request.uri().path() == "/v1/responses"
        && (request.headers().get("upgrade"))
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"))
}

/// Switches to the socket and serves it on its own task.
pub(crate) fn accept(
    mut request: Request<Incoming>,
    shared: Arc<Shared>,
    responder: Arc<Responder>,
) -> Response<MockBody> {
    let key = request.headers().get("sec-websocket-key").cloned();
    let accept =
        key.map(|k| tokio_tungstenite::tungstenite::handshake::derive_accept_key(k.as_bytes()));
    let upgrading = hyper::upgrade::on(&mut request);
    let headers = request.headers().clone();
    tokio::spawn(async move {
        if let Ok(upgraded) = upgrading.await {
            let ws =
                WebSocketStream::from_raw_socket(TokioIo::new(upgraded), Role::Server, None).await;
            serve(ws, headers, shared, responder).await;
        }
    });
    let mut response = Response::new(crate::empty_body());
    *response.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
    let out = response.headers_mut();
    out.insert("upgrade", HeaderValue::from_static("websocket"));
    out.insert("connection", HeaderValue::from_static("Upgrade"));
    if let Some(accept) = accept.and_then(|a| HeaderValue::from_str(&a).ok()) {
        out.insert("sec-websocket-accept", accept);
    }
    response
}

async fn serve(
    mut ws: WebSocketStream<TokioIo<hyper::upgrade::Upgraded>>,
    headers: http::HeaderMap,
    shared: Arc<Shared>,
    responder: Arc<Responder>,
) {
    // What the connection holds: each response's whole input and output, by id.
    let mut held: HashMap<String, Vec<Value>> = HashMap::new();
    while let Some(Ok(message)) = ws.next().await {
        let Message::Text(text) = message else {
            continue;
        };
        let mut create: Value = serde_json::from_str(text.as_str()).unwrap_or_default();
        if create["type"] != "response.create" {
            let error = json!({"type": "error", "error": {"type": "invalid_request_error", "code": "unsupported_event", "message": "only response.create"}});
            if ws.send(Message::text(error.to_string())).await.is_err() {
                return;
            }
            continue;
        }
        let mut input = match create["input"].take() {
            Value::Array(items) => items,
            Value::String(text) => vec![json!({"role": "user", "content": text})],
            _ => Vec::new(),
        };
        let local = create["store"] == false;
        let mut continued = false;
        if let (true, Some(previous)) = (
            local,
            create["previous_response_id"].as_str().map(str::to_owned),
        ) {
            match held.get(&previous) {
                Some(history) => {
                    continued = true;
                    input.splice(0..0, history.iter().cloned());
                    if let Some(fields) = create.as_object_mut() {
                        fields.remove("previous_response_id");
                    }
                }
                None => {
                    let error = json!({"type": "error", "status": 400, "error": {"type": "invalid_request_error",
                        "code": "previous_response_not_found",
                        "message": format!("Previous response with id '{previous}' not found.")}});
                    if ws.send(Message::text(error.to_string())).await.is_err() {
                        return;
                    }
                    continue;
                }
            }
        }
        if let Some(fields) = create.as_object_mut() {
            fields.remove("type");
            fields.insert("input".to_owned(), Value::Array(input.clone()));
            fields.insert("stream".to_owned(), json!(true));
        }
        let mut recorded_headers = headers.clone();
        recorded_headers.insert("x-mock-socket", HeaderValue::from_static("1"));
        if continued {
            // The create named a response the connection holds: its input is that
            // history and the create's new items.
            recorded_headers.insert("x-mock-continued", HeaderValue::from_static("1"));
        }
        let recorded = Recorded {
            method: Method::POST,
            target: "/v1/responses".to_owned(),
            headers: recorded_headers,
            body: bytes::Bytes::from(create.to_string()),
        };
        let mut reply = responder(&recorded);
        if let Ok(mut requests) = shared.requests.lock() {
            requests.push(recorded);
        }
        shared.changed.notify_waiters();
        while let Reply::Delayed { delay, then } = reply {
            tokio::time::sleep(delay).await;
            reply = *then;
        }
        let events: Vec<Value> = match reply {
            // Frames may cut an event anywhere: the events are read from them all.
            Reply::Sse { frames, .. } => (frames.concat().lines())
                .filter_map(|line| line.strip_prefix("data: "))
                .filter_map(|data| serde_json::from_str(data).ok())
                .collect(),
            Reply::Json { status, body } | Reply::Pretty { status, body } => {
                vec![json!({"type": "error", "status": status.as_u16(), "error": body["error"]})]
            }
            Reply::Delayed { .. } => Vec::new(),
        };
        for event in events {
            if event["type"] == "response.completed" && local {
                let response = &event["response"];
                let mut history = input.clone();
                history.extend(response["output"].as_array().cloned().unwrap_or_default());
                if let Some(id) = response["id"].as_str() {
                    held.insert(id.to_owned(), history);
                }
            }
            if ws.send(Message::text(event.to_string())).await.is_err() {
                return;
            }
        }
    }
}
