//! The ledger a compaction record keeps: the exact facts of the compacted spans, built
//! and rendered by `compaction::ledger`.

use serde::{Deserialize, Serialize};

/// The structured ledger a compaction record keeps.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ledger {
    /// The user's messages, oldest first, verbatim or shortened with a mark.
    #[serde(default)]
    pub instructions: Vec<String>,
    /// The identifiers tool calls and results carried, oldest first.
    #[serde(default)]
    pub identifiers: Vec<String>,
    /// One line per tool call with its outcome, newest first.
    #[serde(default)]
    pub outcomes: Vec<String>,
    /// Tool outcomes left out for the share, over every compaction.
    #[serde(default)]
    pub outcomes_left_out: u64,
    /// Identifiers left out for the share, over every compaction.
    #[serde(default)]
    pub identifiers_left_out: u64,
}
