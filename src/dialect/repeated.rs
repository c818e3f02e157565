//! Top-level values a body repeats from an earlier body, not validated again.
//!
//! An agent re-sends its tool list and system prompt on every turn, byte for byte:
//! Claude Code's are 48–88 KB and 29 KB, most of its request, and serde validating
//! them was most of the request's parse. Once serde has read such a value as a
//! top-level member ([`remember`]), a later text that holds the same bytes at a
//! top-level member of a named key gets them replaced by an empty placeholder of
//! their own kind (`[]`, `{}`, `""`) for serde to read ([`hold`]); the dialect then
//! takes the value's bytes from the text as they are ([`Held::value`]).
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
pub const HELD_FROM: usize = 1 << 10;

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

fn head_hash(value: &[u8]) -> Option<u64> {
    value.get(..HEAD).map(|head| keyed_hash(head) as u64)
}

/// Notes that serde read `value` as a top-level member: a later text holding the same
/// bytes there need not be read again.
pub fn remember(value: &str) {
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
pub struct Held {
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
    /// The original bytes of the value held under `key`: UTF-8, as the bytes serde
    /// read before that they repeat, though not checked again.
    pub fn value<'t>(&self, original: &'t [u8], key: &str) -> Option<&'t [u8]> {
        original.get(self.held(key)?.span.clone())
    }

    /// The [`keyed_hash`] of the value held under `key`: a consumer that keys a cache
    /// by the value's bytes need not digest them again.
    pub fn digest(&self, key: &str) -> Option<u128> {
        self.held(key).map(|held| held.digest)
    }

    fn held(&self, key: &str) -> Option<&HeldValue> {
        self.values.iter().find(|held| held.key == key)
    }

    /// Where byte `at` of the held text lies in the original.
    pub fn original_offset(&self, at: usize) -> usize {
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
pub fn hold(text: &[u8], keys: &[&'static str]) -> Option<Held> {
    if text.len() < HELD_FROM {
        return None;
    }
    let mut values = Vec::new();
    let whole = top_members(text, |key, start| {
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
    });
    if !whole || values.is_empty() {
        return None;
    }
    let spanned: usize = values.iter().map(|value| value.span.len()).sum();
    let mut held = String::with_capacity(text.len() - spanned + values.len() * PLACEHOLDER);
    let mut at = 0;
    let around = |range: Range<usize>| simdutf8::basic::from_utf8(text.get(range)?).ok();
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
    Some(Held { text: held, values })
}

/// Walks the top-level members of `text`, in order: `known` gets each one's key (its
/// bytes between the quotes) and where its value starts, and says where the value
/// ends when it knows; the scan finds the end itself otherwise. False when `text` is
/// not an object as far as the scan can tell (serde judges it then).
fn top_members(text: &[u8], mut known: impl FnMut(&[u8], usize) -> Option<usize>) -> bool {
    let mut at = skip_space(text, 0);
    if text.get(at) != Some(&b'{') {
        return false;
    }
    at = skip_space(text, at + 1);
    if text.get(at) == Some(&b'}') {
        return true;
    }
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

/// The end of the value that starts at `at`: one past its last byte.
fn value_end(text: &[u8], at: usize) -> Option<usize> {
    match *text.get(at)? {
        b'"' => string_end(text, at),
        b'[' | b'{' => {
            let mut depth = 0usize;
            let mut at = at;
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
mod tests {
    use super::*;
    use crate::base::chunks::Chunks;
    use crate::dialect::anthropic::AnthropicMessages;
    use crate::dialect::openai::OpenAiChat;
    use crate::dialect::{ChatRequest, Dialect};

    fn members(text: &str) -> Option<Vec<(String, String)>> {
        let mut out = Vec::new();
        top_members(text.as_bytes(), |key, start| {
            let end = value_end(text.as_bytes(), start)?;
            out.push((
                String::from_utf8_lossy(key).into_owned(),
                text[start..end].to_owned(),
            ));
            Some(end)
        })
        .then_some(out)
    }

    #[test]
    fn members_are_found_past_strings_that_look_like_structure() {
        let text = r#" { "a" : "x\"}],{\\" , "tools":[{"d":"]}\"["},[1,{}]] ,"n":-1.5e3,"t":true,"o":{"k":[]}}"#;
        let found = members(text).unwrap();
        let keys: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(keys, ["a", "tools", "n", "t", "o"]);
        assert_eq!(found[0].1, r#""x\"}],{\\""#);
        assert_eq!(found[1].1, r#"[{"d":"]}\"["},[1,{}]]"#);
        assert_eq!(found[2].1, "-1.5e3");
        assert_eq!(found[4].1, r#"{"k":[]}"#);
        assert_eq!(members("{}").unwrap(), vec![]);
        for broken in [
            "[1]",
            r#"{"a":[1}"#,
            r#"{"a" 1}"#,
            r#"{"a":"x}"#,
            r#"{"a":1"#,
        ] {
            assert!(members(broken).is_none(), "{broken}");
        }
    }

    #[test]
    fn only_values_serde_read_before_are_held_and_offsets_map_back() {
        let tools = format!(r#"[{{"name":"a","description":"{}"}}]"#, "t".repeat(2000));
        let system = format!(r#""{}""#, "s".repeat(1500));
        let text =
            format!(r#"{{"system":{system},"messages":[{{"role":"user"}}],"tools":{tools}}}"#);
        assert!(
            hold(text.as_bytes(), &["system", "tools"]).is_none(),
            "nothing read yet"
        );
        remember(&tools);
        let held = hold(text.as_bytes(), &["system", "tools"]).unwrap();
        assert_eq!(
            held.text,
            format!(r#"{{"system":{system},"messages":[{{"role":"user"}}],"tools":[]}}"#)
        );
        assert_eq!(held.value(text.as_bytes(), "tools"), Some(tools.as_bytes()));
        assert_eq!(held.value(text.as_bytes(), "system"), None);

        remember(&system);
        let held = hold(text.as_bytes(), &["system", "tools"]).unwrap();
        assert_eq!(
            held.text,
            r#"{"system":"","messages":[{"role":"user"}],"tools":[]}"#
        );
        let user = held.text.find(r#"{"role""#).unwrap();
        assert_eq!(
            &text[held.original_offset(user)..][..15],
            r#"{"role":"user"}"#
        );
        // Not a key it was asked for; a value one byte off is not the one read.
        assert!(hold(text.as_bytes(), &["instructions"]).is_none());
        let other = text.replace("tttt\"", "tttu\"");
        assert!(hold(other.as_bytes(), &["tools"]).is_none());
    }

    /// True when `part` lies inside `body`'s one buffer: shared, not copied.
    fn shares(body: &Chunks, part: Option<&[u8]>) -> bool {
        let (whole, part) = (body.contiguous(), part.unwrap_or_default());
        let start = whole.as_ptr() as usize;
        let at = part.as_ptr() as usize;
        !part.is_empty() && at >= start && at + part.len() <= start + whole.len()
    }

    /// An Anthropic body with a system prompt and tools named after `tag`, and `rest`
    /// after the tools.
    fn agent_body(tag: &str, messages: &str, rest: &str) -> Chunks {
        let tools = format!(
            r#"[{{"name":"{tag}","description":"{}","input_schema":{{"type":"object"}}}}]"#,
            "d\\\"]}".repeat(400)
        );
        let system = format!(r#""{tag} {}""#, "s".repeat(2000));
        Chunks::from(
            format!(
                r#"{{"model":"m","messages":{messages},"system":{system},"tools":{tools}{rest}}}"#
            )
            .into_bytes(),
        )
    }

    #[test]
    fn a_repeated_system_and_tools_read_as_the_first_time_and_errors_keep_their_place() {
        let messages = r#"[{"role":"user","content":"hi"},{"role":"assistant","content":"yes"},{"role":"user","content":"go"}]"#;
        let first = AnthropicMessages
            .parse_body(&agent_body("held-a", messages, ""))
            .unwrap();
        let body = agent_body("held-a", messages, r#","max_tokens":7"#);
        let held =
            hold(body.contiguous(), &["system", "tools"]).expect("both repeat the first body's");
        assert!(
            held.text.contains(r#""system":"","tools":[]"#),
            "{}",
            held.text
        );

        let again = AnthropicMessages.parse_body(&body).unwrap();
        assert_eq!(again.tools, first.tools);
        assert!(again
            .tools
            .as_deref()
            .unwrap()
            .starts_with(br#"[{"name":"held-a""#));
        assert!(
            shares(&body, again.tools.as_deref()),
            "held tools are not copied"
        );
        assert_eq!(again.max_output, Some(7));
        let raws = |request: &ChatRequest| -> Vec<String> {
            request
                .messages
                .iter()
                .map(|m| m.raw.get().to_owned())
                .collect()
        };
        assert_eq!(raws(&again), raws(&first));
        assert!(
            raws(&again)[0].contains("held-a ssss"),
            "the system prompt is the first message"
        );

        // Broken after the held values: the error is the whole body's, at its true place.
        let broken = agent_body("held-a", messages, r#","max_tokens":7,"#);
        let whole: Result<serde_json::Value, _> = serde_json::from_slice(broken.contiguous());
        let column = whole.unwrap_err().column();
        let err = AnthropicMessages
            .parse_body(&broken)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("column {column}")),
            "{err} (column {column})"
        );
    }

    #[test]
    fn bytes_beside_held_values_that_are_not_utf8_are_refused_where_they_are() {
        let messages = r#"[{"role":"user","content":"fine"}]"#;
        AnthropicMessages
            .parse_body(&agent_body("held-e", messages, ""))
            .unwrap();
        let fine = agent_body("held-e", messages, "");
        assert!(hold(fine.contiguous(), &["system", "tools"]).is_some());
        for at in ["fine", "\"tools\""] {
            let mut broken = fine.contiguous().to_vec();
            let place = fine
                .contiguous()
                .windows(at.len())
                .position(|window| window == at.as_bytes())
                .unwrap();
            // Inside a message, and inside the key between the held values.
            broken[place + 1] = 0xff;
            let whole = serde_json::from_slice::<serde_json::Value>(&broken).unwrap_err();
            assert!(hold(&broken, &["system", "tools"]).is_none(), "{at}");
            let err = AnthropicMessages
                .parse_body(&Chunks::from(broken))
                .unwrap_err()
                .to_string();
            assert!(err.ends_with(&whole.to_string()), "{err} / {whole}");
        }
    }

    #[test]
    fn a_value_is_held_only_at_the_top_level_under_its_key() {
        let first = agent_body("held-b", "[]", "");
        AnthropicMessages.parse_body(&first).unwrap();
        let text = std::str::from_utf8(first.contiguous()).unwrap();
        let tools = &text[text.find(r#""tools":"#).unwrap() + 8..text.len() - 1];
        // The same bytes inside a message, and under another key, are read as usual.
        let inside = format!(r#"{{"model":"m","messages":[{{"role":"user","content":{tools}}}]}}"#);
        assert!(hold(inside.as_bytes(), &["tools"]).is_none());
        let other = format!(r#"{{"model":"m","messages":[],"metadata":{tools}}}"#);
        assert!(hold(other.as_bytes(), &["tools"]).is_none());
        let top = format!(r#"{{"model":"m","messages":[],"tools":{tools}}}"#);
        assert!(hold(top.as_bytes(), &["tools"]).is_some());
    }

    #[test]
    fn a_long_body_takes_its_repeated_messages_and_values_both() {
        let turn = |n: usize| {
            format!(
                r#"{{"role":"user","content":"{n} {}"}},{{"role":"assistant","content":"ok {n}"}}"#,
                "w".repeat(1000)
            )
        };
        let list =
            |turns: usize| format!("[{}]", (0..turns).map(turn).collect::<Vec<_>>().join(","));
        let first = AnthropicMessages
            .parse_body(&agent_body("held-c", &list(40), ""))
            .unwrap();
        let longer = agent_body("held-c", &list(41), "");
        let again = AnthropicMessages.parse_body(&longer).unwrap();
        assert_eq!(again.tools, first.tools);
        // Held in the text cut around the reused messages, and found in the body past them.
        assert!(shares(&longer, again.tools.as_deref()));
        assert_eq!(again.messages.len(), first.messages.len() + 2);
        let text = std::str::from_utf8(longer.contiguous()).unwrap();
        let span = again.list.clone().unwrap();
        assert!(text[span].starts_with(r#"[{"role":"user","content":"0 www"#));
        for message in &again.messages[1..] {
            let raw = message.raw.get();
            assert!(
                text.contains(raw) && raw.starts_with('{') && raw.ends_with('}'),
                "{raw}"
            );
        }
    }

    #[test]
    fn messages_after_a_held_value_keep_their_places() {
        let tools = format!(
            r#"[{{"type":"function","function":{{"name":"held-d","description":"{}"}}}}]"#,
            "x".repeat(3000)
        );
        let body = |turns: usize| {
            let list: Vec<String> = (0..turns)
                .map(|n| format!(r#"{{"role":"user","content":"{n} {}"}}"#, "v".repeat(900)))
                .collect();
            Chunks::from(
                format!(r#"{{"tools":{tools},"messages":[{}]}}"#, list.join(",")).into_bytes(),
            )
        };
        for turns in [3, 4, 50, 51] {
            let body = body(turns);
            let request = OpenAiChat.parse_body(&body).unwrap();
            let text = std::str::from_utf8(body.contiguous()).unwrap();
            assert_eq!(request.tools.as_deref(), Some(tools.as_bytes()));
            assert!(
                turns == 3 || shares(&body, request.tools.as_deref()),
                "{turns}"
            );
            let span = request.list.clone().expect("the list's place");
            assert!(text[span.clone()].starts_with(r#"[{"role":"user","content":"0 vvv"#));
            assert_eq!(span.end, text.len() - 1);
        }
    }
}
