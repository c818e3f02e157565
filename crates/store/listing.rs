//! What a listing shows of a conversation, when the store keeps it beside the log.

use crate::base::id::ConversationId;

/// A conversation's counts, as a listing shows them. A store that keeps them beside
/// the log, updated by its own writes, lists one row instead of reading the log;
/// `audit` counts the same from a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listing {
    /// The conversation.
    pub id: ConversationId,
    /// Time of the first line.
    pub first_seen: Option<String>,
    /// Time of the last line.
    pub last_seen: Option<String>,
    /// Originals logged (client and upstream).
    pub messages: u64,
    /// Requests that were logged.
    pub requests: u64,
    /// Branches: heads no logged message continues.
    pub branches: u64,
    /// Models named by requests.
    pub models: Vec<String>,
    /// Committed compactions.
    pub compactions: u64,
}
