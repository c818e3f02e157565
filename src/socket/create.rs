//! One `response.create` of a socket: made into `POST /v1/responses` with
//! `stream: true` (the client's event bytes kept, the socket-only fields taken off),
//! admitted like any request, run through the tracked pipeline, and its event stream
//! sent back one message per event as it arrives. An error answer becomes the API's
//! `error` event; the socket stays open for the next create.

use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures_util::{SinkExt, StreamExt};
use http::{header, HeaderValue, Method};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::{Error as WsError, Message};

use super::session::{error_event, send, Session, Socket};
use super::SOCKET_CREATES;
use crate::access_log::RequestLog;
use crate::base::chunks::Chunks;
use crate::dialect::DialectKind;
use crate::native::strip;
use crate::pipeline::HeldOnSocket;

/// The fields of a socket's create that `POST /v1/responses` does not take.
const SOCKET_ONLY: &[&str] = &["type", "generate", "stream_id", "background", "stream"];

/// The headers of the upgrade request that are the socket's, not a create's.
const SOCKET_HEADERS: &[&str] = &[
    "upgrade",
    "connection",
    "sec-websocket-key",
    "sec-websocket-version",
    "sec-websocket-extensions",
    "sec-websocket-protocol",
    "content-length",
];

/// Largest error answer read to make an `error` event of it.
const MAX_ERROR: usize = 1024 * 1024;

impl Session {
    /// Serves one `response.create` (`text`, read as `event`).
    pub(super) async fn create(
        &mut self,
        socket: &mut Socket,
        text: &str,
        event: &Value,
    ) -> Result<(), WsError> {
        if event.get("generate") == Some(&Value::Bool(false)) {
            return self.warm_up(socket, event).await;
        }
        let continues_warmup =
            (event["previous_response_id"].as_str()).is_some_and(|id| self.warmups.contains(id));
        let mut dropped: Vec<&str> = SOCKET_ONLY.to_vec();
        if continues_warmup {
            // A warm-up holds nothing: the create starts the chain.
            dropped.push("previous_response_id");
        }
        let body = post_body(text, &dropped);
        let snap = self.state.snapshot();
        let mut parts = http::Request::post("/v1/responses")
            .body(())
            .map(|r| r.into_parts().0)
            .unwrap_or_else(|_| http::Request::new(()).into_parts().0);
        for (name, value) in &self.head.headers {
            if !SOCKET_HEADERS.contains(&name.as_str()) {
                parts.headers.append(name.clone(), value.clone());
            }
        }
        parts.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        parts
            .headers
            .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
        let reservation = crate::auth::reservation(&Method::POST, &parts.headers);
        parts.headers.remove(header::CONTENT_LENGTH);
        let admission = match snap.credentials.admit(
            &self.state.secret,
            &self.state.limiter,
            &parts.headers,
            reservation,
        ) {
            Ok(admission) => admission,
            Err(err) => return send(socket, &refusal(err)).await,
        };
        // Only an admitted create opens anything upstream.
        let upstream = self.upstream_socket(&snap, event, &parts.headers).await;
        let how = if upstream.is_some() {
            "socket"
        } else {
            "bridged"
        };
        parts.extensions.insert(HeldOnSocket { upstream });
        let mut log = RequestLog::start(Method::POST, "/v1/responses (socket)".to_owned())
            .with_metrics(std::sync::Arc::clone(&self.state.metrics));
        log.set_tenant(&admission.tenant);
        let idle = snap.config.limits.idle_timeout;
        let request = (parts, Chunks::from(Bytes::from(body)));
        let response = crate::pipeline::handle_read(
            &self.state,
            snap,
            request,
            &mut log,
            admission,
            DialectKind::Responses,
        )
        .await;
        self.state
            .metrics
            .add(SOCKET_CREATES, &[("upstream", how)], 1.0);
        let stream_id = event.get("stream_id").filter(|id| !id.is_null()).cloned();
        relay(socket, log.respond(response), idle, stream_id).await
    }

    /// The upstream's own socket for this one: asked for at the first create, on its
    /// model's upstream, with its credentials as the upstream takes them. `None` when
    /// that upstream serves none, for a create whose model goes to another upstream
    /// than the socket's, and from the moment the socket closed.
    async fn upstream_socket(
        &mut self,
        snap: &crate::state::Snapshot,
        event: &Value,
        headers: &http::HeaderMap,
    ) -> Option<std::sync::Arc<crate::upstream_socket::UpstreamSocket>> {
        use super::session::Link;
        let model = event["model"].as_str().unwrap_or_default();
        let upstream = snap.upstream_in(DialectKind::Responses, model);
        if let Link::Untried = self.upstream {
            let mut headers = headers.clone();
            snap.credentials
                .rewrite(&mut headers, DialectKind::Responses, upstream);
            let max = snap.config.limits.max_body_bytes;
            let opened = crate::upstream_socket::UpstreamSocket::open(upstream, headers, max).await;
            self.upstream = match opened {
                Ok(Some(socket)) => {
                    tracing::info!(peer = %self.peer, "the upstream serves the Responses WebSocket: this socket's creates go on one of its own");
                    Link::Open(Box::new(upstream.clone()), socket)
                }
                Ok(None) => Link::Bridged,
                Err(err) => {
                    tracing::info!(peer = %self.peer, error = %err.message, "no WebSocket to the upstream: this socket's creates are bridged to POST");
                    Link::Bridged
                }
            };
        }
        let Link::Open(opened_on, socket) = &self.upstream else {
            return None;
        };
        if socket.is_closed().await {
            tracing::info!(peer = %self.peer, "the upstream's WebSocket closed: this socket's creates are bridged to POST from now on");
            self.upstream = Link::Bridged;
            return None;
        }
        opened_on
            .same_origin(upstream)
            .then(|| std::sync::Arc::clone(socket))
    }

    /// Answers a warm-up (`generate: false`) on the socket: a response with no output,
    /// nothing sent upstream.
    async fn warm_up(&mut self, socket: &mut Socket, event: &Value) -> Result<(), WsError> {
        let seed = format!(
            "{}\0{:?}\0{}",
            self.peer,
            std::time::SystemTime::now(),
            self.warmups.len()
        );
        let id = format!("resp_{}", &blake3::hash(seed.as_bytes()).to_hex()[..32]);
        let created_at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut response = json!({"id": id, "object": "response", "created_at": created_at,
            "status": "in_progress", "model": event["model"], "output": [], "usage": null});
        send(
            socket,
            &json!({"type": "response.created", "sequence_number": 0, "response": response}),
        )
        .await?;
        response["status"] = json!("completed");
        response["usage"] = json!({"input_tokens": 0, "output_tokens": 0, "total_tokens": 0,
            "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}});
        send(
            socket,
            &json!({"type": "response.completed", "sequence_number": 1, "response": response}),
        )
        .await?;
        self.state
            .metrics
            .add(SOCKET_CREATES, &[("upstream", "warmup")], 1.0);
        self.warmups.insert(id);
        Ok(())
    }
}

/// The create's bytes as a `POST /v1/responses` body: `dropped` members taken off, the
/// rest as the client wrote it, and `"stream": true` first.
fn post_body(text: &str, dropped: &[&str]) -> Vec<u8> {
    let kept = strip::without_members(text.as_bytes(), dropped)
        .unwrap_or_else(|| text.as_bytes().to_vec());
    let Some(open) = kept.iter().position(|b| *b == b'{') else {
        return kept;
    };
    let rest = &kept[open + 1..];
    let empty = rest.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'}');
    let mut body = Vec::with_capacity(kept.len() + 16);
    body.extend_from_slice(&kept[..=open]);
    body.extend_from_slice(if empty {
        b"\"stream\":true"
    } else {
        b"\"stream\":true,"
    });
    body.extend_from_slice(rest);
    body
}

/// The `error` event for a create refused before it ran.
fn refusal(err: crate::error::ApiError) -> Value {
    json!({"type": "error", "status": err.status.as_u16(),
           "error": {"type": err.kind, "code": err.code, "message": err.message}})
}

/// Sends the pipeline's answer to the socket: each event of a stream as one message, as
/// it arrives; any other answer as one `error` event.
/// Each event carries the create's `stream_id`, when it named one, as the API's do.
async fn relay(
    socket: &mut Socket,
    response: http::Response<crate::access_log::Logged>,
    idle: std::time::Duration,
    stream_id: Option<Value>,
) -> Result<(), WsError> {
    let status = response.status();
    let streamed = crate::forward::is_event_stream(response.headers());
    let body = response.into_body();
    if !status.is_success() || !streamed {
        let read = http_body_util::Limited::new(body, MAX_ERROR)
            .collect()
            .await;
        let bytes = read.map(|b| b.to_bytes()).unwrap_or_default();
        let answer: Value = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| json!({"error": {"message": String::from_utf8_lossy(&bytes)}}));
        let error = answer.get("error").cloned().unwrap_or(answer);
        let mut event = json!({"type": "error", "status": status.as_u16(), "error": error});
        if let Some(id) = &stream_id {
            event["stream_id"] = id.clone();
        }
        return send(socket, &event).await;
    }
    let mut events = std::pin::pin!(body.into_data_stream().eventsource());
    while let Some(event) = events.next().await {
        match event {
            Ok(event) if event.data.is_empty() || event.data == "[DONE]" => {}
            // A client that stops reading holds the stream back (nothing more is read
            // from upstream), and is dropped once it has read nothing for the idle limit.
            Ok(event) => {
                let text = match &stream_id {
                    Some(id) => with_stream_id(&event.data, id),
                    None => event.data,
                };
                match tokio::time::timeout(idle, socket.send(Message::text(text))).await {
                    Ok(sent) => sent?,
                    Err(_) => {
                        let stalled = std::io::Error::new(
                            std::io::ErrorKind::TimedOut,
                            "the client read nothing for limits.idle_timeout",
                        );
                        return Err(WsError::Io(stalled));
                    }
                }
            }
            Err(err) => {
                let error = error_event(
                    "server_error",
                    "upstream_cut",
                    &format!("the response stream was cut: {err}"),
                );
                return send(socket, &error).await;
            }
        }
    }
    Ok(())
}

/// `data` (an event) with `stream_id` set; as it came when it is no JSON object.
fn with_stream_id(data: &str, stream_id: &Value) -> String {
    match serde_json::from_str::<Value>(data) {
        Ok(Value::Object(mut event)) => {
            event.insert("stream_id".to_owned(), stream_id.clone());
            Value::Object(event).to_string()
        }
        _ => data.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_is_posted_with_its_bytes_stream_on_and_the_socket_fields_off() {
        let text = r#"{"type":"response.create","model":"m","stream_id":"s1","input":[{"role":"user","content":"hi"}]}"#;
        assert_eq!(
            String::from_utf8(post_body(text, SOCKET_ONLY)).unwrap(),
            r#"{"stream":true,"model":"m","input":[{"role":"user","content":"hi"}]}"#
        );
        assert_eq!(
            String::from_utf8(post_body(r#"{"type":"response.create"}"#, SOCKET_ONLY)).unwrap(),
            r#"{"stream":true}"#
        );
    }
}
