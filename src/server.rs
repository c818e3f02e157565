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
use std::sync::atomic::{AtomicBool, Ordering};
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

use crate::config::{Config, Overrides};
use crate::reload::{spawn_reloader, watch_config_file};
use crate::router::route;
use crate::state::AppState;

/// Why the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
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
}

/// Runs the proxy until SIGINT or SIGTERM, then drains within `shutdown_grace`.
pub async fn serve(config: Config, overrides: Overrides) -> Result<(), ServeError> {
    let tls = match (&config.tls.cert_file, &config.tls.key_file) {
        (Some(cert), Some(key)) => Some(tls_acceptor(cert, key)?),
        _ => None,
    };
    let listener = TcpListener::bind(config.listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: config.listen,
            source,
        })?;
    let local = listener.local_addr().map_err(|source| ServeError::Bind {
        addr: config.listen,
        source,
    })?;
    let grace = config.shutdown_grace;
    let scheme = if tls.is_some() { "https" } else { "http" };
    let state = Arc::new(AppState::new(config, overrides).await?);
    let reload = spawn_reloader(Arc::clone(&state));
    let _watcher = state
        .config_file()
        .and_then(|file| watch_config_file(file, reload.clone()));
    tracing::info!(
        upstream = %crate::redact::shown_url(&state.snapshot().config.upstream.base_url),
        "handoff listening on {scheme}://{local}"
    );

    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(ServeError::Signal)?;
    let mut hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .map_err(ServeError::Signal)?;
    let graceful = GracefulShutdown::new();
    let limits = state.snapshot().config.limits.clone();
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let peers = crate::peers::Peers::new(limits.max_connections_per_peer);
    let header_timeout = limits.header_timeout;
    loop {
        // A slot first: when none is free, a silent connection makes room; past that,
        // new connections wait in the backlog.
        let next = async {
            let permit = match Arc::clone(&connections).try_acquire_owned() {
                Ok(permit) => Ok(permit),
                Err(_) => {
                    if peers.shed_silent() {
                        tracing::debug!(
                            "every connection slot taken; closed the oldest silent one"
                        );
                    }
                    Arc::clone(&connections).acquire_owned().await
                }
            };
            (permit, listener.accept().await)
        };
        let (permit, stream, peer) = tokio::select! {
            (permit, accepted) = next => match (permit, accepted) {
                (Ok(permit), Ok((stream, peer))) => (permit, stream, peer),
                (Err(_), _) => break,
                (_, Err(err)) => {
                    // EMFILE and friends: keep serving the connections we have.
                    tracing::warn!(error = %err, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = terminate.recv() => break,
            _ = hangup.recv() => {
                let _ = reload.try_send("SIGHUP");
                continue;
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
        let deadline = tokio::time::Instant::now() + header_timeout;
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
                                (deadline, header_timeout),
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
                    serve_connection(
                        stream,
                        peer,
                        state,
                        watcher,
                        (deadline, header_timeout),
                        admitted,
                    )
                    .await;
                });
            }
        }
    }

    drop(listener);
    // Running compactions stop and commit nothing; requests already streaming go on.
    state.shutdown.cancel();
    tracing::info!(?grace, "shutting down; waiting for in-flight requests");
    tokio::select! {
        () = graceful.shutdown() => tracing::info!("all connections closed"),
        () = tokio::time::sleep(grace) => tracing::warn!(?grace, "grace period over; exiting with requests in flight"),
    }
    Ok(())
}

/// Serves one connection; closes it if no request head arrived by the deadline, or
/// when it is shed before its first one.
async fn serve_connection<S>(
    stream: S,
    peer: SocketAddr,
    state: Arc<AppState>,
    watcher: hyper_util::server::graceful::Watcher,
    (deadline, header_timeout): (tokio::time::Instant, Duration),
    admitted: crate::peers::Admitted,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let headed = Arc::new(AtomicBool::new(false));
    let seen = Arc::clone(&headed);
    let shed = admitted.shed.clone();
    let admitted = Arc::new(admitted);
    let speaker = Arc::clone(&admitted);
    let service = service_fn(move |request| {
        if !seen.swap(true, Ordering::Relaxed) {
            speaker.spoke();
        }
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(route(&state, request, peer).await) }
    });
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(header_timeout);
    builder.http2().timer(TokioTimer::new());
    let connection = watcher.watch(builder.serve_connection(TokioIo::new(stream), service));
    tokio::pin!(connection);
    // The sniff and the first head have no timer of hyper's: this is theirs.
    let ended = tokio::select! {
        ended = &mut connection => ended,
        () = shed.cancelled(), if !headed.load(Ordering::Relaxed) => {
            tracing::debug!(%peer, "shed: silent while every slot was taken");
            return;
        }
        () = tokio::time::sleep_until(deadline) => {
            if !headed.load(Ordering::Relaxed) {
                tracing::debug!(%peer, "no request head within limits.header_timeout; closing");
                return;
            }
            connection.await
        }
    };
    if let Err(err) = ended {
        tracing::debug!(%peer, error = %err, "connection ended with an error");
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
