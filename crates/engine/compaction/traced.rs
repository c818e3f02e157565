//! The compaction span: one per run, under the request that needed it (or the
//! request that started a background run), with the chain, each attempt, the view's
//! validation and how the run ended. The summary calls hang from it.

use opentelemetry::trace::SpanKind;
use opentelemetry::{KeyValue, StringValue, Value};

use super::job::{CompactError, Job};
use crate::base::record::{CompactionRecord, Reason};
use crate::dialect::DialectKind;
use crate::projection::ModelView;
use crate::telemetry::spans::{self, attr, Child, Tracing};
use handoff_plugin_api::{ModelCallError, ModelReply};

/// Opens the span of `job`'s run, when its request is traced.
pub(super) fn open(job: &Job<'_>) -> Option<Child> {
    let chain: Vec<StringValue> = job
        .chain
        .iter()
        .map(|named| StringValue::from(named.name.clone()))
        .collect();
    let mode = match (job.reason, job.detached) {
        (Reason::Prepared, _) => "prepared",
        (Reason::Manual, _) => "manual",
        (_, true) => "detached",
        (Reason::ContextLengthExceeded, false) => "reactive",
        (Reason::Threshold, false) => "inline",
    };
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    spans::child(
        "handoff.compaction",
        SpanKind::Internal,
        vec![
            KeyValue::new("handoff.compaction.chain", Value::Array(chain.into())),
            KeyValue::new("handoff.compaction.mode", mode),
            KeyValue::new("handoff.compaction.threshold", int(job.threshold)),
            KeyValue::new("handoff.conversation", job.id.as_str().to_owned()),
        ],
    )
}

/// What a committed record says of its run: the strategy that made it, every attempt
/// before it, its sizes and its summary calls.
pub(super) fn committed(record: &CompactionRecord) {
    spans::note(|| {
        let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        let attempts: Vec<StringValue> = record
            .attempts
            .iter()
            .map(|attempt| {
                let why = attempt.reason.as_deref().unwrap_or("");
                StringValue::from(format!(
                    "{}:{}{}{why}",
                    attempt.strategy,
                    attempt.outcome,
                    if why.is_empty() { "" } else { ":" }
                ))
            })
            .collect();
        vec![
            KeyValue::new("handoff.compaction.id", record.id.clone()),
            KeyValue::new("handoff.compaction.strategy", record.strategy.clone()),
            KeyValue::new("handoff.compaction.attempts", Value::Array(attempts.into())),
            KeyValue::new(
                "handoff.compaction.tokens_before",
                int(record.tokens_before),
            ),
            KeyValue::new("handoff.compaction.tokens_after", int(record.tokens_after)),
            KeyValue::new(
                "handoff.tokens_saved",
                int(record.tokens_before.saturating_sub(record.tokens_after)),
            ),
            KeyValue::new(
                "handoff.compaction.summary_calls",
                int(record.summary_calls),
            ),
        ]
    });
}

/// Ends the span with the run's result: the view's validation and compaction, or
/// why there is none.
pub(super) fn close(span: &Child, result: &Result<ModelView<'_>, CompactError>) {
    match result {
        Ok(view) => {
            span.set(KeyValue::new("handoff.compaction.validated", true));
            if let Some(id) = view.compact_id() {
                span.set(KeyValue::new("handoff.compaction.view", id.to_owned()));
            }
        }
        Err(err) => {
            let kind = match err {
                CompactError::View(_) => "invalid_view",
                CompactError::TooLarge { .. } => "too_large",
                CompactError::Busy(_) => "busy",
                CompactError::Cancelled => "cancelled",
                CompactError::Store(_) => "store",
                CompactError::Uncompactable(_) => "uncompactable",
                CompactError::NoHandoff(_) => "no_handoff",
            };
            if matches!(err, CompactError::View(_)) {
                span.set(KeyValue::new("handoff.compaction.validated", false));
            }
            span.fail(kind, err.to_string());
        }
    }
}

/// A stand-in handoff sent in place of a summary that ran past `compaction.max_wait`.
pub(super) fn stand_in(waited: std::time::Duration) {
    spans::note(|| {
        vec![
            KeyValue::new("handoff.compaction.stand_in", true),
            KeyValue::new(
                "handoff.compaction.waited_ms",
                i64::try_from(waited.as_millis()).unwrap_or(i64::MAX),
            ),
        ]
    });
}

/// The request adopted a compaction prepared in the background, or waited for one.
pub(super) fn prepared(waited: bool) {
    spans::note(|| {
        vec![
            KeyValue::new("handoff.compaction.prepared", true),
            KeyValue::new("handoff.compaction.waited", waited),
        ]
    });
}

/// Opens the GenAI client span of a summary call in `dialect` with `body`.
pub(super) fn summary_call(dialect: DialectKind, body: &serde_json::Value) -> Option<Child> {
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
pub(super) fn summary_answered(
    span: Child,
    dialect: DialectKind,
    answer: &Result<ModelReply, ModelCallError>,
    took: std::time::Duration,
) {
    let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
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
                let input = billed.input + billed.cache_read + billed.cache_write;
                span.set_all(vec![
                    KeyValue::new(attr::INPUT_TOKENS, int(input)),
                    KeyValue::new(attr::OUTPUT_TOKENS, int(billed.output)),
                ]);
                tokens = Some((input, billed.output));
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
