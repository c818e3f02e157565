//! The compaction span: one per run, under the request that needed it (or the
//! request that started a background run), with the chain, each attempt, the view's
//! validation and how the run ended. The summary calls hang from it.

use opentelemetry::trace::SpanKind;
use opentelemetry::{KeyValue, StringValue, Value};

use super::job::{CompactError, Job};
use crate::base::record::{CompactionRecord, Reason};
use crate::projection::ModelView;
use crate::telemetry::spans::{self, number, Child};

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
    spans::child(
        "handoff.compaction",
        SpanKind::Internal,
        vec![
            KeyValue::new("handoff.compaction.chain", Value::Array(chain.into())),
            KeyValue::new("handoff.compaction.mode", mode),
            number("handoff.compaction.threshold", job.threshold),
            KeyValue::new("handoff.conversation", job.id.as_str().to_owned()),
        ],
    )
}

/// What a committed record says of its run: the strategy that made it, every attempt
/// before it, its sizes and its summary calls.
pub(super) fn committed(record: &CompactionRecord) {
    spans::note(|| {
        let attempts: Vec<StringValue> = record
            .attempts
            .iter()
            .map(|attempt| {
                let tried = format!("{}:{}", attempt.strategy, attempt.outcome);
                StringValue::from(match &attempt.reason {
                    Some(why) => format!("{tried}:{why}"),
                    None => tried,
                })
            })
            .collect();
        vec![
            KeyValue::new("handoff.compaction.id", record.id.clone()),
            KeyValue::new("handoff.compaction.strategy", record.strategy.clone()),
            KeyValue::new("handoff.compaction.attempts", Value::Array(attempts.into())),
            number("handoff.compaction.tokens_before", record.tokens_before),
            number("handoff.compaction.tokens_after", record.tokens_after),
            number(
                "handoff.tokens_saved",
                record.tokens_before.saturating_sub(record.tokens_after),
            ),
            number("handoff.compaction.summary_calls", record.summary_calls),
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
            number(
                "handoff.compaction.waited_ms",
                u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
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
