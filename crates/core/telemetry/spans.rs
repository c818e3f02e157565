//! Spans, as every layer makes them: a request traced by OpenTelemetry carries a
//! [`Tracing`] in its current [`Context`], and a layer that does something worth a span
//! (a compaction, a summary call, a hook) starts a [`Child`] of the current span from
//! it. A request not traced carries none, and costs a thread-local read.
//!
//! The SDK, its sampler and its exporter live in the binary; this module knows only
//! the OpenTelemetry API, so the engine and the wire layers need nothing more.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::Histogram;
use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};

/// The attribute names handoff sets: the GenAI semantic conventions', then its own.
pub mod attr {
    /// `chat`, `embeddings`, …
    pub const OPERATION: &str = "gen_ai.operation.name";
    /// `openai`, `anthropic`, `gcp.gemini`.
    pub const PROVIDER: &str = "gen_ai.provider.name";
    /// The model the request named.
    pub const REQUEST_MODEL: &str = "gen_ai.request.model";
    /// The model the reply named.
    pub const RESPONSE_MODEL: &str = "gen_ai.response.model";
    /// The reply's id.
    pub const RESPONSE_ID: &str = "gen_ai.response.id";
    /// Input tokens the provider counted (cached ones included).
    pub const INPUT_TOKENS: &str = "gen_ai.usage.input_tokens";
    /// Output tokens.
    pub const OUTPUT_TOKENS: &str = "gen_ai.usage.output_tokens";
    /// Why each choice stopped.
    pub const FINISH_REASONS: &str = "gen_ai.response.finish_reasons";
    /// The conversation.
    pub const CONVERSATION: &str = "gen_ai.conversation.id";
    /// The messages sent, on opt-in only.
    pub const INPUT_MESSAGES: &str = "gen_ai.input.messages";
    /// The messages the model answered, on opt-in only.
    pub const OUTPUT_MESSAGES: &str = "gen_ai.output.messages";
    /// `input` or `output`, on `gen_ai.client.token.usage`.
    pub const TOKEN_TYPE: &str = "gen_ai.token.type";
    /// The upstream's host.
    pub const SERVER_ADDRESS: &str = "server.address";
    /// The upstream's port.
    pub const SERVER_PORT: &str = "server.port";
    /// What went wrong: a status code, an error code, or how a stream ended.
    pub const ERROR_TYPE: &str = "error.type";
    /// The HTTP status the client got.
    pub const HTTP_STATUS: &str = "http.response.status_code";
    /// How Phoenix and other OpenInference readers draw a span.
    pub const OPENINFERENCE_KIND: &str = "openinference.span.kind";
    /// The tenant the request was admitted as.
    pub const TENANT: &str = "handoff.tenant";
    /// The conversation id (as `gen_ai.conversation.id`).
    pub const HANDOFF_CONVERSATION: &str = "handoff.conversation";
}

/// The GenAI client metrics of the conventions.
#[derive(Clone)]
pub struct GenAiMetrics {
    /// `gen_ai.client.token.usage`, tokens by `gen_ai.token.type`.
    pub tokens: Histogram<u64>,
    /// `gen_ai.client.operation.duration`, seconds.
    pub duration: Histogram<f64>,
}

/// How a traced request makes its spans; in the current [`Context`] while it runs.
#[derive(Clone)]
pub struct Tracing {
    inner: Arc<Inner>,
}

struct Inner {
    tracer: BoxedTracer,
    propagator: Box<dyn TextMapPropagator + Send + Sync>,
    content: bool,
    metrics: Option<GenAiMetrics>,
}

impl std::fmt::Debug for Tracing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracing")
            .field("content", &self.inner.content)
            .finish_non_exhaustive()
    }
}

impl Tracing {
    /// Spans from `tracer`, their context put in outgoing requests by `propagator`;
    /// message contents on them when `content`.
    pub fn new(
        tracer: BoxedTracer,
        propagator: Box<dyn TextMapPropagator + Send + Sync>,
        content: bool,
        metrics: Option<GenAiMetrics>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                tracer,
                propagator,
                content,
                metrics,
            }),
        }
    }

    /// The current request's, when it is traced.
    pub fn current() -> Option<Tracing> {
        Context::map_current(|cx| cx.get::<Tracing>().cloned())
    }

    /// True when the operator opted in to message contents on spans.
    pub fn captures_content(&self) -> bool {
        self.inner.content
    }

    /// A span of `kind` under `parent`'s, with this `Tracing` in its context.
    pub fn start_under(
        &self,
        parent: &Context,
        name: impl Into<Cow<'static, str>>,
        kind: SpanKind,
        attributes: Vec<KeyValue>,
    ) -> Child {
        let span = self
            .inner
            .tracer
            .span_builder(name)
            .with_kind(kind)
            .with_attributes(attributes)
            .start_with_context(&self.inner.tracer, parent);
        let cx = parent.with_span(span).with_value(self.clone());
        Child { cx, ended: false }
    }

    /// Records one GenAI operation's duration and tokens, under `attributes`.
    pub fn record_operation(
        &self,
        attributes: &[KeyValue],
        took: Duration,
        tokens: Option<(u64, u64)>,
    ) {
        let Some(metrics) = &self.inner.metrics else {
            return;
        };
        metrics.duration.record(took.as_secs_f64(), attributes);
        if let Some((input, output)) = tokens {
            let mut with_type = attributes.to_vec();
            with_type.push(KeyValue::new(attr::TOKEN_TYPE, "input"));
            metrics.tokens.record(input, &with_type);
            if let Some(last) = with_type.last_mut() {
                *last = KeyValue::new(attr::TOKEN_TYPE, "output");
            }
            metrics.tokens.record(output, &with_type);
        }
    }
}

/// Starts a child of the current span, when the current request is traced.
pub fn child(
    name: impl Into<Cow<'static, str>>,
    kind: SpanKind,
    attributes: Vec<KeyValue>,
) -> Option<Child> {
    let tracing = Tracing::current()?;
    let parent = Context::current();
    Some(tracing.start_under(&parent, name, kind, attributes))
}

/// Sets `attributes` on the current span; nothing (not even the attributes made)
/// when the request is not traced, or its trace was not sampled.
pub fn note(attributes: impl FnOnce() -> Vec<KeyValue>) {
    Context::map_current(|cx| {
        if cx.get::<Tracing>().is_some() {
            let span = cx.span();
            if span.is_recording() {
                span.set_attributes(attributes());
            }
        }
    });
}

/// A span that ends when dropped.
#[derive(Debug)]
pub struct Child {
    cx: Context,
    ended: bool,
}

impl Child {
    /// Its context: run the work it covers `with_context` this, and its own children
    /// and outgoing requests hang from it.
    pub fn context(&self) -> &Context {
        &self.cx
    }

    /// Sets one attribute.
    pub fn set(&self, attribute: KeyValue) {
        self.cx.span().set_attribute(attribute);
    }

    /// Sets several attributes.
    pub fn set_all(&self, attributes: Vec<KeyValue>) {
        self.cx.span().set_attributes(attributes);
    }

    /// Marks it failed, with `error.type` and a description.
    pub fn fail(&self, error_type: impl Into<opentelemetry::Value>, description: String) {
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(attr::ERROR_TYPE, error_type));
        span.set_status(Status::error(description));
    }

    /// Ends it now.
    pub fn end(mut self) {
        self.finish();
    }

    fn finish(&mut self) {
        if !self.ended {
            self.ended = true;
            self.cx.span().end();
        }
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.finish();
    }
}

/// What a request span learns on the way that its GenAI metrics are labelled and
/// counted with (a span's attributes cannot be read back).
#[derive(Debug, Default, Clone)]
pub struct Facts {
    /// `gen_ai.request.model`.
    pub request_model: Option<String>,
    /// `gen_ai.response.model`.
    pub response_model: Option<String>,
    /// Input and output tokens, as the provider counted them.
    pub tokens: Option<(u64, u64)>,
}

/// The request's [`Facts`], shared between its span and the layers that learn them.
#[derive(Debug, Default, Clone)]
pub struct SharedFacts(pub Arc<std::sync::Mutex<Facts>>);

/// Updates the current request's facts, when it is traced.
pub fn learn(update: impl FnOnce(&mut Facts)) {
    Context::map_current(|cx| {
        if let Some(SharedFacts(facts)) = cx.get::<SharedFacts>() {
            if let Ok(mut facts) = facts.lock() {
                update(&mut facts);
            }
        }
    });
}

/// An integer attribute (OTLP's integers are signed; a count past `i64::MAX` is capped).
pub fn number(key: &'static str, n: u64) -> KeyValue {
    KeyValue::new(key, i64::try_from(n).unwrap_or(i64::MAX))
}

/// What a bill puts on a span, and its input and output tokens as the conventions
/// count them: cached input is input.
pub fn usage(billed: &crate::config::Billed) -> (Vec<KeyValue>, (u64, u64)) {
    let input = billed.input + billed.cache_read + billed.cache_write;
    let attributes = vec![
        number(attr::INPUT_TOKENS, input),
        number(attr::OUTPUT_TOKENS, billed.output),
        number("gen_ai.usage.cache_read.input_tokens", billed.cache_read),
        number(
            "gen_ai.usage.cache_creation.input_tokens",
            billed.cache_write,
        ),
    ];
    (attributes, (input, billed.output))
}

/// The GenAI provider name (`gen_ai.provider.name`) of a dialect, by its name.
pub fn provider_of(dialect: &str) -> &'static str {
    match dialect {
        "anthropic" => "anthropic",
        "gemini" => "gcp.gemini",
        _ => "openai",
    }
}

/// Puts the current span's context in `headers` as W3C `traceparent`/`tracestate`,
/// in place of the client's: the next hop's parent is handoff's span. Nothing when the
/// request is not traced: the client's headers pass as they came.
pub fn inject(headers: &mut http::HeaderMap) {
    Context::map_current(|cx| {
        if let Some(tracing) = cx.get::<Tracing>() {
            tracing
                .inner
                .propagator
                .inject_context(cx, &mut HeaderInjector(headers));
        }
    });
}

struct HeaderInjector<'a>(&'a mut http::HeaderMap);

impl opentelemetry::propagation::Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
