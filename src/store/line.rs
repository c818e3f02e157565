//! The on-disk line format of `messages.jsonl`. Every line carries the format version.
//!
//! Lines are only ever appended. A reader skips lines it cannot parse (a torn last
//! line after a crash) and `handoff audit verify` reports them.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use crate::digest::{Digest, MessageDigest, PrefixDigest};

/// Version written on every line; readers refuse lines from a newer version.
pub const FORMAT_VERSION: u32 = 1;

/// Who produced an original.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// The client sent it.
    Client,
    /// The upstream answered it.
    Upstream,
}

/// One line of `messages.jsonl`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Line {
    /// Format version.
    pub v: u32,
    /// When it was written, RFC 3339.
    pub at: String,
    /// What the line records.
    #[serde(flatten)]
    pub entry: Entry,
}

impl Line {
    /// A line of the current version stamped with the current time.
    pub fn now(entry: Entry) -> Self {
        Self {
            v: FORMAT_VERSION,
            at: humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string(),
            entry,
        }
    }
}

/// The kinds of line.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// One non-pinned original, a link of the prefix chain.
    Message(MessageLine),
    /// A distinct set of pinned messages, logged the first time it is seen.
    Pinned(PinnedLine),
    /// One request: which prefix it carried and with which pinned set.
    Request(RequestLine),
}

/// An original message in the chain.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MessageLine {
    /// Chain digest of the prefix ending with this message.
    pub digest: PrefixDigest,
    /// Chain digest of the prefix before it; `None` for the first message.
    pub parent: Option<PrefixDigest>,
    /// Digest of the message alone.
    pub message_digest: MessageDigest,
    /// Client or upstream.
    pub source: Source,
    /// The request's model.
    pub model: String,
    /// The message exactly as received, unknown fields included.
    pub message: Box<RawValue>,
    /// For replies: the upstream's `usage`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<Value>,
    /// For replies: the choice's `finish_reason`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
    /// For replies: the choice index when `n > 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub choice: Option<u64>,
}

/// A set of pinned (leading system/developer) messages.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PinnedLine {
    /// Digest of the set.
    pub digest: Digest,
    /// The messages exactly as received.
    pub messages: Vec<Box<RawValue>>,
}

/// One request seen by the proxy.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RequestLine {
    /// The requested model.
    pub model: String,
    /// Chain digest of the request's last non-pinned message.
    pub head: Option<PrefixDigest>,
    /// Digest of the request's pinned set, if it had one.
    pub pinned: Option<Digest>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// How many of its messages were new to the log.
    pub new_messages: usize,
}

/// Serialises `lines` as JSONL, one `\n`-terminated line each.
pub fn encode(lines: &[Line]) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(lines.len() * 256);
    for line in lines {
        serde_json::to_writer(&mut out, line)?;
        out.push(b'\n');
    }
    Ok(out)
}
