//! The floor under handoff's CPU per request: the least a proxy built on the same
//! stack does, for `benches/ab.sh` to measure beside handoff.
//!
//! It has handoff's shape (one current-thread tokio runtime per worker, each with its
//! own `SO_REUSEPORT` listener and its own list of HTTP/1.1 connections to the
//! upstream, taken when hyper says one is ready, `TCP_NODELAY` on both sides,
//! hyper-util's auto server) and does nothing else: no body read, no parsing, no
//! tracking, no log line. Each request's head and body go upstream as they came, and
//! the answer comes back as it came. What handoff spends above this floor is
//! handoff's own; the floor itself is hyper's and tokio's.
//!
//! Usage: `bench-floor LISTEN UPSTREAM_URL [WORKERS]`, e.g.
//! `bench-floor 127.0.0.1:18202 http://127.0.0.1:18200 2`.

use std::cell::RefCell;
use std::net::SocketAddr;
use std::sync::Arc;

use http::{HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use socket2::{Domain, Protocol, Socket, Type};

thread_local! {
    /// This worker's connections to the upstream, each kept while in use.
    static CONNECTIONS: RefCell<Vec<SendRequest<Incoming>>> = const { RefCell::new(Vec::new()) };
}

fn listener(addr: SocketAddr) -> std::io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

async fn forward(
    upstream: &str,
    host: &HeaderValue,
    request: Request<Incoming>,
) -> std::io::Result<Response<Incoming>> {
    let (mut parts, body) = request.into_parts();
    parts.headers.insert(http::header::HOST, host.clone());
    let request = Request::from_parts(parts, body);
    let ready = CONNECTIONS.with(|connections| {
        let mut connections = connections.borrow_mut();
        connections.retain(|sender| !sender.is_closed());
        connections.iter().rposition(SendRequest::is_ready)
    });
    let exchange = match ready {
        Some(index) => {
            CONNECTIONS.with(|connections| connections.borrow_mut()[index].send_request(request))
        }
        None => {
            let stream = tokio::net::TcpStream::connect(upstream).await?;
            stream.set_nodelay(true)?;
            let (mut sender, connection) = http1::handshake(TokioIo::new(stream))
                .await
                .map_err(std::io::Error::other)?;
            tokio::spawn(connection);
            let exchange = sender.send_request(request);
            CONNECTIONS.with(|connections| connections.borrow_mut().push(sender));
            exchange
        }
    };
    exchange.await.map_err(std::io::Error::other)
}

async fn worker(listener: std::net::TcpListener, upstream: Arc<str>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let host = HeaderValue::from_str(&upstream).map_err(std::io::Error::other)?;
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let (upstream, host) = (Arc::clone(&upstream), host.clone());
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let (upstream, host) = (Arc::clone(&upstream), host.clone());
                async move { forward(&upstream, &host, request).await }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bench-floor LISTEN UPSTREAM_URL [WORKERS]";
    let addr: SocketAddr = args.next().ok_or(usage)?.parse()?;
    // The floor speaks plain HTTP/1.1 to bench-upstream: its host and port are all it needs.
    let base: Arc<str> = args
        .next()
        .ok_or(usage)?
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .into();
    let workers: usize = args.next().map_or(Ok(2), |n| n.parse())?;
    let threads: Vec<_> = (0..workers.max(1))
        .map(|_| {
            let listener = listener(addr)?;
            let base = Arc::clone(&base);
            Ok(std::thread::spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                runtime.block_on(worker(listener, base))
            }))
        })
        .collect::<std::io::Result<_>>()?;
    for thread in threads {
        if let Ok(Err(err)) = thread.join() {
            eprintln!("bench-floor: {err}");
        }
    }
    Ok(())
}
