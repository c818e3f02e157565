//! What an operator does with the log rather than a request: how old each conversation
//! is, holds, removal, tombstones and sizes. The [`super::Store`] operations that take
//! these types are the same in every backend.

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::base::id::ConversationId;
use crate::base::tenant::TenantId;

/// One conversation as retention sees it.
#[derive(Debug, Clone)]
pub struct Activity {
    /// The conversation.
    pub id: ConversationId,
    /// When its log was last written.
    pub last: SystemTime,
    /// Whether a hold keeps it from pruning.
    pub held: bool,
    /// Bytes it holds in the store (compressed, where it is).
    pub bytes: u64,
    /// Whether its older lines are compressed.
    pub compressed: bool,
}

/// What a removal did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Removed {
    /// Gone, with the bytes it held.
    Removed(u64),
    /// Under a hold: left alone.
    Held,
    /// Written since the caller looked: left alone.
    Active,
    /// Not in the store.
    Missing,
}

/// When a removal applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unless {
    /// Retention: unless held, or written at or after this time.
    HeldOrWrittenSince(SystemTime),
    /// Erasure: unless held.
    Held,
}

/// Who put a hold on a conversation, and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hold {
    /// RFC 3339.
    pub at: String,
    /// Who asked: `cli:<user>` or `admin:<peer>`.
    pub by: String,
    /// Why, as given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What one erasure or prune removed: written instead of the content, never with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tombstone {
    /// Format version.
    pub v: u32,
    /// When, RFC 3339.
    pub at: String,
    /// `erase` (a deletion request) or `prune` (retention).
    pub action: String,
    /// Who asked: `cli:<user>`, `admin:<peer>` or `retention`.
    pub by: String,
    /// The tenant.
    pub tenant: String,
    /// The conversations removed; empty for a whole tenant.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conversations: Vec<String>,
    /// True when the whole tenant went, indexes included.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub whole_tenant: bool,
    /// The bytes removed.
    pub bytes: u64,
    /// A shared store's position of this tombstone, for replicas that follow them.
    #[serde(default, skip_serializing)]
    pub seq: u64,
}

impl Tombstone {
    /// A tombstone stamped now.
    pub fn now(action: &str, by: &str, tenant: &TenantId) -> Self {
        Self {
            v: 1,
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            action: action.to_owned(),
            by: by.to_owned(),
            tenant: tenant.to_string(),
            conversations: Vec::new(),
            whole_tenant: false,
            bytes: 0,
            seq: 0,
        }
    }
}

/// One tenant's share of the store.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct TenantStats {
    /// The tenant.
    pub tenant: String,
    /// Its conversations.
    pub conversations: u64,
    /// Of them, compressed.
    pub compressed: u64,
    /// Of them, held.
    pub held: u64,
    /// Requests logged.
    pub requests: u64,
    /// Bytes of the log as written, before compression.
    pub bytes_raw: u64,
    /// Bytes it takes in the store.
    pub bytes_stored: u64,
}
