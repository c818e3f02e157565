//! The floor under handoff's CPU per request: the least a proxy built on the same
//! stack does, for `benches/ab.sh` to measure beside handoff.
//!
//! It has handoff's shape (one current-thread tokio runtime per worker, each with its
//! own `SO_REUSEPORT` listener and its own hyper-util pooled client, `TCP_NODELAY` on
//! both sides, hyper-util's auto server) and does nothing else: no body read, no
//! parsing, no tracking, no log line. Each request's head and body go upstream as
//! they came, and the answer comes back as it came. What handoff spends above this
//! floor is handoff's own; the floor itself is hyper's and tokio's.
//!
//! Usage: `bench-floor LISTEN UPSTREAM_URL [WORKERS]`, e.g.
//! `bench-floor 127.0.0.1:18202 http://127.0.0.1:18200 2`.

use std::net::SocketAddr;
use std::sync::Arc;

use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use socket2::{Domain, Protocol, Socket, Type};

type Upstream = Client<HttpConnector, Incoming>;

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
    client: &Upstream,
    base: &str,
    request: Request<Incoming>,
) -> Result<Response<Incoming>, hyper_util::client::legacy::Error> {
    let (mut parts, body) = request.into_parts();
    let target = format!(
        "{base}{}",
        parts.uri.path_and_query().map_or("/", |p| p.as_str())
    );
    if let Ok(uri) = target.parse::<Uri>() {
        parts.uri = uri;
    }
    parts.headers.remove(http::header::HOST);
    client.request(Request::from_parts(parts, body)).await
}

async fn worker(listener: std::net::TcpListener, base: Arc<str>) -> std::io::Result<()> {
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Upstream = Client::builder(TokioExecutor::new()).build(connector);
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let (client, base) = (client.clone(), Arc::clone(&base));
        tokio::spawn(async move {
            let service = service_fn(move |request| {
                let (client, base) = (client.clone(), Arc::clone(&base));
                async move { forward(&client, &base, request).await }
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
    let base: Arc<str> = args.next().ok_or(usage)?.trim_end_matches('/').into();
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
