//! The on-disk line format of `messages.jsonl`. Every line carries the format version.
//!
//! Lines are only ever appended. A reader skips lines it cannot parse (a torn last
//! line after a crash) and `handoff audit verify` reports them.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;

use super::digest::{Digest, MessageDigest, PrefixDigest};

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
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// Format version.
    pub v: u32,
    /// When it was written, RFC 3339.
    pub at: String,
    /// What the line records.
    #[serde(flatten)]
    pub entry: Entry,
}

/// The fields every line shares, read first to pick the line's type.
#[derive(Deserialize)]
struct Header {
    v: u32,
    at: String,
    kind: String,
}

impl Line {
    /// Parses one line.
    ///
    /// serde's tagged and flattened enums buffer their input, which `RawValue` cannot
    /// survive; so the header is read first, then the same bytes as the named kind.
    pub fn parse(bytes: &[u8]) -> Result<Self, LineError> {
        let header: Header = serde_json::from_slice(bytes)?;
        let entry = match header.kind.as_str() {
            "message" => Entry::Message(serde_json::from_slice(bytes)?),
            "pinned" => Entry::Pinned(serde_json::from_slice(bytes)?),
            "request" => Entry::Request(serde_json::from_slice(bytes)?),
            "compact_boundary" => Entry::CompactBoundary(serde_json::from_slice(bytes)?),
            "rescue" => Entry::Rescue(serde_json::from_slice(bytes)?),
            "adopt" => Entry::Adopt(serde_json::from_slice(bytes)?),
            _ => return Err(LineError::UnknownKind(header.kind)),
        };
        Ok(Self {
            v: header.v,
            at: header.at,
            entry,
        })
    }

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
#[derive(Debug, Clone, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Entry {
    /// One non-pinned original, a link of the prefix chain.
    Message(MessageLine),
    /// A distinct set of pinned messages, logged the first time it is seen.
    Pinned(PinnedLine),
    /// One request: which prefix it carried and with which pinned set.
    Request(RequestLine),
    /// A committed compaction: written after its record, it makes the record count.
    CompactBoundary(BoundaryLine),
    /// A view sent with over-long tool bodies shortened (`compaction.rescue`).
    Rescue(RescueLine),
    /// The first request that adopted a prepared compaction.
    Adopt(AdoptLine),
}

/// A prepared compaction adopted by the request that crossed the trigger.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdoptLine {
    /// The record adopted.
    pub compact_id: String,
    /// Chain digest of the adopting request's last non-pinned message.
    pub head: Option<PrefixDigest>,
    /// Messages that arrived between the preparation and its adoption, verbatim after
    /// the cut.
    pub arrived: usize,
}

/// Which tool results a request's view shortened, and by how much; the originals stay
/// whole in the log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RescueLine {
    /// Chain digest of the request's last non-pinned message.
    pub head: Option<PrefixDigest>,
    /// Each shortened message.
    pub shortened: Vec<ShortenedBody>,
}

/// One message whose tool bodies a view shortened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShortenedBody {
    /// Its position among the request's non-pinned messages.
    pub index: usize,
    /// Digest of the original message.
    pub message_digest: MessageDigest,
    /// Bytes of the original message.
    pub bytes_before: usize,
    /// Bytes of the message as sent.
    pub bytes_after: usize,
}

/// The boundary of a compaction, in the message log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BoundaryLine {
    /// The record's id in `compactions.jsonl`.
    pub compact_id: String,
    /// The prefix the compaction covers.
    pub prefix_digest: PrefixDigest,
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
    /// For replies: the model that answered (the request's). A client's message leaves
    /// it empty, unwritten: its request line names the model once, not every message.
    #[serde(default, skip_serializing_if = "String::is_empty")]
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
    /// For replies: whether the whole reply arrived. Lines written before this field
    /// existed were always whole replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub complete: Option<bool>,
    /// For an incomplete reply: how it was cut (`client_gone`, `upstream_cut`, `timeout`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub incomplete: Option<String>,
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
    /// The client's wire format when it is not OpenAI chat (`anthropic`); absent on
    /// lines written before dialects, which were all OpenAI chat.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dialect: Option<String>,
    /// How many leading pinned messages stand for top-level fields (Anthropic's
    /// `system`, Responses' `instructions`) rather than list items.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_level: Option<usize>,
    /// True when the upstream holds the conversation (Responses'
    /// `previous_response_id`): logged, never rewritten.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_held: Option<bool>,
    /// The requested model.
    pub model: String,
    /// Chain digest of the request's last non-pinned message.
    pub head: Option<PrefixDigest>,
    /// Digest of the request's pinned set, if it had one.
    pub pinned: Option<Digest>,
    /// Where the set's last messages sat in the request, when `compaction.pin` found
    /// them after the history: a replay puts them back there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub floated: Vec<usize>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// How many of its messages were new to the log.
    pub new_messages: usize,
}

/// Why a line could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LineError {
    /// Not JSON, or missing a field.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// A `kind` this build does not know.
    #[error("unknown line kind {0:?}")]
    UnknownKind(String),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::digest::{message_digest, next_prefix};

    #[test]
    fn a_message_line_round_trips_with_its_raw_message() {
        let raw = RawValue::from_string(r#"{"role":"user","content":"hi","z":null,"a":1}"#.into())
            .unwrap();
        let md = message_digest(&serde_json::from_str(raw.get()).unwrap());
        let line = Line::now(Entry::Message(MessageLine {
            digest: next_prefix(None, &md),
            parent: None,
            message_digest: md,
            source: Source::Client,
            model: "m".into(),
            message: raw.clone(),
            usage: None,
            finish_reason: None,
            choice: None,
            complete: None,
            incomplete: None,
        }));
        let bytes = encode(&[line]).unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(
            text.contains(r#""message":{"role":"user","content":"hi","z":null,"a":1}"#),
            "{text}"
        );
        let back = Line::parse(bytes.trim_ascii_end()).unwrap();
        let Entry::Message(message) = back.entry else {
            panic!("not a message")
        };
        assert_eq!(message.message.get(), raw.get());
        assert_eq!(back.v, FORMAT_VERSION);
    }
}
