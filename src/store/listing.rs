//! What a listing shows of a conversation, when the store keeps it beside the log.

use crate::base::id::ConversationId;

/// A conversation's counts, kept up to date by the store's own writes, so a listing
/// reads one row instead of the log. Figures mean what `audit list` means by them.
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
    /// Models named by requests, sorted, without repeats.
    pub models: Vec<String>,
    /// Committed compactions.
    pub compactions: u64,
}
