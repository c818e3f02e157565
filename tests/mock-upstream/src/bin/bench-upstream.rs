//! A fast mock provider for the end-to-end benchmark (`benches/e2e.sh`).
//!
//! `POST …/chat/completions` answers a fixed completion as JSON, or, when the body asks
//! for `"stream":true`, 64 SSE deltas 20 ms apart; `POST …/v1/messages` answers the
//! same in Anthropic's shapes, `POST …/v1/responses` in the Responses API's. It records nothing, so that the numbers measure the
//! proxy in front of it. Usage: `bench-upstream 127.0.0.1:18000`.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use mock_upstream::{chat_completion, chat_stream_frames};
use tokio::net::TcpListener;

type Body = BoxBody<Bytes, Infallible>;

/// The fixed answers, per API.
struct Answers {
    json: Bytes,
    frames: &'static [Bytes],
}

async fn answer(
    request: Request<Incoming>,
    chat: &'static Answers,
    messages: &'static Answers,
    responses: &'static Answers,
) -> Response<Body> {
    let path = request.uri().path();
    let Answers { json, frames } = if path.ends_with("/v1/messages") {
        messages
    } else if path.ends_with("/v1/responses") {
        responses
    } else {
        chat
    };
    let json = json.clone();
    let body = request
        .into_body()
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let streaming = body.windows(13).any(|w| w == b"\"stream\":true")
        || body.windows(14).any(|w| w == b"\"stream\": true");
    if !streaming {
        return Response::builder()
            .header("content-type", "application/json")
            .body(Full::new(json).boxed())
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()));
    }
    let ticks = stream::unfold(0usize, move |index| async move {
        let frame = frames.get(index)?.clone();
        if index > 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Some((Ok::<_, Infallible>(Frame::data(frame)), index + 1))
    });
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(StreamBody::new(ticks).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// A Messages API reply with `text`.
fn anthropic_message(text: &str) -> serde_json::Value {
    serde_json::json!({"id": "msg_bench", "type": "message", "role": "assistant", "model": "bench-model",
        "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 8}})
}

/// A Messages API stream of `deltas`.
fn anthropic_frames(deltas: &[&str]) -> Vec<String> {
    let event = |name: &str, data: serde_json::Value| format!("event: {name}\ndata: {data}\n\n");
    let mut message = anthropic_message("");
    message["content"] = serde_json::json!([]);
    let mut frames = vec![format!(
        "{}{}",
        event(
            "message_start",
            serde_json::json!({"type": "message_start", "message": message})
        ),
        event(
            "content_block_start",
            serde_json::json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        )
    )];
    for delta in deltas {
        frames.push(event("content_block_delta", serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": delta}})));
    }
    frames.push(format!(
        "{}{}{}",
        event("content_block_stop", serde_json::json!({"type": "content_block_stop", "index": 0})),
        event("message_delta", serde_json::json!({"type": "message_delta", "delta": {"stop_reason": "end_turn", "stop_sequence": null}, "usage": {"output_tokens": 64}})),
        event("message_stop", serde_json::json!({"type": "message_stop"}))
    ));
    frames
}

/// A Responses API reply with `text`.
fn response_object(text: &str) -> serde_json::Value {
    serde_json::json!({"id": "resp_bench", "object": "response", "created_at": 0, "status": "completed",
        "model": "bench-model", "output": [{"id": "msg_bench", "type": "message", "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]}],
        "usage": {"input_tokens": 10, "output_tokens": 8, "total_tokens": 18}})
}

/// A Responses API stream of `deltas`, in the events the API sends.
fn responses_frames(deltas: &[&str]) -> Vec<String> {
    let event = |data: serde_json::Value| {
        let name = data["type"].as_str().unwrap_or("").to_owned();
        format!("event: {name}\ndata: {data}\n\n")
    };
    let mut opening = response_object("");
    opening["status"] = serde_json::json!("in_progress");
    opening["output"] = serde_json::json!([]);
    let text: String = deltas.concat();
    let item = |status: &str, text: &str| {
        serde_json::json!({"id": "msg_bench", "type": "message", "status": status,
        "role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]})
    };
    let mut frames = vec![[
        event(serde_json::json!({"type": "response.created", "response": opening.clone()})),
        event(serde_json::json!({"type": "response.in_progress", "response": opening})),
        event(serde_json::json!({"type": "response.output_item.added", "output_index": 0, "item": item("in_progress", "")})),
        event(serde_json::json!({"type": "response.content_part.added", "item_id": "msg_bench", "output_index": 0,
            "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})),
    ]
    .concat()];
    for delta in deltas {
        frames.push(event(
            serde_json::json!({"type": "response.output_text.delta", "item_id": "msg_bench",
            "output_index": 0, "content_index": 0, "delta": delta}),
        ));
    }
    let mut done = response_object(&text);
    done["usage"]["output_tokens"] = serde_json::json!(deltas.len());
    frames.push([
        event(serde_json::json!({"type": "response.output_text.done", "item_id": "msg_bench", "output_index": 0,
            "content_index": 0, "text": text})),
        event(serde_json::json!({"type": "response.output_item.done", "output_index": 0, "item": item("completed", &text)})),
        event(serde_json::json!({"type": "response.completed", "response": done})),
    ]
    .concat());
    frames
}

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18000".to_owned());
    let listener = TcpListener::bind(&addr).await?;
    let deltas: Vec<String> = (0..64).map(|i| format!("tok{i} ")).collect();
    let deltas: Vec<&str> = deltas.iter().map(String::as_str).collect();
    let leak = |frames: Vec<String>| -> &'static [Bytes] {
        Box::leak(frames.into_iter().map(Bytes::from).collect())
    };
    let chat: &'static Answers = Box::leak(Box::new(Answers {
        json: Bytes::from(chat_completion("Hello from the benchmark upstream.").to_string()),
        frames: leak(chat_stream_frames(&deltas)),
    }));
    let messages: &'static Answers = Box::leak(Box::new(Answers {
        json: Bytes::from(anthropic_message("Hello from the benchmark upstream.").to_string()),
        frames: leak(anthropic_frames(&deltas)),
    }));
    let responses: &'static Answers = Box::leak(Box::new(Answers {
        json: Bytes::from(response_object("Hello from the benchmark upstream.").to_string()),
        frames: leak(responses_frames(&deltas)),
    }));
    eprintln!("bench-upstream listening on {addr}");
    loop {
        let (socket, _) = listener.accept().await?;
        let _ = socket.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(move |request| async move {
                Ok::<_, Infallible>(answer(request, chat, messages, responses).await)
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(socket), service)
                .await;
        });
    }
}
