//! A plain hyper client for tests: full control over headers, and frame timing.

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// A response read whole.
#[derive(Debug)]
pub struct Whole {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Whole {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|err| {
            panic!("not JSON ({err}): {}", String::from_utf8_lossy(&self.body))
        })
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn client(http2: bool) -> Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>> {
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(http2);
    builder.build_http()
}

/// Builds a request with `headers`.
pub fn request(
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: impl Into<Bytes>,
) -> Request<Full<Bytes>> {
    let mut builder = Request::builder().method(method).uri(url);
    for (name, value) in headers {
        builder = builder.header(*name, *value);
    }
    builder.body(Full::new(body.into())).unwrap()
}

/// Sends and reads the whole response.
pub async fn send(req: Request<Full<Bytes>>) -> Whole {
    send_with(req, false).await
}

/// Sends over HTTP/1.1 or prior-knowledge h2 and reads the whole response.
pub async fn send_with(req: Request<Full<Bytes>>, http2: bool) -> Whole {
    send_within(req, http2, Duration::from_secs(30)).await
}

/// Sends and reads the whole response, failing after `limit`.
pub async fn send_within(req: Request<Full<Bytes>>, http2: bool, limit: Duration) -> Whole {
    let response = tokio::time::timeout(limit, client(http2).request(req))
        .await
        .expect("response within the time limit")
        .expect("response");
    let (parts, body) = response.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    Whole {
        status: parts.status,
        headers: parts.headers,
        body,
    }
}

/// Sends and reads the whole response; `None` when the connection fails or the answer
/// takes longer than `limit` (a server killed or stopped mid-request).
pub async fn try_send(req: Request<Full<Bytes>>, limit: Duration) -> Option<Whole> {
    let response = tokio::time::timeout(limit, client(false).request(req))
        .await
        .ok()?
        .ok()?;
    let (parts, body) = response.into_parts();
    let body = tokio::time::timeout(limit, body.collect())
        .await
        .ok()?
        .ok()?
        .to_bytes();
    Some(Whole {
        status: parts.status,
        headers: parts.headers,
        body,
    })
}

/// POSTs JSON to `url` and reads the whole response.
pub async fn post_json(url: &str, body: &serde_json::Value) -> Whole {
    send(request(
        "POST",
        url,
        &[("content-type", "application/json")],
        body.to_string(),
    ))
    .await
}

/// A streamed response: frames with their arrival times, and how the stream ended.
pub struct Streamed {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub frames: Vec<(Instant, Bytes)>,
    pub error: Option<String>,
}

impl Streamed {
    pub fn text(&self) -> String {
        self.frames
            .iter()
            .map(|(_, b)| String::from_utf8_lossy(b))
            .collect()
    }
}

/// Sends and collects frames as they arrive, stopping after `max_frames` if given.
pub async fn stream(req: Request<Full<Bytes>>, max_frames: Option<usize>) -> Streamed {
    let response = client(false).request(req).await.expect("response");
    let (parts, mut body) = response.into_parts();
    let mut frames = Vec::new();
    let mut error = None;
    loop {
        if max_frames.is_some_and(|max| frames.len() >= max) {
            break;
        }
        match tokio::time::timeout(Duration::from_secs(30), body.frame()).await {
            Err(_) => panic!("no frame within 30s"),
            Ok(None) => break,
            Ok(Some(Err(err))) => {
                error = Some(err.to_string());
                break;
            }
            Ok(Some(Ok(frame))) => {
                if let Ok(data) = frame.into_data() {
                    frames.push((Instant::now(), data));
                }
            }
        }
    }
    Streamed {
        status: parts.status,
        headers: parts.headers,
        frames,
        error,
    }
}
