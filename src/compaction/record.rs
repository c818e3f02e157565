//! The compaction record (one line of `compactions.jsonl`) and the rule that adopts it:
//! only a valid record with a matching boundary in the message log counts.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::digest::PrefixDigest;
use crate::store::line::{BoundaryLine, Entry, FORMAT_VERSION};
use crate::store::{ConversationLog, LineProblem};

/// Version of the compaction policy (split, budgets, prompt contract) in force.
pub const POLICY_VERSION: u32 = 1;

/// Why a compaction ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// The estimate passed the trigger.
    Threshold,
    /// The upstream answered with a context-length error.
    ContextLengthExceeded,
    /// `POST /handoff/conversations/{id}/compact`.
    Manual,
}

/// What a compaction covers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordSource {
    /// Index (in non-pinned originals) of the first message summarised in this round.
    pub start: usize,
    /// Index one past the last message covered; the recent part starts here.
    pub end_exclusive: usize,
    /// Chain digest of the covered prefix `m[0..end_exclusive]`.
    pub prefix_digest: PrefixDigest,
    /// Tool call ids inside the covered range.
    pub tool_call_ids: Vec<String>,
    /// blake3 of the summarised messages' digests.
    pub history_digest: String,
    /// The compaction this one builds on.
    pub previous_compaction: Option<String>,
}

/// One strategy attempt and how it went.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// The strategy's name in the chain.
    pub strategy: String,
    /// `ok` or `failed`.
    pub outcome: String,
    /// Failure reason, e.g. `precheck_failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Failure detail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Provider usage, even for a discarded summary; summed over every model call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
    /// Model calls made (a folding summary makes several).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u32>,
    /// Wall time in milliseconds.
    pub duration_ms: u64,
}

/// One committed (or about to be committed) compaction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompactionRecord {
    /// Format version.
    pub v: u32,
    /// Always `compaction`.
    pub kind: String,
    /// Unique id, `cmp-…`.
    pub id: String,
    /// RFC 3339 time.
    pub at: String,
    /// The strategy that produced the handoff.
    pub strategy: String,
    /// The chain that was tried.
    pub chain: Vec<String>,
    /// Why it ran.
    pub reason: Reason,
    /// [`POLICY_VERSION`] at the time.
    pub policy_version: u32,
    /// What it covers.
    pub source: RecordSource,
    /// The user continuation message.
    pub continuation: Value,
    /// The assistant handoff message.
    pub handoff: Value,
    /// Estimated view tokens before.
    pub tokens_before: u64,
    /// Estimated view tokens after.
    pub tokens_after: u64,
    /// Usage summed over every attempt.
    pub usage: Value,
    /// Every attempt, in order.
    pub attempts: Vec<Attempt>,
}

impl CompactionRecord {
    /// The boundary line that commits this record.
    pub fn boundary(&self) -> BoundaryLine {
        BoundaryLine {
            compact_id: self.id.clone(),
            prefix_digest: self.source.prefix_digest,
        }
    }

    /// The handoff's text.
    pub fn handoff_text(&self) -> &str {
        self.handoff
            .get("content")
            .and_then(Value::as_str)
            .unwrap_or("")
    }

    /// Checks the pair's shape: a user continuation and an assistant handoff with
    /// string content and no tool calls.
    pub fn check(&self) -> Result<(), String> {
        if self.v > FORMAT_VERSION {
            return Err(format!(
                "format version {} is newer than this build's",
                self.v
            ));
        }
        if self.continuation.get("role").and_then(Value::as_str) != Some("user") {
            return Err("continuation is not a user message".into());
        }
        if self.handoff.get("role").and_then(Value::as_str) != Some("assistant") {
            return Err("handoff is not an assistant message".into());
        }
        if self.handoff_text().trim().is_empty() {
            return Err("handoff has no text".into());
        }
        if self.handoff.get("tool_calls").is_some_and(|c| !c.is_null()) {
            return Err("handoff carries tool calls".into());
        }
        Ok(())
    }
}

/// The records a log adopts, and what it had to ignore.
#[derive(Debug, Default)]
pub struct Adoption {
    /// Adopted records by covered prefix.
    pub adopted: HashMap<PrefixDigest, CompactionRecord>,
    /// Orphans, mismatches and invalid records, for `audit verify`.
    pub problems: Vec<String>,
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
    for id in records.keys() {
        adoption
            .problems
            .push(format!("compaction {id} has no boundary (not committed)"));
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::{chain, message_digest};
    use crate::store::line::Line;
    use serde_json::json;

    fn record(id: &str, n: u8) -> CompactionRecord {
        let digest = chain(None, &message_digest(&json!({"n": n})));
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
        let problems = adoption.problems.join("\n");
        for expected in [
            "cmp-orphan has no boundary",
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
