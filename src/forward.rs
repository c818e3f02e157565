//! Sending a request upstream and shaping the answer for the client: hop-by-hop
//! headers stripped both ways, `Host` rewritten, SSE marked unbuffered.

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{request, Request, Response, Version};

use crate::access_log::RequestLog;
use crate::body::ProxyBody;
use crate::dialect::{DialectKind, ErrorResponse};
use crate::error::ApiError;
use crate::headers::strip_hop_by_hop;
use crate::relay::{Observer, RelayBody};
use crate::upstream::Upstream;
use http_body_util::BodyExt;

/// Forwards `parts` + `body` and relays the answer; errors come back in the API's shape.
pub(crate) async fn forward(
    upstream: &Upstream,
    parts: request::Parts,
    body: ProxyBody,
    log: &mut RequestLog,
) -> Response<ProxyBody> {
    let dialect = DialectKind::for_path(parts.uri.path());
    let request = match upstream_request(upstream, parts.method, &parts.uri, parts.headers, body) {
        Ok(request) => request,
        Err(err) => return err.into_response_for(dialect),
    };
    match send_timed(upstream, request, log).await {
        Ok(response) => relay(upstream, response, None),
        Err(err) => err.into_response_for(dialect),
    }
}

/// Sends `request` upstream and records how long the response head took.
pub(crate) async fn send_timed(
    upstream: &Upstream,
    request: Request<ProxyBody>,
    log: &mut RequestLog,
) -> Result<Response<hyper::body::Incoming>, ApiError> {
    let sent = tokio::time::Instant::now();
    let response = upstream.send(request).await.map_err(|err| {
        tracing::warn!(error = %err, "upstream request failed");
        crate::rescue::upstream(err)
    })?;
    log.set_upstream_time(sent.elapsed());
    Ok(response)
}

/// The request to send upstream: the client's method, path and headers, hop-by-hop and
/// `x-handoff-*` headers removed, `Host` left to the client pool.
pub(crate) fn upstream_request(
    upstream: &Upstream,
    method: http::Method,
    uri: &http::Uri,
    mut headers: http::HeaderMap,
    body: ProxyBody,
) -> Result<Request<ProxyBody>, ApiError> {
    let target = upstream
        .target(uri.path_and_query())
        .map_err(crate::rescue::upstream)?;
    strip_hop_by_hop(&mut headers);
    // The client addressed us; the upstream must see its own host (set by the client pool).
    headers.remove(header::HOST);
    // x-handoff-* headers are addressed to the proxy, not to the provider.
    let ours: Vec<_> = headers
        .keys()
        .filter(|name| name.as_str().starts_with("x-handoff-"))
        .cloned()
        .collect();
    for name in ours {
        headers.remove(name);
    }

    let mut request = Request::new(body);
    *request.method_mut() = method;
    *request.uri_mut() = target;
    // The pool negotiates h2 by ALPN itself; an h2c client must not force h2 on an h1 upstream.
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;
    Ok(request)
}

/// The client's response: the upstream's head (hop-by-hop removed, SSE marked
/// unbuffered) and its body relayed frame by frame.
pub(crate) fn relay(
    upstream: &Upstream,
    response: Response<hyper::body::Incoming>,
    observer: Option<Box<dyn Observer>>,
) -> Response<ProxyBody> {
    let (parts, incoming) = response.into_parts();
    relay_after(upstream, parts, Bytes::new(), incoming, observer)
}

/// Like [`relay`], for a body whose first bytes (`opening`) were already read.
pub(crate) fn relay_after(
    upstream: &Upstream,
    mut parts: http::response::Parts,
    opening: Bytes,
    incoming: hyper::body::Incoming,
    observer: Option<Box<dyn Observer>>,
) -> Response<ProxyBody> {
    strip_hop_by_hop(&mut parts.headers);
    if is_event_stream(&parts.headers) {
        // Tells nginx-style proxies in front of us not to buffer the stream either.
        parts
            .headers
            .insert("x-accel-buffering", HeaderValue::from_static("no"));
        parts
            .headers
            .entry(header::CACHE_CONTROL)
            .or_insert(HeaderValue::from_static("no-cache"));
    }
    let body = RelayBody::after(opening, incoming, upstream.read_timeout(), observer);
    Response::from_parts(parts, body.boxed_unsync())
}

/// True for `text/event-stream` responses.
pub(crate) fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/event-stream"))
}

/// Sends a response whose body was read to inspect it.
pub(crate) fn buffered(mut head: http::response::Parts, body: bytes::Bytes) -> Response<ProxyBody> {
    crate::headers::strip_hop_by_hop(&mut head.headers);
    head.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(head, crate::body::full(body))
}
