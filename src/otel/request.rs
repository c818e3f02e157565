//! The request span: one per proxied request, the child of the client's `traceparent`
//! when it sent one, ended with the response body (a stream's real end), and the
//! parent of everything handoff does for the request.

use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::SpanKind;
use opentelemetry::{Context, KeyValue};

use super::Telemetry;
use crate::base::outcome::Outcome;
use crate::telemetry::spans::{attr, provider_of, Child, SharedFacts, Tracing};

/// The span of one proxied request, and what its metrics are labelled with.
#[derive(Debug)]
pub(crate) struct RequestSpan {
    span: Child,
    tracing: Tracing,
    facts: SharedFacts,
    operation: Option<&'static str>,
    provider: &'static str,
}

/// The GenAI operation a request to `path` is: `chat` for the APIs handoff tracks.
fn operation_of(tracked: bool, path: &str) -> Option<&'static str> {
    if tracked {
        Some("chat")
    } else if path.ends_with("/embeddings") || path.ends_with(":embedContent") {
        Some("embeddings")
    } else {
        None
    }
}

impl Telemetry {
    /// Opens the span of a request of `dialect` to `path` whose client sent
    /// `headers`: under the client's span when they carry a `traceparent`.
    pub(crate) fn request_span(
        &self,
        headers: &http::HeaderMap,
        method: &http::Method,
        path: &str,
        dialect: &str,
        tracked: bool,
    ) -> RequestSpan {
        let parent = self.propagator.extract(&HeaderExtractor(headers));
        let operation = operation_of(tracked, path);
        let provider = provider_of(dialect);
        let mut attributes = vec![KeyValue::new(attr::PROVIDER, provider)];
        let name = match operation {
            Some(operation) => {
                attributes.push(KeyValue::new(attr::OPERATION, operation));
                attributes.push(KeyValue::new(attr::OPENINFERENCE_KIND, "LLM"));
                operation.to_owned()
            }
            None => format!("{method} {dialect}"),
        };
        let facts = SharedFacts::default();
        let parent = parent.with_value(facts.clone());
        let span = self
            .tracing
            .start_under(&parent, name, SpanKind::Client, attributes);
        RequestSpan {
            span,
            tracing: self.tracing.clone(),
            facts,
            operation,
            provider,
        }
    }
}

impl RequestSpan {
    /// The context the request's work runs in.
    pub(crate) fn context(&self) -> &Context {
        self.span.context()
    }

    /// Sets one attribute of the span.
    pub(crate) fn set(&self, attribute: KeyValue) {
        self.span.set(attribute);
    }

    /// Ends the span with what the client got: `status`, how its body ended, after
    /// `took`; and records the request's GenAI metrics.
    pub(crate) fn end(self, status: Option<http::StatusCode>, outcome: Outcome, took: Duration) {
        let facts = self
            .facts
            .0
            .lock()
            .map(|facts| facts.clone())
            .unwrap_or_default();
        if let Some(status) = status {
            self.span
                .set(KeyValue::new(attr::HTTP_STATUS, i64::from(status.as_u16())));
        }
        let error = match status {
            Some(status) if status.as_u16() >= 400 => Some(status.as_u16().to_string()),
            None => Some(outcome.as_str().to_owned()),
            _ if outcome != Outcome::Complete => Some(outcome.as_str().to_owned()),
            _ => None,
        };
        if let Some(error) = &error {
            self.span
                .fail(error.clone(), format!("the client got {error}"));
        }
        if let Some(model) = &facts.request_model {
            let name = match self.operation {
                Some(operation) => format!("{operation} {model}"),
                None => model.clone(),
            };
            opentelemetry::trace::TraceContextExt::span(self.span.context()).update_name(name);
        }
        let Some(operation) = self.operation else {
            return;
        };
        let mut labels = vec![
            KeyValue::new(attr::OPERATION, operation),
            KeyValue::new(attr::PROVIDER, self.provider),
        ];
        if let Some(model) = facts.request_model {
            labels.push(KeyValue::new(attr::REQUEST_MODEL, model));
        }
        if let Some(model) = facts.response_model {
            labels.push(KeyValue::new(attr::RESPONSE_MODEL, model));
        }
        if let Some(error) = error {
            labels.push(KeyValue::new(attr::ERROR_TYPE, error));
        }
        self.tracing.record_operation(&labels, took, facts.tokens);
    }
}

/// The client's headers, as the propagator reads them.
struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|value| value.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}
