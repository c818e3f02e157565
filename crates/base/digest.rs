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
//! `handoff::dialect::echo`.

use std::fmt::{self, Write as _};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

/// Domain tag of the first link, so a chain digest never equals a message digest.
const CHAIN_TAG: &[u8] = b"handoff/chain/v1";

/// The second half of every [`bytes_key`].
const KEY_TAG: &[u8; 16] = b"handoff/key/v1\0\0";

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
        // Every log line carries two or three of these: a table lookup per digit reads
        // them at a third of the cost of a branch per digit.
        let digits: &[u8; 64] = text.as_bytes().try_into().ok()?;
        let mut bytes = [0u8; 32];
        for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
            let (high, low) = (HEX[usize::from(pair[0])], HEX[usize::from(pair[1])]);
            if (high | low) > 0x0f {
                return None;
            }
            *byte = (high << 4) | low;
        }
        Some(Digest(blake3::Hash::from_bytes(bytes)))
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

/// The value of each hex digit, either case; 0xff for any other byte.
const HEX: [u8; 256] = {
    let mut table = [0xff_u8; 256];
    let mut n = 0;
    while n < 10 {
        table[b'0' as usize + n] = n as u8;
        n += 1;
    }
    let mut n = 0;
    while n < 6 {
        table[b'a' as usize + n] = 10 + n as u8;
        table[b'A' as usize + n] = 10 + n as u8;
        n += 1;
    }
    table
};

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <&str>::deserialize(deserializer)?;
        Digest::from_hex(text).ok_or_else(|| serde::de::Error::custom("invalid digest"))
    }
}

/// The digest of `message`'s canonical JSON.
pub fn message_digest(message: &Value) -> MessageDigest {
    let mut hasher = blake3::Hasher::new();
    Feed::new(&mut hasher).canonical(message);
    Digest(hasher.finalize())
}

/// The digest of `value`'s canonical JSON under a domain `tag`, for digests that
/// must never equal a message's own (echo forms).
pub fn tagged_digest(tag: &[u8], value: &Value) -> Digest {
    let mut hasher = blake3::Hasher::new();
    hasher.update(tag);
    Feed::new(&mut hasher).canonical(value);
    Digest(hasher.finalize())
}

/// The digest of raw bytes, e.g. a request's `tools` schemas.
pub fn bytes_digest(bytes: &[u8]) -> Digest {
    Digest(blake3::hash(bytes))
}

/// A fast keyed digest of raw bytes, for in-memory cache keys only (the token count of
/// a request's `tools` schemas, which agents resend whole, tens of KB, every turn): the
/// body digests' seeded xxh3-128 ([`crate::chunks::keyed_hash`]), a tenth of
/// blake3's cost, and no one can aim a collision without the seed. Never stored or shown: it names nothing outside
/// this process. Its second half is a fixed tag, so it is never a blake3 digest.
pub fn bytes_key(bytes: &[u8]) -> Digest {
    hash_key(crate::chunks::keyed_hash(bytes))
}

/// [`bytes_key`] of bytes whose keyed hash was already taken (a held tool list's).
pub fn hash_key(keyed_hash: u128) -> Digest {
    let hash = keyed_hash.to_le_bytes();
    let mut key = [0u8; 32];
    key[..16].copy_from_slice(&hash);
    key[16..].copy_from_slice(KEY_TAG);
    Digest(blake3::Hash::from_bytes(key))
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

/// Bytes gathered before they are handed to the hasher.
const FEED: usize = 2048;

/// A piece at least this long goes to the hasher as it is: blake3 hashes a long
/// input several chunks at a time, which a copy into the buffer would undo.
const DIRECT: usize = 1024;

/// Feeds a value's canonical form to a hasher without building a string. The form is
/// dozens of tiny pieces (a quote, a length, a key, a colon), and each `update` costs
/// more than such a piece, so they are gathered first: the bytes hashed, and so every
/// digest, are the same as piece by piece.
struct Feed<'h> {
    hasher: &'h mut blake3::Hasher,
    buf: [u8; FEED],
    len: usize,
}

impl<'h> Feed<'h> {
    fn new(hasher: &'h mut blake3::Hasher) -> Self {
        Self {
            hasher,
            buf: [0; FEED],
            len: 0,
        }
    }

    /// Feeds the canonical form of `value`, then everything gathered.
    fn canonical(mut self, value: &Value) {
        self.value(value);
        self.flush();
    }

    fn put(&mut self, bytes: &[u8]) {
        if bytes.len() > FEED - self.len || bytes.len() >= DIRECT {
            self.flush();
            if bytes.len() >= DIRECT {
                self.hasher.update(bytes);
                return;
            }
        }
        match self.buf.get_mut(self.len..self.len + bytes.len()) {
            Some(slot) => {
                slot.copy_from_slice(bytes);
                self.len += bytes.len();
            }
            // Unreachable: the piece fits after a flush. Hashed in order regardless.
            None => {
                self.flush();
                self.hasher.update(bytes);
            }
        }
    }

    fn flush(&mut self) {
        self.hasher.update(&self.buf[..self.len.min(FEED)]);
        self.len = 0;
    }

    fn value(&mut self, value: &Value) {
        match value {
            Value::Object(map) => {
                self.put(b"{");
                let kept = |(_, v): &(&String, &Value)| !is_elided(v);
                if map.keys().is_sorted() {
                    // serde_json's map is ordered by key unless a crate in the build
                    // asks for insertion order: then the keys are sorted here.
                    for (key, child) in map.iter().filter(kept) {
                        self.member(key, child);
                    }
                } else {
                    let mut members: Vec<(&String, &Value)> = map.iter().filter(kept).collect();
                    members.sort_unstable_by_key(|(key, _)| *key);
                    for (key, child) in members {
                        self.member(key, child);
                    }
                }
                self.put(b"}");
            }
            Value::Array(items) => {
                self.put(b"[");
                for item in items {
                    self.value(item);
                    self.put(b",");
                }
                self.put(b"]");
            }
            Value::String(text) => self.string(text),
            Value::Null => self.put(b"null"),
            Value::Bool(true) => self.put(b"true"),
            Value::Bool(false) => self.put(b"false"),
            Value::Number(number) => {
                // The text `to_string` gives, without its String.
                let _ = write!(self, "{number}");
            }
        }
    }

    fn member(&mut self, key: &str, child: &Value) {
        self.string(key);
        self.put(b":");
        self.value(child);
        self.put(b",");
    }

    fn string(&mut self, text: &str) {
        // Length-prefixed, so no string content can imitate the structure around it.
        self.put(b"\"");
        self.put(&(text.len() as u64).to_le_bytes());
        self.put(text.as_bytes());
    }
}

impl fmt::Write for Feed<'_> {
    fn write_str(&mut self, text: &str) -> fmt::Result {
        self.put(text.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
#[path = "digest_golden_tests.rs"]
mod golden_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_bytes_key_names_the_bytes_in_this_process_and_is_never_a_digest() {
        let tools = br#"[{"type":"function","function":{"name":"ls"}}]"#;
        let elsewhere = tools.to_vec();
        assert_eq!(bytes_key(tools), bytes_key(&elsewhere));
        assert_ne!(bytes_key(tools), bytes_key(&tools[1..]));
        assert_ne!(bytes_key(tools), bytes_key(b""));
        assert_ne!(bytes_key(tools), bytes_digest(tools));
        assert!(bytes_key(tools).hex().ends_with(&hex_of(KEY_TAG)));
        // A held tool list's hash, taken once, keys its count as its bytes would.
        let taken = crate::chunks::keyed_hash(tools);
        assert_eq!(hash_key(taken), bytes_key(tools));
    }

    fn hex_of(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn key_order_nulls_and_empty_arrays_do_not_change_the_digest() {
        let upstream = json!({"role": "assistant", "content": "hi"});
        let echoed =
            json!({"content": "hi", "refusal": null, "tool_calls": [], "role": "assistant"});
        assert_eq!(message_digest(&upstream), message_digest(&echoed));
        let edited = json!({"role": "assistant", "content": "hi!"});
        assert_ne!(message_digest(&upstream), message_digest(&edited));
    }

    /// The canonical form as first written, one `update` per piece: the definition
    /// every digest on disk was made by.
    fn piecewise(value: &Value, hasher: &mut blake3::Hasher) {
        let string = |text: &str, hasher: &mut blake3::Hasher| {
            hasher.update(b"\"");
            hasher.update(&(text.len() as u64).to_le_bytes());
            hasher.update(text.as_bytes());
        };
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
                    string(key, hasher);
                    hasher.update(b":");
                    piecewise(&map[key.as_str()], hasher);
                    hasher.update(b",");
                }
                hasher.update(b"}");
            }
            Value::Array(items) => {
                hasher.update(b"[");
                for item in items {
                    piecewise(item, hasher);
                    hasher.update(b",");
                }
                hasher.update(b"]");
            }
            Value::String(text) => string(text, hasher),
            other => {
                hasher.update(other.to_string().as_bytes());
            }
        }
    }

    #[test]
    fn gathering_the_pieces_hashes_the_same_bytes() {
        let long = "é".repeat(700);
        let values = [
            json!({"role": "assistant", "content": "Hello from the benchmark upstream."}),
            json!({"z": [1, -2, 3.5, 1e300, true, false, null, [], {}], "a": {"y": null, "b": "x"}}),
            // Pieces longer than the direct threshold, and a form longer than the buffer.
            json!({"role": "user", "content": long, "parts": (0..300).map(|n| format!("p{n}")).collect::<Vec<_>>()}),
            json!("plain"),
            json!(42),
        ];
        for value in &values {
            let mut reference = blake3::Hasher::new();
            piecewise(value, &mut reference);
            assert_eq!(
                message_digest(value),
                Digest(reference.finalize()),
                "{value}"
            );
        }
        // And the digest the previous build logged for this reply (benchmark upstream).
        assert_eq!(
            message_digest(&values[0]).to_hex(),
            "b118ff0d1869f84aaa650c3d8819d76937b8de3903ee2daa2b7f4651842004b5"
        );
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
