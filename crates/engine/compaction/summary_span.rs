//! The span of a summary call: a GenAI client span of its own, under the compaction
//! that made it, with the usage its answer reported.

use opentelemetry::trace::SpanKind;
use opentelemetry::KeyValue;

use crate::dialect::DialectKind;
use crate::telemetry::spans::{self, attr, Child, Tracing};
use handoff_plugin_api::{ModelCallError, ModelReply};

/// Opens the GenAI client span of a summary call in `dialect` with `body`.
pub(super) fn open(dialect: DialectKind, body: &serde_json::Value) -> Option<Child> {
    let model = body
        .get("model")
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let name = if model.is_empty() {
        "chat".to_owned()
    } else {
        format!("chat {model}")
    };
    let mut attributes = vec![
        KeyValue::new(attr::OPERATION, "chat"),
        KeyValue::new(attr::PROVIDER, spans::provider_of(dialect.name())),
        KeyValue::new(attr::OPENINFERENCE_KIND, "LLM"),
        KeyValue::new("handoff.summary_call", true),
    ];
    if !model.is_empty() {
        attributes.push(KeyValue::new(attr::REQUEST_MODEL, model));
    }
    spans::child(name, SpanKind::Client, attributes)
}

/// Ends a summary call's span with its answer, and counts it in the GenAI metrics.
pub(super) fn answered(
    span: Child,
    dialect: DialectKind,
    answer: &Result<ModelReply, ModelCallError>,
    took: std::time::Duration,
) {
    let mut labels = vec![
        KeyValue::new(attr::OPERATION, "chat"),
        KeyValue::new(attr::PROVIDER, spans::provider_of(dialect.name())),
    ];
    let mut tokens = None;
    match answer {
        Ok(reply) => {
            span.set(KeyValue::new(attr::HTTP_STATUS, i64::from(reply.status)));
            let usage = reply
                .body
                .get("usage")
                .or_else(|| reply.body.get("usageMetadata"));
            if let Some(billed) = usage.and_then(|usage| dialect.get().billed(usage)) {
                let (usage, counted) = spans::usage(&billed);
                span.set_all(usage);
                tokens = Some(counted);
            }
            let model = reply
                .body
                .get("model")
                .or_else(|| reply.body.get("modelVersion"))
                .and_then(serde_json::Value::as_str);
            if let Some(model) = model {
                span.set(KeyValue::new(attr::RESPONSE_MODEL, model.to_owned()));
                labels.push(KeyValue::new(attr::RESPONSE_MODEL, model.to_owned()));
            }
            if reply.status >= 400 {
                span.fail(
                    reply.status.to_string(),
                    format!("the upstream answered {}", reply.status),
                );
                labels.push(KeyValue::new(attr::ERROR_TYPE, reply.status.to_string()));
            }
        }
        Err(err) => {
            span.fail("call_failed", err.to_string());
            labels.push(KeyValue::new(attr::ERROR_TYPE, "call_failed"));
        }
    }
    if let Some(tracing) = Tracing::current() {
        tracing.record_operation(&labels, took, tokens);
    }
}
