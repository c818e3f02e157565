//! The listening side: accept loop, `TCP_NODELAY`, HTTP/1.1 and h2 (h2c or TLS by
//! ALPN), and graceful shutdown on SIGINT/SIGTERM.
//!
//! One client must not degrade everyone: connections are capped, each peer address
//! to its own share ([`crate::peers`]); when every slot is taken, the oldest
//! connection that has sent nothing is closed to make room, and only then does a new
//! one wait. A connection that has not sent a whole request head within
//! `limits.header_timeout` of its accept (TLS handshake and protocol sniff included)
//! is closed.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Overrides};
use crate::reload::{spawn_reloader, watch_config_file};
use crate::router::route;
use crate::state::AppState;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ServeError {
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
    /// The TLS certificate or key could not be loaded.
    #[error("cannot load TLS {what} from {path}: {reason}")]
    Tls {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file.
        path: String,
        /// The cause.
        reason: String,
    },
    /// The shared state could not be built.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// Installing signal handlers failed.
    #[error("cannot install signal handlers: {0}")]
    Signal(std::io::Error),
    /// A worker thread could not be started.
    #[error("cannot start a worker thread: {0}")]
    Worker(std::io::Error),
}

/// Runs the proxy until SIGINT or SIGTERM, then drains within `shutdown_grace`.
///
/// The calling thread is worker 0; [`crate::worker::count`] − 1 more threads are
/// started, each with a current-thread runtime and its own listening socket on the
/// same address (`SO_REUSEPORT`). A connection is then served, start to end, on the
/// thread whose socket the kernel gave it to: no request wakes another thread. With
/// one worker on a multi-thread runtime (`workers = 0`), there is one listener and the
/// runtime spreads the connections.
pub(crate) async fn serve(config: Config, overrides: Overrides) -> Result<(), ServeError> {
    let tls = match (&config.tls.cert_file, &config.tls.key_file) {
        (Some(cert), Some(key)) => Some(tls_acceptor(cert, key)?),
        _ => None,
    };
    let workers = crate::worker::count();
    let (first, rest) = bind(config.listen, workers)?;
    let local = first.local_addr().map_err(|source| ServeError::Bind {
        addr: config.listen,
        source,
    })?;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let state = Arc::new(AppState::new(config, overrides).await?);
    let reload = spawn_reloader(Arc::clone(&state));
    crate::tools::upkeep::task::spawn(Arc::clone(&state));
    state.advertise(&format!("{scheme}://{local}"));
    let _watcher = state
        .config_file()
        .and_then(|file| watch_config_file(file, reload.clone()));
    tracing::info!(
        upstream = %crate::redact::shown_url(&state.snapshot().config.upstream.base_url),
        workers,
        "handoff listening on {scheme}://{local}"
    );

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ServeError::Signal)?;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(ServeError::Signal)?;
    let limits = state.snapshot().config.limits.clone();
    let shared = Shared {
        grace: state.snapshot().config.shutdown_grace,
        state: Arc::clone(&state),
        tls,
        connections: Arc::new(tokio::sync::Semaphore::new(limits.max_connections)),
        peers: crate::peers::Peers::new(limits.max_connections_per_peer),
        timeouts: Timeouts {
            header: limits.header_timeout,
            idle: limits.idle_timeout,
        },
        slots: limits.max_connections,
        stop: CancellationToken::new(),
        drained: Arc::new(Drained::new(workers)),
    };
    let mut threads = Vec::with_capacity(rest.len());
    for (offset, listener) in rest.into_iter().enumerate() {
        let worker = shared.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("handoff-worker-{}", offset + 1))
            .spawn(move || run_worker_thread(offset + 1, listener, worker));
        match spawned {
            Ok(thread) => threads.push(thread),
            Err(err) => {
                // The workers already started stop with us; nothing has been accepted.
                shared.stop.cancel();
                shared.drained.done();
                return Err(ServeError::Worker(err));
            }
        }
    }

    let stop = shared.stop.clone();
    let grace = shared.grace;
    let signals = async {
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => break,
                _ = terminate.recv() => break,
                _ = hangup.recv() => {
                    let _ = reload.try_send("SIGHUP");
                }
                () = stop.cancelled() => break,
            }
        }
        // Running compactions stop and commit nothing; requests already streaming go on.
        state.shutdown.cancel();
        stop.cancel();
        tracing::info!(?grace, "shutting down; waiting for in-flight requests");
    };
    let drained = Arc::clone(&shared.drained);
    tokio::join!(accept_loop(first, shared), signals);
    drained.wait().await;
    tracing::info!("all workers drained");
    let exporting = Arc::clone(&state);
    let joined = tokio::task::spawn_blocking(move || {
        for thread in threads {
            if thread.join().is_err() {
                tracing::error!("a worker thread panicked");
            }
        }
        // The last requests' spans leave before the process does.
        if let Some(telemetry) = &exporting.telemetry {
            telemetry.shutdown(grace);
        }
    })
    .await;
    if let Err(err) = joined {
        tracing::error!(error = %err, "joining the worker threads failed");
    }
    Ok(())
}

/// What every worker's accept loop shares.
#[derive(Clone)]
struct Shared {
    state: Arc<AppState>,
    tls: Option<TlsAcceptor>,
    connections: Arc<tokio::sync::Semaphore>,
    peers: Arc<crate::peers::Peers>,
    timeouts: Timeouts,
    /// `limits.max_connections`: the slots shared out when they run short.
    slots: usize,
    grace: Duration,
    /// Cancelled on SIGINT/SIGTERM, or when a worker cannot start.
    stop: CancellationToken,
    drained: Arc<Drained>,
}

/// Counts the workers still draining. Each keeps its runtime alive until every one
/// has drained: a connection to the provider or the database that one worker opened
/// may be in use by another's request until then.
struct Drained {
    left: AtomicUsize,
    all: CancellationToken,
}

impl Drained {
    fn new(workers: usize) -> Self {
        Self {
            left: AtomicUsize::new(workers),
            all: CancellationToken::new(),
        }
    }

    fn done(&self) {
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.all.cancel();
        }
    }

    /// Marks this worker drained, then waits for the others.
    async fn wait(&self) {
        self.done();
        self.all.cancelled().await;
    }
}

/// Worker `index`'s thread: its own current-thread runtime, its accept loop.
fn run_worker_thread(index: usize, listener: std::net::TcpListener, shared: Shared) {
    crate::worker::enter(index);
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(worker = index, error = %err, "cannot start a worker's runtime; stopping");
            shared.stop.cancel();
            shared.drained.done();
            return;
        }
    };
    let drained = Arc::clone(&shared.drained);
    runtime.block_on(async move {
        accept_loop(listener, shared).await;
        drained.wait().await;
    });
}

/// Binds `count` listening sockets on `addr` (one when `count` is 1), the first with
/// the port the others then share. A first plain bind, without `SO_REUSEPORT`, makes
/// a port another process holds fail as it would with one socket, not be shared.
fn bind(
    addr: SocketAddr,
    count: usize,
) -> Result<(std::net::TcpListener, Vec<std::net::TcpListener>), ServeError> {
    let failed = |source| ServeError::Bind { addr, source };
    if count <= 1 {
        return Ok((listening_socket(addr, false).map_err(failed)?, Vec::new()));
    }
    let probe = listening_socket(addr, false).map_err(failed)?;
    let shared_addr = probe.local_addr().map_err(failed)?;
    drop(probe);
    let first = listening_socket(shared_addr, true).map_err(failed)?;
    let rest = (1..count)
        .map(|_| listening_socket(shared_addr, true))
        .collect::<Result<Vec<_>, _>>()
        .map_err(failed)?;
    Ok((first, rest))
}

/// A non-blocking listening socket with tokio's defaults (`SO_REUSEADDR`, a backlog
/// of 1024), and `SO_REUSEPORT` when asked.
fn listening_socket(addr: SocketAddr, reuse_port: bool) -> std::io::Result<std::net::TcpListener> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    if reuse_port {
        socket.set_reuse_port(true)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

/// One worker's accept loop: until `stop`, then its connections drain within the grace.
async fn accept_loop(listener: std::net::TcpListener, shared: Shared) {
    let listener = match TcpListener::from_std(listener) {
        Ok(listener) => listener,
        Err(err) => {
            tracing::error!(error = %err, "cannot register a listening socket; stopping");
            shared.stop.cancel();
            return;
        }
    };
    let graceful = GracefulShutdown::new();
    let Shared {
        state,
        tls,
        connections,
        peers,
        timeouts,
        slots,
        grace,
        stop,
        drained: _,
    } = shared;
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(err) => {
                    // EMFILE and friends: keep serving the connections we have.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        // Then a slot. Taken before the accept, every idle worker would hold one, and
        // a connection landing beside them would shed an idle one for nothing. When
        // none is free, an idle connection makes room; past that, this worker accepts
        // no more until one is, and new connections wait in the backlog.
        let permit = match Arc::clone(&connections).try_acquire_owned() {
            Ok(permit) => permit,
            Err(_) => {
                if peers.shed_idle(slots) {
                    tracing::debug!("every connection slot taken; closing the oldest idle one");
                }
                tokio::select! {
                    permit = Arc::clone(&connections).acquire_owned() => match permit {
                        Ok(permit) => permit,
                        Err(_) => break,
                    },
                    () = stop.cancelled() => break,
                }
            }
        };
        let Some(admitted) = peers.admit(peer.ip()) else {
            tracing::debug!(%peer, "closing: the peer holds limits.max_connections_per_peer connections, none silent");
            continue;
        };
        if let Err(err) = stream.set_nodelay(true) {
            tracing::debug!(error = %err, "set_nodelay failed");
        }
        let state = Arc::clone(&state);
        let watcher = graceful.watcher();
        let deadline = tokio::time::Instant::now() + timeouts.header;
        match tls.clone() {
            Some(acceptor) => {
                tokio::spawn(async move {
                    let _permit = permit;
                    let handshake = tokio::time::timeout_at(deadline, acceptor.accept(stream));
                    let shed = admitted.shed.clone();
                    let handshake = tokio::select! {
                        done = handshake => done,
                        () = shed.cancelled() => return,
                    };
                    match handshake {
                        Ok(Ok(stream)) => {
                            serve_connection(
                                stream,
                                peer,
                                state,
                                watcher,
                                (deadline, timeouts),
                                admitted,
                            )
                            .await;
                        }
                        Ok(Err(err)) => {
                            tracing::debug!(%peer, error = %err, "TLS handshake failed");
                        }
                        Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                    }
                });
            }
            None => {
                tokio::spawn(async move {
                    let _permit = permit;
                    serve_connection(stream, peer, state, watcher, (deadline, timeouts), admitted)
                        .await;
                });
            }
        }
    }

    drop(listener);
    tokio::select! {
        () = graceful.shutdown() => tracing::debug!(worker = crate::worker::index(), "all connections closed"),
        () = tokio::time::sleep(grace) => tracing::warn!(?grace, "grace period over; exiting with requests in flight"),
    }
}

/// How long a connection may wait for a request head, and stay idle between requests.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    header: Duration,
    idle: Duration,
}

/// How often a shed connection with a request in flight looks again whether it is idle.
const SHED_RECHECK: Duration = Duration::from_millis(100);

/// Serves one connection; closes it if no request head arrived by the deadline, when
/// it has been idle for `idle`, or, once it is shed, as soon as no request is in flight.
async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    state: Arc<AppState>,
    watcher: hyper_util::server::graceful::Watcher,
    (deadline, timeouts): (tokio::time::Instant, Timeouts),
    admitted: crate::peers::Admitted,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let shed = admitted.shed.clone();
    let requests = Arc::clone(&admitted.state);
    let connection_state = Arc::clone(&admitted.state);
    let service = service_fn(move |request| {
        let in_flight = requests.start();
        let state = Arc::clone(&state);
        async move {
            let response = route(&state, request, peer).await;
            Ok::<_, Infallible>(response.map(|body| InFlightBody::new(body, in_flight)))
        }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(timeouts.header);
    builder.http2().timer(TokioTimer::new());
    let connection =
        watcher.watch(builder.serve_connection_with_upgrades(TokioIo::new(stream), service));
    tokio::pin!(connection);
    let mut shed_seen = false;
    let ended = loop {
        let state = &connection_state;
        // The sniff and the first head have no timer of hyper's: `deadline` is theirs.
        let next_check = match state.idle_for() {
            _ if shed_seen => tokio::time::Instant::now() + SHED_RECHECK,
            Some(idle) => tokio::time::Instant::now() + timeouts.idle.saturating_sub(idle),
            None => tokio::time::Instant::now() + timeouts.idle,
        };
        tokio::select! {
            ended = &mut connection => break ended,
            () = shed.cancelled(), if !shed_seen => shed_seen = true,
            // Its condition is read when the loop turns: a head may have come since.
            () = tokio::time::sleep_until(deadline), if !state.spoke() => {
                if !state.spoke() {
                    tracing::debug!(%peer, "no request head within limits.header_timeout; closing");
                    return;
                }
            }
            () = tokio::time::sleep_until(next_check) => {}
        }
        match state.idle_for() {
            Some(_) if shed_seen => {
                tracing::debug!(%peer, "shed: idle while every slot was taken");
                return;
            }
            Some(idle) if idle >= timeouts.idle => {
                tracing::debug!(%peer, ?idle, "idle past limits.idle_timeout; closing");
                return;
            }
            _ => {}
        }
    };
    if let Err(err) = ended {
        tracing::debug!(%peer, error = %err, "connection ended with an error");
    }
}

pin_project_lite::pin_project! {
    /// A response body that holds its request in flight on the connection until it
    /// ends: a stream that runs for minutes keeps its connection from being idle.
    struct InFlightBody<B> {
        #[pin]
        body: B,
        in_flight: Option<crate::peers::InFlight>,
    }
}

impl<B> InFlightBody<B> {
    fn new(body: B, in_flight: crate::peers::InFlight) -> Self {
        Self {
            body,
            in_flight: Some(in_flight),
        }
    }
}

impl<B: http_body::Body> http_body::Body for InFlightBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let this = self.project();
        let polled = this.body.poll_frame(cx);
        if matches!(polled, std::task::Poll::Ready(None)) {
            this.in_flight.take();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

fn tls_acceptor(cert: &Path, key: &Path) -> Result<TlsAcceptor, ServeError> {
    let tls_error = |what, path: &Path, reason: String| ServeError::Tls {
        what,
        path: path.display().to_string(),
        reason,
    };
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|iter| iter.collect::<Result<Vec<_>, _>>())
        .map_err(|err| tls_error("certificate", cert, err.to_string()))?;
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|err| tls_error("key", key, err.to_string()))?;
    let mut server = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key_der)
        .map_err(|err| tls_error("certificate", cert, err.to_string()))?;
    server.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(server)))
}
