//! The rule that adopts compaction records: only a valid record with a matching
//! boundary in the message log counts. An orphan half, a mismatch or an invalid record
//! is ignored and reported to `handoff audit verify`. Tracking, projection and
//! compaction all build on it; it imports neither of them.

use std::collections::HashMap;

use serde_json::value::RawValue;

use crate::base::digest::{message_digest, MessageDigest, PrefixDigest};
use crate::base::line::Entry;
use crate::base::record::CompactionRecord;
use crate::{ConversationLog, LineProblem};

/// The records a log adopts, and what it had to ignore.
#[derive(Debug, Default)]
pub struct Adoption {
    /// Adopted records by covered prefix.
    pub adopted: HashMap<PrefixDigest, CompactionRecord>,
    /// Dangling boundaries, mismatches and invalid records, for `audit verify`.
    pub problems: Vec<String>,
    /// Records never committed by their boundary (a crash between the two writes):
    /// the expected trace of a crash, ignored, and shown by `audit verify` as notes.
    pub uncommitted: Vec<String>,
}

/// Pairs records with boundaries: a record without its boundary (a crash between the
/// two appends) and a boundary without its record are both ignored.
pub fn adopt(log: &ConversationLog) -> Adoption {
    let mut adoption = Adoption::default();
    let mut records: HashMap<&str, &CompactionRecord> =
        log.compactions.iter().map(|r| (r.id.as_str(), r)).collect();
    for line in &log.lines {
        let Entry::CompactBoundary(boundary) = &line.entry else {
            continue;
        };
        let Some(record) = records.remove(boundary.compact_id.as_str()) else {
            adoption.problems.push(format!(
                "boundary {} has no compaction record",
                boundary.compact_id
            ));
            continue;
        };
        if record.source.prefix_digest != boundary.prefix_digest {
            adoption.problems.push(format!(
                "boundary {} covers a different prefix than its record",
                boundary.compact_id
            ));
            continue;
        }
        if let Err(reason) = record.check() {
            adoption
                .problems
                .push(format!("compaction {} is invalid: {reason}", record.id));
            continue;
        }
        adoption
            .adopted
            .insert(record.source.prefix_digest, record.clone());
    }
    let mut uncommitted: Vec<String> = records.keys().map(|id| (*id).to_owned()).collect();
    uncommitted.sort();
    adoption.uncommitted = uncommitted;
    adoption
}

/// Problems of `compactions.jsonl` lines plus pairing problems, for `audit verify`.
pub fn compaction_problems(log: &ConversationLog) -> Vec<LineProblem> {
    let mut problems = log.compaction_problems.clone();
    problems.extend(
        adopt(log)
            .problems
            .into_iter()
            .map(|reason| LineProblem { line: 0, reason }),
    );
    problems
}

/// An adopted compaction, with its pair pre-serialised for the hot path.
#[derive(Debug)]
pub struct Adopted {
    /// The record.
    pub record: CompactionRecord,
    /// The continuation, as sent upstream.
    pub continuation: Box<RawValue>,
    /// The handoff, as sent upstream.
    pub handoff: Box<RawValue>,
    /// Digest of the continuation (token-count cache key).
    pub continuation_digest: MessageDigest,
    /// Digest of the handoff (token-count cache key).
    pub handoff_digest: MessageDigest,
    /// For a prepared record: a request adopted it (its `adopt` line is logged).
    pub taken: std::sync::atomic::AtomicBool,
    /// For a prepared record: another compaction overtook it before any request took it.
    retired: std::sync::atomic::AtomicBool,
    /// The handoff with a prompt-cache breakpoint after it, made once
    /// ([`Adopted::marked_handoff`]).
    marked: std::sync::OnceLock<Option<std::sync::Arc<str>>>,
}

impl Adopted {
    /// Prepares `record` for projection.
    pub fn new(record: CompactionRecord) -> Result<Self, serde_json::Error> {
        Ok(Self {
            continuation: serde_json::value::to_raw_value(&record.continuation)?,
            handoff: serde_json::value::to_raw_value(&record.handoff)?,
            continuation_digest: message_digest(&record.continuation),
            handoff_digest: message_digest(&record.handoff),
            taken: std::sync::atomic::AtomicBool::new(false),
            retired: std::sync::atomic::AtomicBool::new(false),
            marked: std::sync::OnceLock::new(),
            record,
        })
    }

    /// The handoff as `mark` puts a prompt-cache breakpoint after it (the record's
    /// dialect decides how), made on the first request that wants it and shared by
    /// every later one; `None` when it has no mark.
    pub fn marked_handoff(
        &self,
        mark: impl FnOnce(&serde_json::Value) -> Option<serde_json::Value>,
    ) -> Option<std::sync::Arc<str>> {
        let made = self.marked.get_or_init(|| {
            let marked = mark(&self.record.handoff)?;
            serde_json::to_string(&marked)
                .ok()
                .map(std::sync::Arc::from)
        });
        made.clone()
    }

    /// True for a prepared record no request has adopted yet.
    pub fn is_waiting(&self) -> bool {
        self.record.prepared.is_some() && !self.taken.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks a waiting prepared record overtaken; true only for the call that did it
    /// first, so it is counted as wasted once.
    pub fn retire(&self) -> bool {
        self.record.prepared.is_some()
            && !self.retired.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Marks a prepared record adopted; true only for the call that did it first.
    pub fn take(&self) -> bool {
        self.record.prepared.is_some()
            && !self.taken.swap(true, std::sync::atomic::Ordering::AcqRel)
    }

    /// Non-pinned originals the compaction covers.
    pub fn covered(&self) -> usize {
        self.record.source.end_exclusive
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::base::digest::next_prefix;
    use crate::base::line::{BoundaryLine, Line, FORMAT_VERSION};
    use crate::base::record::{Reason, RecordSource, POLICY_VERSION};
    use serde_json::{json, Value};

    pub(crate) fn record(id: &str, n: u8) -> CompactionRecord {
        let digest = next_prefix(None, &message_digest(&json!({"n": n})));
        CompactionRecord {
            v: FORMAT_VERSION,
            kind: "compaction".into(),
            id: id.into(),
            at: "2026-01-01T00:00:00Z".into(),
            strategy: "extract".into(),
            chain: vec!["extract".into()],
            reason: Reason::Threshold,
            policy_version: POLICY_VERSION,
            source: RecordSource {
                start: 0,
                end_exclusive: 2,
                prefix_digest: digest,
                tool_call_ids: vec![],
                history_digest: String::new(),
                previous_compaction: None,
            },
            continuation: json!({"role": "user", "content": "continue"}),
            handoff: json!({"role": "assistant", "content": "handoff"}),
            tokens_before: 10,
            tokens_after: 5,
            usage: Value::Null,
            attempts: vec![],
            ledger: None,
            prepared: None,
            summary_calls: 0,
            took_over: None,
        }
    }

    #[test]
    fn only_matching_valid_pairs_are_adopted() {
        let good = record("cmp-good", 1);
        let orphan = record("cmp-orphan", 2);
        let mut mismatched = record("cmp-mismatch", 3);
        let mut invalid = record("cmp-invalid", 4);
        invalid.handoff = json!({"role": "assistant", "content": "x", "tool_calls": [{"id": "c"}]});
        let mut mismatched_boundary = mismatched.boundary();
        mismatched_boundary.prefix_digest = good.source.prefix_digest;
        mismatched.source.end_exclusive = 3;
        let dangling = BoundaryLine {
            compact_id: "cmp-missing".into(),
            prefix_digest: good.source.prefix_digest,
        };
        let log = ConversationLog {
            lines: [
                good.boundary(),
                mismatched_boundary,
                invalid.boundary(),
                dangling,
            ]
            .into_iter()
            .map(|b| Line::now(Entry::CompactBoundary(b)))
            .collect(),
            compactions: vec![good.clone(), orphan, mismatched, invalid],
            ..ConversationLog::default()
        };
        let adoption = adopt(&log);
        assert_eq!(adoption.adopted.len(), 1);
        assert_eq!(adoption.adopted[&good.source.prefix_digest].id, "cmp-good");
        assert_eq!(adoption.uncommitted, ["cmp-orphan"]);
        let problems = adoption.problems.join("\n");
        for expected in [
            "cmp-missing has no compaction record",
            "cmp-mismatch covers a different prefix",
            "cmp-invalid is invalid",
        ] {
            assert!(
                problems.contains(expected),
                "{expected} not reported:\n{problems}"
            );
        }
    }

    #[test]
    fn the_record_is_written_before_its_boundary() {
        // Commit order is part of the recovery contract: with the record first, a crash
        // in between leaves an orphan record, which `adopt` ignores.
        let crash_between = ConversationLog {
            compactions: vec![record("cmp-1", 1)],
            ..ConversationLog::default()
        };
        assert!(adopt(&crash_between).adopted.is_empty());
    }
}
