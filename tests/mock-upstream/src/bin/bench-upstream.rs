//! A fast mock provider for the end-to-end benchmark (`benches/e2e.sh`).
//!
//! `POST …/chat/completions` answers a fixed completion as JSON, or, when the body asks
//! for `"stream":true`, 64 SSE deltas 20 ms apart. It records nothing, so that the
//! numbers measure the proxy in front of it. Usage: `bench-upstream 127.0.0.1:18000`.

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

async fn answer(
    request: Request<Incoming>,
    json: Bytes,
    frames: &'static [Bytes],
) -> Response<Body> {
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

#[tokio::main]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "127.0.0.1:18000".to_owned());
    let listener = TcpListener::bind(&addr).await?;
    let json = Bytes::from(chat_completion("Hello from the benchmark upstream.").to_string());
    let deltas: Vec<String> = (0..64).map(|i| format!("tok{i} ")).collect();
    let deltas: Vec<&str> = deltas.iter().map(String::as_str).collect();
    let frames: &'static [Bytes] = Box::leak(
        chat_stream_frames(&deltas)
            .into_iter()
            .map(Bytes::from)
            .collect(),
    );
    eprintln!("bench-upstream listening on {addr}");
    loop {
        let (socket, _) = listener.accept().await?;
        let _ = socket.set_nodelay(true);
        let json = json.clone();
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let json = json.clone();
                async move { Ok::<_, Infallible>(answer(request, json, frames).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(socket), service)
                .await;
        });
    }
}
