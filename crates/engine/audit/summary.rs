//! One conversation in a line: what `audit list` and the admin API show.

use std::collections::BTreeSet;

use serde::Serialize;

use super::branch::Tree;
use crate::conversation::ConversationId;
use crate::store::{ConversationLog, Listing};

/// The facts of one conversation.
#[derive(Debug, Clone, Serialize)]
pub struct ConversationSummary {
    /// The id.
    pub id: String,
    /// The tenant it belongs to.
    pub tenant: String,
    /// Time of the first line.
    pub first_seen: Option<String>,
    /// Time of the last line.
    pub last_seen: Option<String>,
    /// Originals in the log (client and upstream).
    pub messages: usize,
    /// Requests that added originals (an exact repeat adds nothing to the log).
    pub requests: usize,
    /// Branches (tips of the tree).
    pub branches: usize,
    /// Models used.
    pub models: Vec<String>,
    /// Committed compactions.
    pub compactions: usize,
    /// Lines that could not be read.
    pub problems: usize,
}

/// Summarises a conversation's log: what a store that keeps counts would list, and
/// the lines it could not read.
pub fn summarize(id: &ConversationId, log: &ConversationLog) -> ConversationSummary {
    let tree = Tree::new(log);
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    let listing = Listing {
        id: id.clone(),
        first_seen: log.lines.first().map(|l| l.at.clone()),
        last_seen: log.lines.last().map(|l| l.at.clone()),
        messages: count(tree.messages().len()),
        requests: count(tree.requests().len()),
        branches: count(tree.tips().len()),
        models: tree.requests().iter().map(|r| r.model.clone()).collect(),
        compactions: count(crate::compaction::adopt(log).adopted.len()),
    };
    ConversationSummary {
        problems: log.problems.len(),
        ..from_listing(listing)
    }
}

/// The summary of counts a store keeps beside the log (models shown without control
/// characters, sorted, once each); it reads no line, so it finds no problem.
pub fn from_listing(listing: Listing) -> ConversationSummary {
    let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
    let models: BTreeSet<String> = listing
        .models
        .iter()
        .map(|m| crate::redact::strip_controls(m).into_owned())
        .filter(|m| !m.is_empty())
        .collect();
    ConversationSummary {
        id: listing.id.to_string(),
        tenant: listing.id.tenant().to_string(),
        first_seen: listing.first_seen,
        last_seen: listing.last_seen,
        messages: count(listing.messages),
        requests: count(listing.requests),
        branches: count(listing.branches),
        models: models.into_iter().collect(),
        compactions: count(listing.compactions),
        problems: 0,
    }
}
