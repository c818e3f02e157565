//! The [`ModelClient`] the host gives strategies: summary requests go to the same
//! upstream, on the same path, with the client's own credentials and nothing else of
//! the client's headers.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{ModelCallError, ModelClient, ModelReply};
use http::header::{self, HeaderMap, HeaderValue};
use http::uri::PathAndQuery;
use http::{Method, Request};
use http_body_util::{BodyExt, Limited};
use serde_json::Value;

use crate::body::full;
use crate::config::{Config, ModelApi};
use crate::conversation::ConversationId;
use crate::dialect::{credential_headers, summary_headers, DialectKind};
use crate::store::{Lease, Store};
use crate::upstream::Upstream;

/// A run's summary calls, counted on its compaction lease before each is made: a call
/// is never made on a lease another replica took over (its work could not commit), and
/// the calls of a run that was taken over are known to the run that took it over.
pub struct Tally {
    store: Arc<dyn Store>,
    id: ConversationId,
    lease: Lease,
    made: AtomicU64,
}

impl Tally {
    /// Counts on `lease`, the claim on `id`'s compaction in `store`.
    pub fn new(store: Arc<dyn Store>, id: ConversationId, lease: Lease) -> Self {
        Self {
            store,
            id,
            lease,
            made: AtomicU64::new(0),
        }
    }

    /// Counts one call about to be made; an error when the lease was lost, or the count
    /// cannot be written (then the commit could not be either).
    async fn count(&self) -> Result<(), ModelCallError> {
        match self.store.count_call(&self.id, &self.lease).await {
            Ok(true) => {
                self.made.fetch_add(1, Ordering::SeqCst);
                Ok(())
            }
            Ok(false) => Err(ModelCallError(
                "the compaction lease was taken over; the summary call is not made".into(),
            )),
            Err(err) => Err(ModelCallError(format!(
                "cannot count the summary call on the compaction lease: {err}"
            ))),
        }
    }

    /// The calls counted since the last take.
    pub fn take(&self) -> u64 {
        self.made.swap(0, Ordering::SeqCst)
    }
}

/// A summary client that holds one of the process's summary slots
/// (`compaction.max_summary_concurrency`) for each call: the folds of every compaction
/// together never have more calls in flight. Each call is counted on the run's
/// [`Tally`] first.
pub(crate) struct Bounded {
    inner: Arc<dyn ModelClient>,
    slots: Arc<tokio::sync::Semaphore>,
    tally: Option<Arc<Tally>>,
}

impl Bounded {
    /// `inner`, its calls bounded by `slots` and counted on `tally`.
    pub(crate) fn new(
        inner: Arc<dyn ModelClient>,
        slots: Arc<tokio::sync::Semaphore>,
        tally: Option<Arc<Tally>>,
    ) -> Self {
        Self {
            inner,
            slots,
            tally,
        }
    }
}

impl ModelClient for Bounded {
    fn complete(&self, body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        async move {
            let _slot = self
                .slots
                .acquire()
                .await
                .map_err(|_| ModelCallError("the summary slots are closed".into()))?;
            if let Some(tally) = &self.tally {
                tally.count().await?;
            }
            self.inner.complete(body).await
        }
        .boxed()
    }
}

/// Largest summary reply read.
const MAX_REPLY: usize = 16 * 1024 * 1024;

/// The client summary calls of a `dialect` request go through: to `path` (the
/// request's own; the dialect's when unset) in the dialect's wire format, or to
/// `/v1/chat/completions` in chat completions when the summary model's entry says
/// `api = "chat"` (a self-hosted summariser behind an Anthropic or Responses client).
pub fn summary_client(
    config: &Config,
    summary_model: &str,
    dialect: DialectKind,
    upstream: Upstream,
    path: Option<PathAndQuery>,
    headers: HeaderMap,
) -> std::sync::Arc<dyn ModelClient> {
    let chat = config
        .model(summary_model)
        .is_some_and(|m| m.api == Some(ModelApi::Chat));
    let path = if chat {
        PathAndQuery::from_static("/v1/chat/completions")
    } else {
        // The dialect's path for the summary model: Gemini names it in the path.
        let target = path.as_ref().map(PathAndQuery::as_str);
        dialect
            .get()
            .call_path(summary_model, target)
            .parse()
            .unwrap_or_else(|_| PathAndQuery::from_static(dialect.get().path()))
    };
    let speaks = if chat {
        DialectKind::OpenAiChat
    } else {
        dialect
    };
    let raw: std::sync::Arc<dyn ModelClient> =
        std::sync::Arc::new(UpstreamModelClient::new(upstream, path, headers).speaking(speaks));
    if chat {
        raw
    } else {
        dialect.get().summary_client(raw)
    }
}

/// Calls the upstream as the client would.
pub struct UpstreamModelClient {
    upstream: Upstream,
    /// The wire format its bodies are in: what its spans read usage with.
    dialect: DialectKind,
    path: PathAndQuery,
    headers: HeaderMap,
    /// The credential values it sends: an error reply that echoes one is scrubbed.
    secrets: Vec<String>,
}

impl UpstreamModelClient {
    /// A client posting to `path` with the credential and API headers of the client's
    /// `headers` ([`summary_headers`]), as handoff's own caller.
    pub fn new(upstream: Upstream, path: PathAndQuery, client: HeaderMap) -> Self {
        let mut headers = HeaderMap::new();
        for name in summary_headers() {
            for value in client.get_all(name) {
                headers.append(name, value.clone());
            }
        }
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        headers.insert(
            header::USER_AGENT,
            HeaderValue::from_static(concat!("handoff/", env!("CARGO_PKG_VERSION"))),
        );
        let secrets = credential_headers()
            .into_iter()
            .flat_map(|name| headers.get_all(name))
            .filter_map(|value| value.to_str().ok())
            .map(|value| {
                value
                    .strip_prefix("Bearer ")
                    .unwrap_or(value)
                    .trim()
                    .to_owned()
            })
            .collect();
        Self {
            upstream,
            dialect: DialectKind::OpenAiChat,
            path,
            headers,
            secrets,
        }
    }

    /// The same client, its bodies in `dialect` (chat completions unless told).
    pub fn speaking(mut self, dialect: DialectKind) -> Self {
        self.dialect = dialect;
        self
    }
}

impl ModelClient for UpstreamModelClient {
    fn complete(&self, body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        async move {
            let Some(span) = super::summary_span::open(self.dialect, &body) else {
                return self.call(body).await;
            };
            let started = std::time::Instant::now();
            let cx = span.context().clone();
            let answer = opentelemetry::context::FutureExt::with_context(self.call(body), cx).await;
            super::summary_span::answered(span, self.dialect, &answer, started.elapsed());
            answer
        }
        .boxed()
    }
}

impl UpstreamModelClient {
    /// One call: the body posted, the answer read.
    async fn call(&self, body: Value) -> Result<ModelReply, ModelCallError> {
        {
            let target = self
                .upstream
                .target(Some(&self.path))
                .map_err(|err| ModelCallError(err.to_string()))?;
            let mut request = Request::new(full(Bytes::from(body.to_string())));
            *request.method_mut() = Method::POST;
            *request.uri_mut() = target;
            *request.headers_mut() = self.headers.clone();
            let response = self
                .upstream
                .send(request)
                .await
                .map_err(|err| ModelCallError(err.to_string()))?;
            let status = response.status().as_u16();
            let bytes = Limited::new(response.into_body(), MAX_REPLY)
                .collect()
                .await
                .map_err(|err| ModelCallError(format!("reading the summary reply: {err}")))?
                .to_bytes();
            let mut body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if status >= 400 {
                // An error may quote the credential it refused ("Invalid credential <key>").
                crate::redact::scrub_json(&mut body, &self.secrets);
            }
            Ok(ModelReply { status, body })
        }
    }
}
