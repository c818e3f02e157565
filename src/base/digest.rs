//! Message digests and the prefix chain that names every conversation prefix.
//!
//! A message's digest is blake3 over its canonical JSON: keys sorted, and `null`
//! members and empty arrays left out, because SDKs echo an assistant reply back with
//! `"refusal": null` or `"tool_calls": []` that the upstream never sent. Without that,
//! every echoed reply would fork the conversation.
//!
//! `d[0] = H(tag ‖ m[0])`, `d[i] = H(d[i-1] ‖ m[i])`: `d[i]` identifies exactly `m[0..=i]`.
//!
//!
//! How clients re-send a logged message in other forms is the wire formats' business:
//! [`crate::dialect::echo`].

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Domain tag of the first link, so a chain digest never equals a message digest.
const CHAIN_TAG: &[u8] = b"handoff/chain/v1";

/// A blake3 digest, shown and stored as 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Digest(blake3::Hash);

impl std::hash::Hash for Digest {
    /// Its first 8 bytes: a digest is already uniform, and the sets and maps of a
    /// conversation's digests are looked up several times per request. The map's own
    /// keyed hasher still mixes them, and equality compares all 32 bytes.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        let mut head = [0u8; 8];
        head.copy_from_slice(&self.0.as_bytes()[..8]);
        state.write_u64(u64::from_le_bytes(head));
    }
}

/// The digest of one message's canonical JSON.
pub type MessageDigest = Digest;

/// The chain digest naming an exact prefix of non-pinned messages.
pub type PrefixDigest = Digest;

impl Digest {
    /// Parses 64 hex digits.
    pub fn from_hex(text: &str) -> Option<Self> {
        blake3::Hash::from_hex(text).ok().map(Digest)
    }

    /// The 64-digit hex form.
    pub fn to_hex(&self) -> String {
        self.0.to_hex().to_string()
    }

    /// The 64 hex digits, on the stack.
    pub fn hex(&self) -> impl std::ops::Deref<Target = str> {
        self.0.to_hex()
    }

    /// The first `n` hex digits, for display.
    pub fn short(&self, n: usize) -> String {
        let hex = self.0.to_hex();
        hex[..n.min(hex.len())].to_owned()
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({})", self.short(12))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0.to_hex())
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0.to_hex())
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <&str>::deserialize(deserializer)?;
        Digest::from_hex(text).ok_or_else(|| serde::de::Error::custom("invalid digest"))
    }
}

/// The digest of `message`'s canonical JSON.
pub fn message_digest(message: &Value) -> MessageDigest {
    let mut hasher = blake3::Hasher::new();
    hash_canonical(message, &mut hasher);
    Digest(hasher.finalize())
}

/// The digest of `value`'s canonical JSON under a domain `tag`, for digests that
/// must never equal a message's own (echo forms).
pub fn tagged_digest(tag: &[u8], value: &Value) -> Digest {
    let mut hasher = blake3::Hasher::new();
    hasher.update(tag);
    hash_canonical(value, &mut hasher);
    Digest(hasher.finalize())
}

/// The digest of raw bytes, e.g. a request's `tools` schemas.
pub fn bytes_digest(bytes: &[u8]) -> Digest {
    Digest(blake3::hash(bytes))
}

/// The chain link after `parent` for a message with digest `message`.
pub fn next_prefix(parent: Option<&PrefixDigest>, message: &MessageDigest) -> PrefixDigest {
    let mut hasher = blake3::Hasher::new();
    match parent {
        Some(parent) => hasher.update(parent.0.as_bytes()),
        None => hasher.update(CHAIN_TAG),
    };
    hasher.update(message.0.as_bytes());
    Digest(hasher.finalize())
}

/// The chain digests of `digests`, in order.
pub fn prefix_digests(digests: &[MessageDigest]) -> Vec<PrefixDigest> {
    prefix_digests_after(None, digests)
}

/// The chain digests of `digests` continuing the prefix `base` (a server-held
/// conversation's new items continue the response they follow).
pub fn prefix_digests_after(
    base: Option<PrefixDigest>,
    digests: &[MessageDigest],
) -> Vec<PrefixDigest> {
    let mut out: Vec<PrefixDigest> = Vec::with_capacity(digests.len());
    for digest in digests {
        let next = next_prefix(out.last().or(base.as_ref()), digest);
        out.push(next);
    }
    out
}

/// The digest of a set of pinned messages, to log each distinct set once.
pub fn pinned_digest(messages: &[&Value]) -> Digest {
    let mut hasher = blake3::Hasher::new();
    hasher.update(b"handoff/pinned/v1");
    for message in messages {
        hasher.update(message_digest(message).0.as_bytes());
    }
    Digest(hasher.finalize())
}

fn is_elided(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Array(items) => items.is_empty(),
        _ => false,
    }
}

/// Feeds the canonical form of `value` to `hasher` without building a string.
fn hash_canonical(value: &Value, hasher: &mut blake3::Hasher) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map
                .iter()
                .filter(|(_, v)| !is_elided(v))
                .map(|(k, _)| k)
                .collect();
            keys.sort_unstable();
            hasher.update(b"{");
            for key in keys {
                hash_string(key, hasher);
                hasher.update(b":");
                if let Some(child) = map.get(key) {
                    hash_canonical(child, hasher);
                }
                hasher.update(b",");
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for item in items {
                hash_canonical(item, hasher);
                hasher.update(b",");
            }
            hasher.update(b"]");
        }
        Value::String(text) => hash_string(text, hasher),
        other => {
            hasher.update(other.to_string().as_bytes());
        }
    }
}

fn hash_string(text: &str, hasher: &mut blake3::Hasher) {
    // Length-prefixed, so no string content can imitate the structure around it.
    hasher.update(b"\"");
    hasher.update(&(text.len() as u64).to_le_bytes());
    hasher.update(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn key_order_nulls_and_empty_arrays_do_not_change_the_digest() {
        let upstream = json!({"role": "assistant", "content": "hi"});
        let echoed =
            json!({"content": "hi", "refusal": null, "tool_calls": [], "role": "assistant"});
        assert_eq!(message_digest(&upstream), message_digest(&echoed));
        let edited = json!({"role": "assistant", "content": "hi!"});
        assert_ne!(message_digest(&upstream), message_digest(&edited));
    }

    #[test]
    fn string_boundaries_cannot_be_forged() {
        let a = json!({"a": "b\",\"c"});
        let b = json!({"a": "b", "c": ""});
        assert_ne!(message_digest(&a), message_digest(&b));
    }

    #[test]
    fn each_prefix_digest_names_its_whole_prefix() {
        let m: Vec<_> = ["a", "b", "c"]
            .iter()
            .map(|t| message_digest(&json!({"role": "user", "content": t})))
            .collect();
        let d = prefix_digests(&m);
        let swapped = prefix_digests(&[m[1], m[0], m[2]]);
        assert_ne!(d[2], swapped[2], "order matters");
        assert_eq!(d[1], next_prefix(Some(&d[0]), &m[1]));
        assert_eq!(Digest::from_hex(&d[2].to_hex()), Some(d[2]));
    }
}
