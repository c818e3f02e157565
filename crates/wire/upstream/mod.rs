//! The connection to the provider: a pool of connections per worker, rustls for HTTPS
//! with HTTP/2 by ALPN, `TCP_NODELAY` on every socket, and the timeouts that turn a
//! stuck upstream into a 504 instead of a hung client.

mod pool;

use std::sync::Arc;
use std::time::Duration;

use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Request, Response, Uri};
use hyper::body::Incoming;
use hyper_util::client::legacy::connect::HttpConnector;

use pool::{Connector, Pool, SendError};

use crate::body::ProxyBody;
use crate::config::UpstreamConfig;

/// Why a request to the upstream failed before a response head arrived.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The base URL or the joined target is not a valid URI.
    #[error("invalid upstream target {target}: {reason}")]
    BadTarget {
        /// The target that failed to parse.
        target: String,
        /// The parser's complaint.
        reason: String,
    },
    /// No connection could be made.
    #[error("upstream {authority} is unreachable: {reason}")]
    Unreachable {
        /// Host and port.
        authority: String,
        /// The innermost cause.
        reason: String,
    },
    /// Connecting took longer than `upstream.connect_timeout`.
    #[error("upstream {authority} did not accept a connection within {timeout:?}")]
    ConnectTimeout {
        /// Host and port.
        authority: String,
        /// The limit that passed.
        timeout: Duration,
    },
    /// The response head took longer than `upstream.read_timeout`.
    #[error("upstream {authority} sent no response within {timeout:?}")]
    ReadTimeout {
        /// Host and port.
        authority: String,
        /// The limit that passed.
        timeout: Duration,
    },
}

/// Pooled connections to one base URL.
#[derive(Clone)]
pub struct Upstream {
    /// One pool per worker thread: a connection is driven by the runtime that uses it,
    /// so a request never wakes another thread to reach the provider.
    pools: Arc<[Pool]>,
    connector: Connector,
    scheme: Scheme,
    authority: Authority,
    /// `Host` for HTTP/1.1: the authority without credentials, as a header.
    host: HeaderValue,
    // Host and port only: the authority may carry credentials, which no error shows.
    shown: String,
    prefix: String,
    connect_timeout: Duration,
    read_timeout: Duration,
    /// The key this upstream is sent in place of the client's: `Authorization: Bearer`
    /// and Anthropic's bare `x-api-key` forms.
    key: Option<(HeaderValue, HeaderValue)>,
}

impl Upstream {
    /// The same upstream, sent `key` (this host's own) in place of the client's.
    pub fn with_key(mut self, key: Option<&str>) -> Result<Self, UpstreamError> {
        self.key = match key {
            None => None,
            Some(value) => {
                let sensitive = |text: String| {
                    let mut header =
                        HeaderValue::try_from(text).map_err(|_| UpstreamError::BadTarget {
                            target: self.shown.clone(),
                            reason: "its key is not a valid header value".into(),
                        })?;
                    header.set_sensitive(true);
                    Ok::<_, UpstreamError>(header)
                };
                Some((
                    sensitive(format!("Bearer {value}"))?,
                    sensitive(value.to_owned())?,
                ))
            }
        };
        Ok(self)
    }

    /// This upstream's own key, as `(Authorization value, bare key)`.
    pub fn key(&self) -> Option<&(HeaderValue, HeaderValue)> {
        self.key.as_ref()
    }

    /// True when `other` is the same scheme, host and port: a key may go to both.
    pub fn same_origin(&self, other: &Upstream) -> bool {
        self.scheme == other.scheme
            && self.authority.host() == other.authority.host()
            && self.authority.port_u16() == other.authority.port_u16()
    }
    /// Builds the pools for `config`, trusting the Web PKI's roots.
    pub fn new(config: &UpstreamConfig) -> Result<Self, UpstreamError> {
        let tls = hyper_rustls::HttpsConnectorBuilder::new().with_webpki_roots();
        Self::build(config, tls)
    }

    /// Builds the pools for `config`, with `tls` for HTTPS.
    fn build(
        config: &UpstreamConfig,
        tls: hyper_rustls::HttpsConnectorBuilder<hyper_rustls::builderstates::WantsSchemes>,
    ) -> Result<Self, UpstreamError> {
        let bad = |reason: String| UpstreamError::BadTarget {
            target: crate::redact::shown_url(&config.base_url).into_owned(),
            reason,
        };
        let base: Uri = config
            .base_url
            .parse()
            .map_err(|err| bad(format!("{err}")))?;
        let scheme = base
            .scheme()
            .cloned()
            .ok_or_else(|| bad("no scheme".into()))?;
        let authority = base
            .authority()
            .cloned()
            .ok_or_else(|| bad("no host".into()))?;
        let prefix = base.path().trim_end_matches('/').to_owned();

        let mut http = HttpConnector::new();
        // Nagle + delayed ACK adds ~40 ms per streamed frame; LLM streams are many tiny writes.
        http.set_nodelay(true);
        http.enforce_http(false);
        http.set_connect_timeout(Some(config.connect_timeout));
        let connector = tls
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let pools = (0..crate::worker::count())
            .map(|_| Pool::new(IDLE_TIMEOUT))
            .collect();
        let shown = match authority.port() {
            Some(port) => format!("{}:{port}", authority.host()),
            None => authority.host().to_owned(),
        };
        let host = HeaderValue::try_from(shown.as_str())
            .map_err(|err| bad(format!("its host is not a header value: {err}")))?;
        Ok(Self {
            pools,
            connector,
            scheme,
            authority,
            host,
            shown,
            prefix,
            connect_timeout: config.connect_timeout,
            read_timeout: config.read_timeout,
            key: None,
        })
    }

    /// The calling worker's pool.
    fn pool(&self) -> &Pool {
        &self.pools[crate::worker::index() % self.pools.len()]
    }

    /// The time allowed between two body frames.
    pub fn read_timeout(&self) -> Duration {
        self.read_timeout
    }

    /// The upstream URI for a client's path and query: the base URL's path, then the client's.
    pub fn target(&self, client: Option<&PathAndQuery>) -> Result<Uri, UpstreamError> {
        let bad = |target: String, reason: String| UpstreamError::BadTarget { target, reason };
        let path = match client {
            // The usual base URL has no path: the client's is used as it is, a shared
            // slice, neither formatted nor parsed again.
            Some(path) if self.prefix.is_empty() => path.clone(),
            _ => {
                let joined = format!(
                    "{}{}",
                    self.prefix,
                    client.map_or("/", PathAndQuery::as_str)
                );
                PathAndQuery::try_from(joined.as_str())
                    .map_err(|err| bad(joined.clone(), err.to_string()))?
            }
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path);
        Uri::from_parts(parts).map_err(|err| bad(self.shown.clone(), err.to_string()))
    }

    /// `server.address` and `server.port`, for the span of a request sent here.
    fn server_attributes(&self) -> Vec<opentelemetry::KeyValue> {
        use crate::telemetry::spans::attr;
        let default = if self.scheme == Scheme::HTTPS {
            443
        } else {
            80
        };
        let port = self.authority.port_u16().unwrap_or(default);
        vec![
            opentelemetry::KeyValue::new(attr::SERVER_ADDRESS, self.authority.host().to_owned()),
            opentelemetry::KeyValue::new(attr::SERVER_PORT, i64::from(port)),
        ]
    }

    /// Sends `request` and waits for the response head within `read_timeout`.
    pub async fn send(
        &self,
        mut request: Request<ProxyBody>,
    ) -> Result<Response<Incoming>, UpstreamError> {
        // A traced request's next hop is a child of handoff's span.
        crate::telemetry::spans::inject(request.headers_mut());
        crate::telemetry::spans::note(|| self.server_attributes());
        let sent = self.pool().send(&self.connector, &self.host, request);
        match tokio::time::timeout(self.read_timeout, sent).await {
            Err(_) => Err(UpstreamError::ReadTimeout {
                authority: self.shown.clone(),
                timeout: self.read_timeout,
            }),
            Ok(Ok(response)) => Ok(response),
            Ok(Err(SendError::Connect(err))) if is_timeout(&*err) => {
                Err(UpstreamError::ConnectTimeout {
                    authority: self.shown.clone(),
                    timeout: self.connect_timeout,
                })
            }
            Ok(Err(SendError::Connect(err))) => Err(UpstreamError::Unreachable {
                authority: self.shown.clone(),
                reason: innermost(&*err),
            }),
            Ok(Err(SendError::Exchange(err))) => Err(UpstreamError::Unreachable {
                authority: self.shown.clone(),
                reason: innermost(&err),
            }),
        }
    }
}

/// What an upstream answered a protocol upgrade.
pub enum Upgrade {
    /// `101 Switching Protocols`: the connection, now the new protocol's.
    Switched(hyper::upgrade::Upgraded),
    /// Any other answer (or an h2 connection, which upgrades no HTTP/1.1 way): the
    /// upstream does not serve the protocol there.
    Refused(http::StatusCode),
}

impl Upstream {
    /// Sends `request` (a `GET` asking to upgrade) on a connection of its own, outside
    /// the pool, over HTTP/1.1, and hands over the connection when the upstream
    /// switches: a WebSocket to the upstream.
    pub async fn upgrade(&self, mut request: Request<ProxyBody>) -> Result<Upgrade, UpstreamError> {
        crate::telemetry::spans::inject(request.headers_mut());
        use hyper::client::conn::http1;
        use tower_service::Service;
        let target = request.uri().clone();
        let unreachable = |reason: String| UpstreamError::Unreachable {
            authority: self.shown.clone(),
            reason,
        };
        let opened = async {
            let mut connector = self.connector.clone();
            std::future::poll_fn(|cx| connector.poll_ready(cx))
                .await
                .map_err(|err| unreachable(innermost(&*err)))?;
            let stream = connector
                .call(target.clone())
                .await
                .map_err(|err| unreachable(innermost(&*err)))?;
            if hyper_util::client::legacy::connect::Connection::connected(&stream)
                .is_negotiated_h2()
            {
                return Ok(Upgrade::Refused(
                    http::StatusCode::HTTP_VERSION_NOT_SUPPORTED,
                ));
            }
            let (mut sender, connection) = http1::handshake(stream)
                .await
                .map_err(|err| unreachable(innermost(&err)))?;
            tokio::spawn(async move {
                if let Err(err) = connection.with_upgrades().await {
                    tracing::debug!(error = %err, "upstream upgrade connection ended");
                }
            });
            let mut request = request;
            let mut parts = http::uri::Parts::default();
            parts.path_and_query = target.path_and_query().cloned();
            if let Ok(origin) = Uri::from_parts(parts) {
                *request.uri_mut() = origin;
            }
            request
                .headers_mut()
                .insert(http::header::HOST, self.host.clone());
            let response = sender
                .send_request(request)
                .await
                .map_err(|err| unreachable(innermost(&err)))?;
            if response.status() != http::StatusCode::SWITCHING_PROTOCOLS {
                return Ok(Upgrade::Refused(response.status()));
            }
            let upgraded = hyper::upgrade::on(response)
                .await
                .map_err(|err| unreachable(innermost(&err)))?;
            Ok(Upgrade::Switched(upgraded))
        };
        match tokio::time::timeout(self.connect_timeout + self.read_timeout, opened).await {
            Ok(result) => result,
            Err(_) => Err(UpstreamError::ConnectTimeout {
                authority: self.shown.clone(),
                timeout: self.connect_timeout,
            }),
        }
    }
}

/// How long a connection may idle in its pool before it is closed, not reused.
const IDLE_TIMEOUT: Duration = Duration::from_secs(90);

fn is_timeout(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(err);
    while let Some(cause) = source {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::TimedOut {
                return true;
            }
        }
        source = cause.source();
    }
    false
}

/// The deepest cause's message, e.g. "Connection refused (os error 111)".
fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut current = err;
    while let Some(next) = current.source() {
        current = next;
    }
    current.to_string()
}

#[cfg(test)]
mod tests;
