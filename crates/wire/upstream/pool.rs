//! One worker's connections to one upstream: HTTP/1.1 connections each carrying one
//! request at a time, or one h2 connection carrying them all, each driven by the
//! runtime that opened it.
//!
//! hyper-util's pooled client did the same work through a pool-wide key hashed per
//! request, a checkout future raced against a connect future, the URI rebuilt, and a
//! task spawned per response to watch its connection go idle: 15k of the 43k
//! instructions a small request costs `bench-floor` (BENCHMARKS, sixteenth session).
//! Here a connection stays in its worker's list while it is in use, and a request takes
//! the first one hyper says is ready: HTTP/1.1's `SendRequest` is ready again once the
//! connection has read the last response whole and waits for the next request.
//!
//! A connection idle past the pool's timeout is closed when a later request meets it.
//! One that no request meets again ends when the upstream closes it (providers close
//! idle connections themselves), or when its pool is dropped with the config it was
//! built for.

use std::future::poll_fn;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use futures_util::future::Either;
use http::uri::{Parts, Uri};
use http::{header, HeaderValue, Request, Response};
use hyper::body::Incoming;
use hyper::client::conn::{http1, http2};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::{Connection, HttpConnector};
use hyper_util::rt::TokioExecutor;
use tower_service::Service;

use crate::body::ProxyBody;

/// How handoff reaches an upstream: TCP with `TCP_NODELAY`, then TLS by the URI's scheme.
pub(crate) type Connector = HttpsConnector<HttpConnector>;

/// Requests sent again, on another connection, when the one taken turned out closed
/// before a byte of them was written (the upstream dropped it while it was idle).
const RETRIES: usize = 3;

/// Why a request got no response head.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SendError {
    /// No connection could be opened.
    #[error("{0}")]
    Connect(Box<dyn std::error::Error + Send + Sync>),
    /// The connection failed while the request was sent or its head awaited.
    #[error("{0}")]
    Exchange(#[from] hyper::Error),
}

/// A connection in the pool, in use or idle.
struct Open<S> {
    sender: S,
    /// When it last took a request: an idle connection older than the pool's idle
    /// timeout is closed rather than reused.
    used: Instant,
}

#[derive(Default)]
struct Connections {
    http1: Vec<Open<http1::SendRequest<ProxyBody>>>,
    http2: Option<Open<http2::SendRequest<ProxyBody>>>,
}

/// A connection a request may go on now.
enum Ready<'a> {
    /// The h2 connection, shared.
    Http2(http2::SendRequest<ProxyBody>),
    /// An idle HTTP/1.1 connection, in its list.
    Http1(&'a mut http1::SendRequest<ProxyBody>),
}

impl Connections {
    /// Keeps `sender` as the h2 connection, unless another request opened one meanwhile
    /// that is still open.
    fn keep_http2(&mut self, sender: http2::SendRequest<ProxyBody>) {
        if self
            .http2
            .as_ref()
            .is_none_or(|open| open.sender.is_closed())
        {
            self.http2 = Some(Open {
                sender,
                used: Instant::now(),
            });
        }
    }

    /// A connection a request may go on now; closed connections, and those idle past
    /// `idle_timeout`, leave the list on the way.
    fn ready(&mut self, now: Instant, idle_timeout: Duration) -> Option<Ready<'_>> {
        if let Some(http2) = &mut self.http2 {
            // h2 carries any number of requests: it is idle only if none came lately.
            let expired = now.duration_since(http2.used) > idle_timeout;
            if !(http2.sender.is_closed() || expired) {
                http2.used = now;
                return Some(Ready::Http2(http2.sender.clone()));
            }
            self.http2 = None;
        }
        self.http1.retain(|open| {
            let expired = open.sender.is_ready() && now.duration_since(open.used) > idle_timeout;
            !(open.sender.is_closed() || expired)
        });
        let open = self
            .http1
            .iter_mut()
            .rev()
            .find(|open| open.sender.is_ready())?;
        open.used = now;
        Some(Ready::Http1(&mut open.sender))
    }
}

/// One worker's connections to one upstream.
pub(super) struct Pool {
    connections: Mutex<Connections>,
    idle_timeout: Duration,
}

impl Pool {
    /// An empty pool whose connections idle at most `idle_timeout`.
    pub(super) fn new(idle_timeout: Duration) -> Self {
        Self {
            connections: Mutex::new(Connections::default()),
            idle_timeout,
        }
    }

    // Nothing that can panic runs under the lock, so a poisoned one still holds a
    // list that is whole.
    fn lock(&self) -> MutexGuard<'_, Connections> {
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends `request` (its URI absolute) on a ready connection, opening one through
    /// `connector` when none is; `host` is the upstream's `Host` header for HTTP/1.1.
    pub(super) async fn send(
        &self,
        connector: &Connector,
        host: &HeaderValue,
        mut request: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, SendError> {
        let target = request.uri().clone();
        for _ in 0..RETRIES {
            // Handed to the connection under the lock, so no other request takes it;
            // the futures borrow nothing, and are awaited after it.
            let exchange = match self.lock().ready(Instant::now(), self.idle_timeout) {
                Some(Ready::Http2(mut http2)) => {
                    Either::Left(http2.try_send_request(absolute(request, &target)))
                }
                Some(Ready::Http1(http1)) => {
                    Either::Right(http1.try_send_request(origin(request, host)))
                }
                None => break,
            };
            match exchange.await {
                Ok(response) => return Ok(response),
                // Closed under the request before a byte of it was written: it goes
                // on the next connection.
                Err(mut failed) => match failed.take_message() {
                    Some(unsent) => request = unsent,
                    None => return Err(failed.into_error().into()),
                },
            }
        }
        // Boxed: opening a connection (TLS, the h2 handshake) is a future of kilobytes,
        // which every request's future would otherwise carry and move.
        Box::pin(self.start_on_new(connector, &target, host, request)).await
    }

    /// Opens a connection, sends `request` on it, and keeps it for the requests after.
    async fn start_on_new(
        &self,
        connector: &Connector,
        target: &Uri,
        host: &HeaderValue,
        request: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, SendError> {
        let mut connector = connector.clone();
        poll_fn(|cx| connector.poll_ready(cx))
            .await
            .map_err(SendError::Connect)?;
        let stream = connector
            .call(target.clone())
            .await
            .map_err(SendError::Connect)?;
        if stream.connected().is_negotiated_h2() {
            let (mut sender, connection) = http2::handshake(TokioExecutor::new(), stream).await?;
            tokio::spawn(drive(connection));
            let response = sender.send_request(absolute(request, target));
            self.lock().keep_http2(sender);
            return Ok(response.await?);
        }
        let (mut sender, connection) = http1::handshake(stream).await?;
        tokio::spawn(drive(connection));
        let response = sender.send_request(origin(request, host));
        self.lock().http1.push(Open {
            sender,
            used: Instant::now(),
        });
        Ok(response.await?)
    }
}

/// Runs a connection until it closes: the upstream ends it, it idles out, or every
/// sender for it is dropped.
async fn drive<F>(connection: F)
where
    F: std::future::Future<Output = Result<(), hyper::Error>>,
{
    if let Err(err) = connection.await {
        tracing::debug!(error = %err, "upstream connection ended");
    }
}

/// `request` addressed as HTTP/1.1 to a server, not a proxy, expects: its path and
/// query alone, and the upstream's `Host`.
fn origin(mut request: Request<ProxyBody>, host: &HeaderValue) -> Request<ProxyBody> {
    if request.uri().scheme().is_some() {
        let mut parts = Parts::default();
        parts.path_and_query = request.uri().path_and_query().cloned();
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
    }
    request
        .headers_mut()
        .entry(header::HOST)
        .or_insert_with(|| host.clone());
    request
}

/// `request` addressed as h2 expects: the whole URI, which gives `:scheme` and
/// `:authority`, and no `Host`.
fn absolute(mut request: Request<ProxyBody>, target: &Uri) -> Request<ProxyBody> {
    request.headers_mut().remove(header::HOST);
    *request.uri_mut() = target.clone();
    *request.version_mut() = http::Version::HTTP_2;
    request
}
