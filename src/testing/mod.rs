//! The in-process harness: the real router over an [`AppState`] with a memory store
//! and one token counter shared by every test (its tables load once per test
//! binary), served on a loopback port in the test's own runtime, against
//! `mock-upstream`'s in-process provider. No process is started and nothing touches
//! disk, so a test costs milliseconds, and `#[tokio::test(start_paused = true)]`
//! makes time-outs and back-offs instant.
//!
//! Tests that need a process (the CLI, signals, `kill -9`, TLS, real clients) start
//! the binary instead (`tests/support`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::net::TcpListener;

use crate::auth::Secrets;
use crate::base::record::CompactionRecord;
use crate::conversation::ConversationId;
use crate::state::AppState;
use crate::store::ConversationLog;
use crate::tokens::Tokens;

mod anthropic;
mod batches;
mod cache_breakpoint;
mod compaction;
mod cost;
mod decisions;
mod gemini;
mod hook_queue;
mod hooks;
mod hooks_everywhere;
mod limits;
mod passthrough;
mod pins;
mod provider_compaction;
mod redaction;
mod responses;
mod served_asks;
mod served_compaction;
mod socket;
mod stub_dialect;
mod team;
mod tracing;
mod tracking;
mod unchained;

/// The hex SHA-256 of `text`: what a `[[auth.keys]]` entry names a key by.
pub(crate) fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The counter every in-process test shares.
pub(crate) fn tokens() -> Arc<Tokens> {
    static TOKENS: OnceLock<Arc<Tokens>> = OnceLock::new();
    Arc::clone(TOKENS.get_or_init(|| Arc::new(Tokens::new(crate::dialect::text::message_text))))
}

/// Six user turns of about 1,500 tokens, each stating a fact and answered by
/// `reply`, then a question: a history that overflows a small window.
pub(crate) fn fact_history(reply: Value) -> Vec<Value> {
    let filler: String = (0..600).map(|i| format!("w{i} ")).collect();
    let mut messages = Vec::new();
    for n in 0..6 {
        messages
            .push(serde_json::json!({"role": "user", "content": format!("FACT-{n:03} {filler}")}));
        messages.push(reply.clone());
    }
    messages.push(serde_json::json!({"role": "user", "content": "what were the facts?"}));
    messages
}

/// The history a reconnecting client sends at once: `turns` user turns of about
/// `tokens` tokens, each stating a fact, each answered.
pub(crate) fn long_history(turns: usize, tokens: usize) -> Vec<Value> {
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    for n in 0..turns {
        let filler: Vec<String> = (0..tokens / 2).map(|i| format!("w{i}")).collect();
        messages
            .push(serde_json::json!({"role": "user", "content": format!("FACT-{n:03} {}", filler.join(" "))}));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("noted {n}")}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "What were the facts?"}));
    messages
}

/// `extra` (TOML) with `upstream.base_url` set to `upstream`.
pub(crate) fn config_text(upstream: &str, extra: &str) -> String {
    if extra.contains("[upstream]") {
        extra.replacen(
            "[upstream]",
            &format!("[upstream]\nbase_url = {upstream:?}"),
            1,
        )
    } else {
        format!("{extra}\n[upstream]\nbase_url = {upstream:?}\n")
    }
}

/// The router, serving in this runtime; it stops when dropped.
pub(crate) struct Harness {
    /// The state the router runs on: its tracker, store and metrics can be read.
    pub state: Arc<AppState>,
    addr: SocketAddr,
    client: Client<HttpConnector, Full<Bytes>>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

/// One answer, read whole.
#[derive(Debug)]
pub(crate) struct Answer {
    /// The status.
    pub status: StatusCode,
    /// The body, as far as it came.
    pub body: Bytes,
    /// Why the body ended before its end, when it did: the client saw a cut.
    pub cut: Option<String>,
}

impl Answer {
    /// The body as JSON (`Null` when it is not).
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The body as text.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

impl Harness {
    /// Starts the router with the embedded default config, `extra` on top, and
    /// `upstream` as the provider; the key variables it names are read from the
    /// environment.
    pub(crate) async fn start(upstream: &str, extra: &str) -> Self {
        Self::start_with(upstream, extra, Secrets::default()).await
    }

    /// Like [`Self::start`], the key variables the config names read from `secrets`
    /// (tests run at once in one environment, each with keys of its own).
    pub(crate) async fn start_with(upstream: &str, extra: &str, secrets: Secrets) -> Self {
        let config = crate::config::from_toml(&config_text(upstream, extra)).unwrap();
        let state = Arc::new(AppState::in_memory(config, tokens(), secrets).unwrap());
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = Arc::clone(&state);
        tokio::spawn(async move {
            loop {
                let (stream, peer) = tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok(pair) => pair,
                        Err(_) => continue,
                    },
                    _ = &mut stopped => return,
                };
                let state = Arc::clone(&serving);
                tokio::spawn(async move {
                    let service = service_fn(move |request| {
                        let state = Arc::clone(&state);
                        async move {
                            Ok::<_, Infallible>(crate::router::route(&state, request, peer).await)
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .with_upgrades()
                        .await;
                });
            }
        });
        let client = Client::builder(TokioExecutor::new()).build_http();
        Self {
            state,
            addr,
            client,
            _stop: stop,
        }
    }

    /// The loopback address it listens on, for a client that writes its own bytes.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT`.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Posts `body` to `path` with `headers` (and a JSON content type).
    pub(crate) async fn post(&self, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Answer {
        let mut request = Request::post(format!("{}{path}", self.url()))
            .header(http::header::CONTENT_TYPE, "application/json");
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let request = request
            .body(Full::new(Bytes::copy_from_slice(body)))
            .unwrap();
        self.send(request).await
    }

    /// Posts `body` to `path` with `key` in every API's credential header (OpenAI's
    /// bearer, Anthropic's `x-api-key`, Gemini's `x-goog-api-key`).
    pub(crate) async fn post_as(&self, path: &str, key: &str, body: &Value) -> Answer {
        let bearer = format!("Bearer {key}");
        let headers = [
            ("authorization", bearer.as_str()),
            ("x-api-key", key),
            ("x-goog-api-key", key),
        ];
        self.post(path, &headers, body.to_string().as_bytes()).await
    }

    /// A chat-completions request of `model` with `messages`, in conversation `id`.
    pub(crate) async fn chat(&self, id: &str, model: &str, messages: &[Value]) -> Answer {
        let body = serde_json::json!({"model": model, "messages": messages});
        self.post(
            "/v1/chat/completions",
            &[
                (crate::base::id::CONVERSATION_HEADER, id),
                ("authorization", "Bearer sk-test"),
            ],
            body.to_string().as_bytes(),
        )
        .await
    }

    /// The log of conversation `id` (of any tenant), read from the store.
    pub(crate) async fn log(&self, id: &str) -> ConversationLog {
        self.find_log(id)
            .await
            .unwrap_or_else(|| panic!("no conversation {id}"))
    }

    /// The compaction records of conversation `id`, in order (none before it exists).
    pub(crate) async fn records(&self, id: &str) -> Vec<CompactionRecord> {
        self.find_log(id)
            .await
            .map(|log| log.compactions)
            .unwrap_or_default()
    }

    /// Every conversation of every tenant (the first thousand).
    pub(crate) async fn conversations(&self) -> Vec<ConversationId> {
        self.state
            .tracker
            .store()
            .list(None, None, 1000)
            .await
            .unwrap()
    }

    /// Conversation `id` of any tenant, if it exists.
    pub(crate) async fn conversation(&self, id: &str) -> Option<ConversationId> {
        let ids = self.conversations().await;
        ids.into_iter().find(|found| found.as_str() == id)
    }

    /// The log of conversation `id` of any tenant, if it exists.
    async fn find_log(&self, id: &str) -> Option<ConversationLog> {
        let found = self.conversation(id).await?;
        Some(self.state.tracker.store().read(&found).await.unwrap())
    }

    /// What `handoff audit VERB` prints for conversation `id` (of any tenant): `run`
    /// is the verb, given the id and its tenant; an audit that fails panics.
    pub(crate) async fn audit<F>(&self, id: &str, run: F) -> String
    where
        F: FnOnce(
                &crate::audit::Audit,
                &str,
                &str,
                &mut Vec<u8>,
            ) -> Result<(), crate::audit::AuditError>
            + Send
            + 'static,
    {
        let id = self
            .conversation(id)
            .await
            .unwrap_or_else(|| panic!("no conversation {id}"));
        self.audit_all(move |audit, out| run(audit, id.as_str(), id.tenant().as_str(), out))
            .await
    }

    /// What an `audit` verb over every conversation prints (`list`, `verify` without
    /// an id); an audit that fails panics.
    pub(crate) async fn audit_all<F>(&self, run: F) -> String
    where
        F: FnOnce(&crate::audit::Audit, &mut Vec<u8>) -> Result<(), crate::audit::AuditError>
            + Send
            + 'static,
    {
        let store = Arc::clone(self.state.tracker.store());
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || {
            let mut out = Vec::new();
            let audit = crate::audit::Audit::new(store, runtime);
            run(&audit, &mut out).unwrap_or_else(|err| panic!("audit: {err}"));
            String::from_utf8(out).unwrap()
        })
        .await
        .unwrap()
    }

    /// `GET path` (and query), read whole.
    pub(crate) async fn get(&self, path: &str) -> Answer {
        let uri = format!("{}{path}", self.url());
        match Request::get(uri).body(Full::default()) {
            Ok(request) => self.send(request).await,
            Err(err) => panic!("a GET of {path}: {err}"),
        }
    }

    /// What `GET /handoff/metrics` shows.
    pub(crate) async fn metrics(&self) -> String {
        self.get("/handoff/metrics").await.text()
    }

    /// Conversation `id`'s timeline, as the web view reads it.
    pub(crate) async fn timeline(&self, id: &str) -> serde_json::Value {
        self.get(&format!("/handoff/conversations/{id}/timeline"))
            .await
            .json()
    }

    /// Sends `request` and reads the whole answer.
    pub(crate) async fn send(&self, request: Request<Full<Bytes>>) -> Answer {
        let response = self.client.request(request).await.unwrap();
        let (parts, mut body) = response.into_parts();
        let mut read = Vec::new();
        let mut cut = None;
        while let Some(frame) = body.frame().await {
            match frame {
                Ok(frame) => {
                    if let Some(data) = frame.data_ref() {
                        read.extend_from_slice(data);
                    }
                }
                Err(err) => {
                    cut = Some(err.to_string());
                    break;
                }
            }
        }
        Answer {
            status: parts.status,
            body: Bytes::from(read),
            cut,
        }
    }
}
