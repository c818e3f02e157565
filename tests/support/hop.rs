//! A recording hop in front of handoff: a real client talks to it, it keeps each
//! request's body exactly as the client sent it and passes the request on, streaming
//! the answer back. What a client sent is then known byte for byte, whatever view
//! handoff forwarded upstream.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::value::RawValue;

/// One request the client sent: its path and body.
#[derive(Clone, Debug)]
pub struct Sent {
    pub path: String,
    pub body: Bytes,
}

impl Sent {
    /// Each message of its list (`messages`, `contents`, or `input` when a list),
    /// exactly as the client wrote it.
    pub fn messages(&self) -> Option<Vec<String>> {
        #[derive(serde::Deserialize)]
        struct Lists {
            messages: Option<Vec<Box<RawValue>>>,
            contents: Option<Vec<Box<RawValue>>>,
            input: Option<Box<RawValue>>,
        }
        let lists: Lists = serde_json::from_slice(&self.body).ok()?;
        let list = match (lists.messages.or(lists.contents), lists.input) {
            (Some(messages), _) => messages,
            (None, Some(input)) => serde_json::from_str(input.get()).ok()?,
            (None, None) => return None,
        };
        Some(list.iter().map(|m| m.get().to_owned()).collect())
    }
}

/// The hop: its address and what it recorded.
pub struct Hop {
    addr: SocketAddr,
    sent: Arc<Mutex<Vec<Sent>>>,
    task: tokio::task::JoinHandle<()>,
}

type Body = BoxBody<Bytes, hyper::Error>;

impl Hop {
    /// A hop on a random loopback port that passes every request on to `target`
    /// (`http://host:port`).
    pub async fn start(target: &str) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sent: Arc<Mutex<Vec<Sent>>> = Arc::default();
        let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
        let target = target.trim_end_matches('/').to_owned();
        let recorded = Arc::clone(&sent);
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let (client, target, recorded) =
                    (client.clone(), target.clone(), Arc::clone(&recorded));
                tokio::spawn(async move {
                    let service = service_fn(move |request: Request<Incoming>| {
                        let (client, target, recorded) =
                            (client.clone(), target.clone(), Arc::clone(&recorded));
                        async move { pass_on(&client, &target, &recorded, request).await }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self { addr, sent, task }
    }

    /// The base URL a client is pointed at.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every request recorded, in the order they arrived.
    pub fn sent(&self) -> Vec<Sent> {
        self.sent.lock().unwrap().clone()
    }
}

impl Drop for Hop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn pass_on(
    client: &Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
    target: &str,
    recorded: &Mutex<Vec<Sent>>,
    request: Request<Incoming>,
) -> Result<Response<Body>, hyper::Error> {
    let (parts, body) = request.into_parts();
    let body = body.collect().await?.to_bytes();
    let path = parts
        .uri
        .path_and_query()
        .map_or("/".to_owned(), |p| p.as_str().to_owned());
    recorded.lock().unwrap().push(Sent {
        path: path.clone(),
        body: body.clone(),
    });
    let mut onward = Request::builder()
        .method(parts.method)
        .uri(format!("{target}{path}"));
    for (name, value) in &parts.headers {
        onward = onward.header(name, value);
    }
    let onward = onward.body(Full::new(body)).unwrap();
    match client.request(onward).await {
        Ok(response) => Ok(response.map(|b| b.boxed())),
        Err(err) => Ok(Response::builder()
            .status(502)
            .body(
                Full::new(Bytes::from(format!("hop: {err}")))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .unwrap()),
    }
}

/// Asserts that `audit replay` of `id` gives, byte for byte, the last request the
/// client sent in that conversation, followed by a reply; returns how many messages
/// that request had. The conversation's requests are those whose first message is the
/// replay's first.
pub fn assert_replay_exact(proxy: &super::Proxy, id: &str, sent: &[Sent]) -> usize {
    assert_replay_exact_but(proxy, id, sent, None)
}

/// As [`assert_replay_exact`], where a redact hook took `redacted`'s matches out: the
/// replay is what the client sent with each match, and nothing else, in place of a
/// marker, the same marker for the same text.
pub fn assert_replay_exact_but(
    proxy: &super::Proxy,
    id: &str,
    sent: &[Sent],
    redacted: Option<&regex::Regex>,
) -> usize {
    let marker = regex::Regex::new(r"\[redacted:[A-Za-z0-9_-]+:[A-Za-z0-9_-]+\]").unwrap();
    let mut pairs = std::collections::HashMap::new();
    let mut same = |got: &str, want: &str| -> bool {
        let Some(redacted) = redacted else {
            return got == want;
        };
        if marker.replace_all(got, "\u{0}") != redacted.replace_all(want, "\u{0}") {
            return false;
        }
        for (text, mark) in redacted
            .find_iter(want)
            .map(|m| m.as_str().to_owned())
            .zip(marker.find_iter(got).map(|m| m.as_str().to_owned()))
        {
            let known = pairs.entry(text.clone()).or_insert_with(|| mark.clone());
            assert_eq!(*known, mark, "{text} got two markers");
        }
        true
    };
    let replay = proxy.replay_raw(&["replay", id]);
    let first = replay.first().map(String::as_str).unwrap_or_default();
    let last = sent
        .iter()
        .rev()
        .filter_map(Sent::messages)
        .find(|messages| messages.first().is_some_and(|m| same(first, m)))
        .unwrap_or_else(|| panic!("no request the client sent opens with {first}"));
    assert!(
        replay.len() > last.len(),
        "the replay ends with a reply: {} messages sent, {} replayed",
        last.len(),
        replay.len()
    );
    for (index, (got, want)) in replay.iter().zip(&last).enumerate() {
        assert!(
            same(got, want),
            "message {index} of the last request is not what the client sent:\n{got}\n{want}"
        );
    }
    if let Some(redacted) = redacted {
        assert!(
            last.iter().any(|m| redacted.is_match(m)),
            "the client sent something to redact"
        );
    }
    last.len()
}

/// The figures of BENCHMARKS' record table for one conversation: requests logged,
/// forms written, bytes on disk per request (all, and forms' share), the pinned sets
/// stored once for the tenant, and the log compressed as `store.compress_after` does.
pub fn record_row(proxy: &super::Proxy, id: &str) -> String {
    let dir = proxy.conversation_dir(id);
    let text = std::fs::read_to_string(dir.join("messages.jsonl")).unwrap();
    let kind = |line: &str| -> String {
        serde_json::from_str::<serde_json::Value>(line)
            .ok()
            .and_then(|v| v["kind"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    let requests = text.lines().filter(|l| kind(l) == "request").count();
    let forms: Vec<&str> = text.lines().filter(|l| kind(l) == "form").collect();
    let form_bytes: usize = forms.iter().map(|l| l.len() + 1).sum();
    // The pinned sets stored once for the tenant: what another conversation opening
    // with them does not write again.
    let blocks: u64 = std::fs::read_dir(dir.join("../../blocks"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    // What store.compress_after makes of it: the log at the store's zstd level.
    let compressed = zstd::encode_all(text.as_bytes(), 9).unwrap().len();
    format!(
        "requests={requests} forms={} bytes_per_request={} form_bytes_per_request={} pinned_block_bytes={blocks} compressed_bytes_per_request={}",
        forms.len(),
        text.len() / requests.max(1),
        form_bytes / requests.max(1),
        compressed / requests.max(1)
    )
}
