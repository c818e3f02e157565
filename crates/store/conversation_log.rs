//! A conversation's log as a store reads it back, whichever the backend: the good
//! lines, the records, and what was skipped.

use crate::base::line::Line;
use crate::base::record::CompactionRecord;

/// A line that could not be used, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LineProblem {
    /// 1-based line number.
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

/// A conversation's log as read from disk.
#[derive(Debug, Default, Clone)]
pub struct ConversationLog {
    /// The good lines of `messages.jsonl`, in file order.
    pub lines: Vec<Line>,
    /// The line of `messages.jsonl` each of `lines` was read from (a run line stands
    /// for several); empty where lines have no file (a database).
    pub file_lines: Vec<usize>,
    /// Lines of `messages.jsonl` that were skipped.
    pub problems: Vec<LineProblem>,
    /// The readable records of `compactions.jsonl`, adopted or not.
    pub compactions: Vec<CompactionRecord>,
    /// Lines of `compactions.jsonl` that were skipped.
    pub compaction_problems: Vec<LineProblem>,
    /// A shared store's position after the last line read, for [`crate::Store::read_after`];
    /// 0 for a store with one writer.
    pub last_seq: u64,
    /// The keyed hash of the bytes of each message whose text an index read dropped
    /// ([`crate::base::chunks::keyed_hash`]): which form the log holds.
    pub text_keys: std::collections::HashMap<crate::base::digest::PrefixDigest, u128>,
}
