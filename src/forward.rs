//! Sending a request upstream and shaping the answer for the client: hop-by-hop
//! headers stripped both ways, `Host` rewritten, SSE marked unbuffered.

use http::header::{self, HeaderValue};
use http::{request, Request, Response, Version};

use crate::access_log::RequestLog;
use crate::body::ProxyBody;
use crate::error::ApiError;
use crate::headers::strip_hop_by_hop;
use crate::relay::{Observer, RelayBody};
use crate::upstream::Upstream;
use http_body_util::BodyExt;

/// Forwards `parts` + `body` and relays the answer; errors come back in the API's shape.
pub async fn forward(
    upstream: &Upstream,
    parts: request::Parts,
    body: ProxyBody,
    mut log: RequestLog,
    mut observer: Option<Box<dyn Observer>>,
) -> Response<ProxyBody> {
    let target = match upstream.target(parts.uri.path_and_query()) {
        Ok(target) => target,
        Err(err) => return reject(log, err.into()),
    };
    let mut headers = parts.headers;
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
    *request.method_mut() = parts.method;
    *request.uri_mut() = target;
    // The pool negotiates h2 by ALPN itself; an h2c client must not force h2 on an h1 upstream.
    *request.version_mut() = Version::HTTP_11;
    *request.headers_mut() = headers;

    let sent = tokio::time::Instant::now();
    let response = match upstream.send(request).await {
        Ok(response) => response,
        Err(err) => {
            tracing::warn!(error = %err, "upstream request failed");
            return reject(log, err.into());
        }
    };
    log.set_upstream_time(sent.elapsed());

    let (mut parts, incoming) = response.into_parts();
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
    log.set_status(parts.status);
    if let Some(observer) = observer.as_mut() {
        observer.on_head(&parts);
    }
    let body = RelayBody::new(incoming, upstream.read_timeout(), log, observer);
    Response::from_parts(parts, body.boxed_unsync())
}

/// Answers `err` to the client and logs the request with its status.
pub fn reject(mut log: RequestLog, err: ApiError) -> Response<ProxyBody> {
    log.set_status(err.status);
    let response = err.into_response();
    drop(log);
    response
}

/// True for `text/event-stream` responses.
pub fn is_event_stream(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("text/event-stream"))
}
