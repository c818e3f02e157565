//! Compaction: when a request would overflow the model's window, the old history
//! becomes a handoff and the recent units stay verbatim (DESIGN.md section 3).
//!
//! - [`budget`]: when to compact, with the calibrated estimate;
//! - [`mod@unit`] and [`split`]: where to cut, never inside a unit;
//! - [`chain`]: the strategies tried in order, every attempt recorded;
//! - [`handoff`]: the continuation + handoff pair;
//! - [`record`]: the record and the rule that adopts it (record + boundary);
//! - [`service`]: one run, single flight per conversation, the loop guard;
//! - [`reactive`]: recognising an upstream context-length error.
//!
//! It never destroys an original, never commits after cancellation, and never
//! produces a view that it has not validated.

pub mod budget;
pub mod chain;
pub mod handoff;
pub mod model_client;
pub mod reactive;
pub mod record;
pub mod service;
pub mod split;
pub mod unit;

use serde_json::value::RawValue;

pub use record::{adopt, Adoption, CompactionRecord, Reason};

use crate::digest::{message_digest, MessageDigest};

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
}

impl Adopted {
    /// Prepares `record` for projection.
    pub fn new(record: CompactionRecord) -> Result<Self, serde_json::Error> {
        Ok(Self {
            continuation: serde_json::value::to_raw_value(&record.continuation)?,
            handoff: serde_json::value::to_raw_value(&record.handoff)?,
            continuation_digest: message_digest(&record.continuation),
            handoff_digest: message_digest(&record.handoff),
            record,
        })
    }

    /// Non-pinned originals the compaction covers.
    pub fn covered(&self) -> usize {
        self.record.source.end_exclusive
    }
}
