//! Top-level values a body repeats from an earlier body, not validated again.
//!
//! An agent re-sends its tool list and system prompt on every turn, byte for byte:
//! Claude Code's are 48–88 KB and 29 KB, most of its request, and serde validating
//! them was most of the request's parse. Once serde has read such a value as a
//! top-level member ([`remember`]), a later text that holds the same bytes at a
//! top-level member of a named key gets them replaced by an empty placeholder of
//! their own kind (`[]`, `{}`, `""`) for serde to read ([`hold`]); the dialect then
//! takes the value's bytes from the text as they are ([`Held::span`]).
//!
//! Why serde's verdict on the held text is its verdict on the whole one: the value
//! and its placeholder are both complete JSON values that end at their own closing
//! byte, so what follows reads the same after either. The scan that found the member
//! lexes strings and nesting as serde does; on a text serde accepts, they agree on
//! where every member lies, and on a text serde refuses, the dialect reads the whole
//! text again, so the error names its true place. A value is trusted only through a
//! digest, seeded per process, of bytes serde has read at the same depth.

use std::ops::Range;
use std::sync::{Arc, OnceLock};

use crate::base::chunks::keyed_hash;
use crate::base::json_lex::{skip_space, string_end};

/// A value shorter than this is validated faster than it is digested and looked up.
pub(crate) const HELD_FROM: usize = 1 << 10;

/// The leading bytes a remembered value is found by.
const HEAD: usize = 64;

/// Values remembered under one head: a few versions of one client's tool list.
const WAYS: usize = 4;

/// The heads remembered: a few tool lists and prompts per client version and tenant.
/// Only lengths and digests are kept, never the values: about 1 MB in all, so it is
/// not a setting.
const REMEMBERED: usize = 4096;

/// A value serde read: its length, and the digest of its bytes.
#[derive(Clone, Copy)]
struct Seen {
    len: usize,
    digest: u128,
}

/// The values serde read, by the hash of their first [`HEAD`] bytes.
fn seen() -> &'static quick_cache::sync::Cache<u64, Arc<[Seen]>> {
    static SEEN: OnceLock<quick_cache::sync::Cache<u64, Arc<[Seen]>>> = OnceLock::new();
    SEEN.get_or_init(|| quick_cache::sync::Cache::new(REMEMBERED))
}

/// Empties the values read before: an erased conversation's leave no trace here.
pub(crate) fn clear() {
    seen().clear();
}

/// The key of a value by its head, per tenant: no request finds (or times) another
/// tenant's values.
fn head_hash(value: &[u8]) -> Option<u64> {
    let scope = crate::cache_scope::current();
    value
        .get(..HEAD)
        .map(|head| keyed_hash(head) as u64 ^ scope)
}

/// Notes that serde read `value` as a top-level member: a later text holding the same
/// bytes there need not be read again.
pub(super) fn remember(value: &str) {
    let bytes = value.as_bytes();
    let Some(head) = head_hash(bytes).filter(|_| bytes.len() >= HELD_FROM) else {
        return;
    };
    let this = Seen {
        len: bytes.len(),
        digest: keyed_hash(bytes),
    };
    let earlier = seen().get(&head);
    let others = earlier.iter().flat_map(|list| list.iter());
    let list: Arc<[Seen]> = std::iter::once(this)
        .chain(others.filter(|seen| seen.digest != this.digest).copied())
        .take(WAYS)
        .collect();
    seen().insert(head, list);
}

/// The end of the value at `start` in `text` when its bytes are ones serde read, with
/// their digest ([`keyed_hash`]).
fn seen_end(text: &[u8], start: usize) -> Option<(usize, u128)> {
    let list = seen().get(&head_hash(text.get(start..)?)?)?;
    let closing = match text.get(start)? {
        b'[' => b']',
        b'{' => b'}',
        _ => b'"',
    };
    list.iter().find_map(|seen| {
        let end = start.checked_add(seen.len)?;
        let value = text.get(start..end)?;
        // A value of another length (a tool list that grew) seldom ends where this
        // one's would: one byte rules it out before a digest of all of them.
        (value.last() == Some(&closing) && keyed_hash(value) == seen.digest)
            .then_some((end, seen.digest))
    })
}

/// A text with the values it repeats held out.
pub(super) struct Held {
    /// What serde reads: the text with each held value's placeholder.
    pub text: String,
    /// Each held value: its key, where it lay in the original text, and its digest.
    values: Vec<HeldValue>,
}

/// A value held out of a text.
struct HeldValue {
    key: &'static str,
    span: Range<usize>,
    /// The [`keyed_hash`] of its bytes, taken when they were found to repeat.
    digest: u128,
}

impl Held {
    /// Where the value held under `key` lay in the original text. Its bytes are UTF-8,
    /// as the bytes serde read before that they repeat, though not checked again.
    pub(super) fn span(&self, key: &str) -> Option<Range<usize>> {
        self.held(key).map(|held| held.span.clone())
    }

    /// The [`keyed_hash`] of the value held under `key`: a consumer that keys a cache
    /// by the value's bytes need not digest them again.
    pub(super) fn digest(&self, key: &str) -> Option<u128> {
        self.held(key).map(|held| held.digest)
    }

    fn held(&self, key: &str) -> Option<&HeldValue> {
        self.values.iter().find(|held| held.key == key)
    }

    /// Where byte `at` of the held text lies in the original.
    pub(crate) fn original_offset(&self, at: usize) -> usize {
        let mut shift = 0;
        for HeldValue { span, .. } in &self.values {
            let placeholder_start = span.start - shift;
            if at <= placeholder_start {
                break;
            }
            shift += span.len() - PLACEHOLDER;
        }
        at + shift
    }
}

/// A placeholder's length: `[]`, `{}` and `""` alike.
const PLACEHOLDER: usize = 2;

/// `text` (a JSON object) with the top-level members under `keys` whose values serde
/// read before replaced by placeholders; `None` when none is, or when the bytes around
/// them are not UTF-8. Only those bytes are checked: a held value repeats bytes serde
/// read, and it ends at an ASCII byte, so no character straddles its edges.
pub(super) fn hold(text: &[u8], keys: &[&'static str]) -> Option<Held> {
    if text.len() < HELD_FROM {
        return None;
    }
    let mut values = Vec::new();
    if !top_members(text, |key, start| {
        held_at(text, keys, key, start, &mut values)
    }) {
        return None;
    }
    held_text(b"", text, values)
}

/// [`hold`] of the text `head` then `tail`, without joining them, where `tail` starts
/// inside the list that `head` opens (at an element, or at the list's `]`): only the
/// members after that list are searched. A body cut around the messages a memo gave
/// is read this way, so the prompt and tools after its list are neither copied nor
/// scanned twice. `None` when nothing after the list is held.
pub(crate) fn hold_after_list(head: &[u8], tail: &[u8], keys: &[&'static str]) -> Option<Held> {
    if tail.len() < HELD_FROM {
        return None;
    }
    let after = closing(tail, 0, 1)?;
    let mut values = Vec::new();
    if !members_after(tail, after, |key, start| {
        held_at(tail, keys, key, start, &mut values)
    }) {
        return None;
    }
    held_text(head, tail, values)
}

/// For the member under `key` whose value starts at `start`: its end when it is one of
/// `keys` and repeats a value serde read, noted in `values`.
fn held_at(
    text: &[u8],
    keys: &[&'static str],
    key: &[u8],
    start: usize,
    values: &mut Vec<HeldValue>,
) -> Option<usize> {
    let key = keys.iter().find(|wanted| wanted.as_bytes() == key)?;
    if !matches!(text.get(start), Some(b'[' | b'{' | b'"')) {
        return None;
    }
    let (end, digest) = seen_end(text, start)?;
    values.push(HeldValue {
        key,
        span: start..end,
        digest,
    });
    Some(end)
}

/// The text serde reads: `head`, then `text` with each of `values` (spans in `text`)
/// replaced by its placeholder; `None` when there are no values or a piece around
/// them is not UTF-8. The spans kept are in the whole text's bytes, `head` first.
fn held_text(head: &[u8], text: &[u8], mut values: Vec<HeldValue>) -> Option<Held> {
    if values.is_empty() {
        return None;
    }
    let spanned: usize = values.iter().map(|value| value.span.len()).sum();
    let kept = head.len() + text.len() - spanned + values.len() * PLACEHOLDER;
    let mut held = String::with_capacity(kept);
    let around = |range: Range<usize>| simdutf8::basic::from_utf8(text.get(range)?).ok();
    held.push_str(simdutf8::basic::from_utf8(head).ok()?);
    let mut at = 0;
    for HeldValue { span, .. } in &values {
        held.push_str(around(at..span.start)?);
        held.push_str(match text.get(span.start) {
            Some(b'[') => "[]",
            Some(b'{') => "{}",
            _ => "\"\"",
        });
        at = span.end;
    }
    held.push_str(around(at..text.len())?);
    for value in &mut values {
        value.span = value.span.start + head.len()..value.span.end + head.len();
    }
    Some(Held { text: held, values })
}

/// Walks the top-level members of `text`, in order: `known` gets each one's key (its
/// bytes between the quotes) and where its value starts, and says where the value
/// ends when it knows; the scan finds the end itself otherwise. False when `text` is
/// not an object as far as the scan can tell (serde judges it then).
fn top_members(text: &[u8], known: impl FnMut(&[u8], usize) -> Option<usize>) -> bool {
    let mut at = skip_space(text, 0);
    if text.get(at) != Some(&b'{') {
        return false;
    }
    at = skip_space(text, at + 1);
    if text.get(at) == Some(&b'}') {
        return true;
    }
    members(text, at, known)
}

/// [`top_members`] from the key that starts at `at` to the object's end.
fn members(
    text: &[u8],
    mut at: usize,
    mut known: impl FnMut(&[u8], usize) -> Option<usize>,
) -> bool {
    loop {
        if text.get(at) != Some(&b'"') {
            return false;
        }
        let Some(key_end) = string_end(text, at) else {
            return false;
        };
        let key = &text[at + 1..key_end - 1];
        at = skip_space(text, key_end);
        if text.get(at) != Some(&b':') {
            return false;
        }
        let start = skip_space(text, at + 1);
        let Some(end) = known(key, start).or_else(|| value_end(text, start)) else {
            return false;
        };
        at = skip_space(text, end);
        match text.get(at) {
            Some(b',') => at = skip_space(text, at + 1),
            Some(b'}') => return true,
            _ => return false,
        }
    }
}

/// [`top_members`] after the member whose value ends at `at`: the members that follow
/// it, to the object's end.
fn members_after(text: &[u8], at: usize, known: impl FnMut(&[u8], usize) -> Option<usize>) -> bool {
    let at = skip_space(text, at);
    match text.get(at) {
        Some(b',') => members(text, skip_space(text, at + 1), known),
        Some(b'}') => true,
        _ => false,
    }
}

/// One past the bracket that closes `depth` open arrays and objects, scanning from
/// `at`.
fn closing(text: &[u8], mut at: usize, mut depth: usize) -> Option<usize> {
    loop {
        match *text.get(at)? {
            b'"' => {
                at = string_end(text, at)?;
                continue;
            }
            b'[' | b'{' => depth += 1,
            b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(at + 1);
                }
            }
            _ => {}
        }
        at += 1;
    }
}

/// The end of the value that starts at `at`: one past its last byte.
fn value_end(text: &[u8], at: usize) -> Option<usize> {
    match *text.get(at)? {
        b'"' => string_end(text, at),
        b'[' | b'{' => closing(text, at + 1, 1),
        // A number or literal runs to the next delimiter.
        _ => {
            let rest = text.get(at..)?;
            let len = rest
                .iter()
                .position(|b| matches!(b, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))
                .unwrap_or(rest.len());
            (len > 0).then_some(at + len)
        }
    }
}

#[cfg(test)]
#[path = "repeated_tests.rs"]
mod tests;
