//! An in-repo mock LLM provider for handoff's tests and benchmarks.
//!
//! It speaks just enough of OpenAI's chat-completions API: JSON replies, SSE streams
//! with a gap between frames, errors, streams cut mid-way, slow answers. It records
//! every request it receives, and notices when a client abandons a stream.
//!
//! ```no_run
//! # async fn demo() {
//! use mock_upstream::{MockUpstream, Reply};
//! let mock = MockUpstream::replying(Reply::chat_text("hello")).await;
//! let url = mock.url();
//! # }
//! ```

mod agent;
pub mod anthropic;
pub mod cache;
pub mod fixtures;
pub mod gemini;
pub mod native;
mod reply;
pub mod responses;
pub mod scripted;
mod socket;
pub mod strict;
pub mod text_coder;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures_util::stream;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{combinators::BoxBody, BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};

pub use agent::{agent_reply, agent_reply_as, tool_call_frames, AgentStyle};
pub use reply::{chat_completion, chat_stream_frames, Reply};

/// One request as the mock received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// The method.
    pub method: Method,
    /// Path and query.
    pub target: String,
    /// Every header, as received.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl Recorded {
    /// The body parsed as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

type Responder = dyn Fn(&Recorded) -> Reply + Send + Sync;

#[derive(Default)]
struct Shared {
    requests: Mutex<Vec<Recorded>>,
    aborted_streams: Mutex<usize>,
    changed: Notify,
    /// True once the mock serves the Responses API's WebSocket mode.
    sockets: std::sync::atomic::AtomicBool,
}

/// A running mock upstream; it stops when dropped.
pub struct MockUpstream {
    addr: SocketAddr,
    shared: Arc<Shared>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl MockUpstream {
    /// Starts a mock that answers every request with `reply`.
    pub async fn replying(reply: Reply) -> Self {
        Self::with(move |_| reply.clone()).await
    }

    /// Starts a mock whose answer is computed from each request.
    pub async fn with(responder: impl Fn(&Recorded) -> Reply + Send + Sync + 'static) -> Self {
        Self::serve_on(
            "127.0.0.1:0".parse().unwrap_or_else(|_| unreachable!()),
            responder,
        )
        .await
    }

    /// Starts a mock on `addr`.
    pub async fn serve_on(
        addr: SocketAddr,
        responder: impl Fn(&Recorded) -> Reply + Send + Sync + 'static,
    ) -> Self {
        let listener = TcpListener::bind(addr).await.expect("mock upstream bind");
        let addr = listener.local_addr().expect("mock upstream address");
        let shared = Arc::new(Shared::default());
        let responder: Arc<Responder> = Arc::new(responder);
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let accept_shared = Arc::clone(&shared);
        tokio::spawn(async move {
            loop {
                let (socket, _) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(pair) => pair,
                        Err(_) => continue,
                    },
                    _ = &mut stopped => return,
                };
                let _ = socket.set_nodelay(true);
                let shared = Arc::clone(&accept_shared);
                let responder = Arc::clone(&responder);
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let shared = Arc::clone(&shared);
                        let responder = Arc::clone(&responder);
                        async move {
                            let sockets = shared.sockets.load(std::sync::atomic::Ordering::SeqCst);
                            if sockets && socket::is_upgrade(&request) {
                                return Ok::<_, Infallible>(socket::accept(
                                    request, shared, responder,
                                ));
                            }
                            Ok::<_, Infallible>(answer(request, &shared, &*responder).await)
                        }
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection_with_upgrades(TokioIo::new(socket), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            shared,
            _stop: stop,
        }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves the Responses API's WebSocket mode (`GET /v1/responses` upgraded) or
    /// stops serving it (the upgrade then gets the mock's ordinary answer).
    pub fn serve_sockets(&self, on: bool) {
        self.shared
            .sockets
            .store(on, std::sync::atomic::Ordering::SeqCst);
    }

    /// Every request received so far, in order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared
            .requests
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Waits until `count` requests have arrived; panics after `timeout`.
    pub async fn wait_for_requests(&self, count: usize, timeout: Duration) -> Vec<Recorded> {
        self.wait_until(timeout, |s| {
            s.requests.lock().map(|r| r.len() >= count).unwrap_or(false)
        })
        .await;
        self.requests()
    }

    /// Waits until a client has abandoned a stream; panics after `timeout`.
    pub async fn wait_for_aborted_stream(&self, timeout: Duration) {
        self.wait_until(timeout, |s| {
            s.aborted_streams.lock().map(|n| *n > 0).unwrap_or(false)
        })
        .await;
    }

    /// Streams abandoned by the client so far.
    pub fn aborted_streams(&self) -> usize {
        self.shared.aborted_streams.lock().map(|n| *n).unwrap_or(0)
    }

    async fn wait_until(&self, timeout: Duration, done: impl Fn(&Shared) -> bool) {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.shared.changed.notified();
            if done(&self.shared) {
                return;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!("mock upstream: condition not met within {timeout:?}");
            }
        }
    }
}

type MockBody = BoxBody<Bytes, std::io::Error>;

/// A body with nothing in it.
fn empty_body() -> MockBody {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

async fn answer(
    request: Request<Incoming>,
    shared: &Arc<Shared>,
    responder: &Responder,
) -> Response<MockBody> {
    let (parts, body) = request.into_parts();
    let body = body
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let recorded = Recorded {
        method: parts.method,
        target: parts
            .uri
            .path_and_query()
            .map(|pq| pq.to_string())
            .unwrap_or_default(),
        headers: parts.headers,
        body,
    };
    let reply = responder(&recorded);
    if let Ok(mut requests) = shared.requests.lock() {
        requests.push(recorded);
    }
    shared.changed.notify_waiters();
    render(reply, shared).await
}

/// A JSON answer of `text`.
fn json_response(status: http::StatusCode, text: String) -> Response<MockBody> {
    let body = Full::new(Bytes::from(text))
        .map_err(|never| match never {})
        .boxed();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .header("x-mock-upstream", "1")
        .body(body)
        .unwrap_or_else(|_| unreachable!())
}

fn render(
    reply: Reply,
    shared: &Arc<Shared>,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Response<MockBody>> + Send + '_>> {
    Box::pin(async move {
        match reply {
            Reply::Delayed { delay, then } => {
                tokio::time::sleep(delay).await;
                render(*then, shared).await
            }
            Reply::Pretty { status, body } => json_response(
                status,
                serde_json::to_string_pretty(&body).unwrap_or_default(),
            ),
            Reply::Json { status, body } => json_response(status, body.to_string()),
            Reply::Sse {
                frames,
                gap,
                cut_after,
            } => sse_response(frames, gap, cut_after, Arc::clone(shared)),
        }
    })
}

fn sse_response(
    frames: Vec<String>,
    gap: Duration,
    cut_after: Option<usize>,
    shared: Arc<Shared>,
) -> Response<MockBody> {
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, std::io::Error>>(1);
    tokio::spawn(async move {
        for (index, frame) in frames.into_iter().enumerate() {
            if index > 0 && !gap.is_zero() {
                tokio::time::sleep(gap).await;
            }
            if cut_after == Some(index) {
                let cut =
                    std::io::Error::new(std::io::ErrorKind::ConnectionReset, "mock cut the stream");
                let _ = tx.send(Err(cut)).await;
                return;
            }
            if tx.send(Ok(Frame::data(Bytes::from(frame)))).await.is_err() {
                if let Ok(mut aborted) = shared.aborted_streams.lock() {
                    *aborted += 1;
                }
                shared.changed.notify_waiters();
                return;
            }
        }
    });
    let body = StreamBody::new(stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|item| (item, rx))
    }));
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("x-mock-upstream", "1")
        .body(BodyExt::boxed(body))
        .unwrap_or_else(|_| unreachable!())
}
