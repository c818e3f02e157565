//! The compaction span: one per run, under the request that needed it (or the
//! request that started a background run), with the chain, each attempt, the view's
//! validation and how the run ended. The summary calls hang from it.

use opentelemetry::trace::SpanKind;
use opentelemetry::{KeyValue, StringValue, Value};

use super::job::{CompactError, Job};
use crate::base::record::{CompactionRecord, Reason};
use crate::projection::ModelView;
use crate::telemetry::spans::{self, Child};

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
