//! The compaction record: one line of `compactions.jsonl`, and the boundary line that
//! commits it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::digest::PrefixDigest;
use super::version::FORMAT_VERSION;

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
    /// Prepared in the background at `compaction.prepare_at`, for the request that
    /// crosses the trigger to adopt ([`Prepared`]).
    Prepared,
}

/// When a prepared compaction started, and on how much of the conversation: the
/// messages that arrive before it is adopted stay verbatim after its cut.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    /// When the preparation started (RFC 3339).
    pub started: String,
    /// Non-pinned messages of the request it was prepared from.
    pub messages: usize,
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
    /// The model its calls went to (a summarising strategy's summary model), which
    /// prices its `usage`; none for a strategy that calls no model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
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
    /// The ledger the handoff ends with, structured (after a deterministic handoff that
    /// left it no room, the user's messages alone, carried for the next compaction but
    /// not written); none before ledgers existed or with `compaction.ledger_share = 0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger: Option<crate::ledger::Ledger>,
    /// Set when it was prepared in the background: it counts only once a request
    /// crosses the trigger without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prepared: Option<Prepared>,
    /// Summary calls the run made for this record, counted as each was made (on its
    /// lease, in a shared store): with [`Self::took_over`], what an auditor checks the
    /// provider's bill against.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub summary_calls: u64,
    /// The orphaned claim on the conversation's compaction this run took over: a run
    /// that expired without releasing its lease, or left summary calls no committed
    /// record holds, and those calls, wasted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub took_over: Option<TookOver>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// A claim on a conversation's compaction whose run left no record of its work: it
/// expired without a release (its replica was killed, or cut off from the database),
/// or ended without committing what its summary calls wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TookOver {
    /// Who held it (the replica and its claim).
    pub holder: String,
    /// Its epoch.
    pub epoch: i64,
    /// The summary calls it made.
    pub calls: u64,
}

/// The boundary of a compaction, in the message log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundaryLine {
    /// The record's id in `compactions.jsonl`.
    pub compact_id: String,
    /// The prefix the compaction covers.
    pub prefix_digest: PrefixDigest,
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
        match self.handoff.get("content") {
            Some(Value::String(text)) => text,
            // Anthropic: the handoff is one text block.
            Some(Value::Array(blocks)) => blocks
                .iter()
                .find_map(|b| b.get("text").and_then(Value::as_str))
                .unwrap_or(""),
            // Gemini: one text part.
            _ => self
                .handoff
                .get("parts")
                .and_then(Value::as_array)
                .and_then(|parts| parts.iter().find_map(|p| p.get("text")?.as_str()))
                .unwrap_or(""),
        }
    }

    /// Checks the pair's shape: a user continuation and an assistant handoff (Gemini
    /// calls the role `model`) with text and no tool calls.
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
        if !matches!(
            self.handoff.get("role").and_then(Value::as_str),
            Some("assistant" | "model")
        ) {
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
