//! Redactions applied to a body in the client's format, or to a JSON value: each text
//! becomes its marker, `[redacted:<label>:<tag>]`, the same for the same text within a
//! tenant, and a note says how often it occurred.

use aho_corasick::{AhoCorasick, MatchKind};
use bytes::Bytes;
use handoff_plugin_api::Redaction;

use crate::base::chunks::Chunks;
use crate::base::line::RedactionNote;
use crate::config::Failure;
use crate::error::ApiError;
use crate::plugins::BuiltHook;

/// A body with redactions applied, and what each took out.
pub(super) struct Applied {
    /// The redacted body.
    pub(super) body: Bytes,
    /// What each redaction found, in the order asked.
    pub(super) found: Vec<Found>,
    /// Each redaction's marker, in the order asked.
    pub(super) markers: Vec<String>,
}

/// `body` with every occurrence of each redaction's text replaced by its marker,
/// `[redacted:<label>:<tag>]`; longer texts first where two overlap. A text is looked
/// for in each way a JSON encoder spells it inside a string ([`spellings`]), so the
/// rest of the body keeps its bytes; a text found in none of them is looked for in
/// every string of the body parsed.
pub(super) fn apply(
    body: &Chunks,
    redact: &[(String, Redaction)],
    tag: impl Fn(&str) -> String,
) -> Result<Applied, ApiError> {
    let markers = markers(redact, tag);
    let mut patterns = Vec::new();
    let mut owner = Vec::new();
    for (at, (_, redaction)) in redact.iter().enumerate() {
        for spelt in spellings(&redaction.find) {
            patterns.push(spelt);
            owner.push(at);
        }
    }
    let finder = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(&patterns)
        .map_err(|err| ApiError::internal(format!("building the redaction search: {err}")))?;
    let mut counts = vec![0usize; redact.len()];
    let mut out = Vec::with_capacity(body.len());
    finder.replace_all_with_bytes(body.contiguous(), &mut out, |found, _, dst| {
        let at = owner[found.pattern().as_usize()];
        counts[at] += 1;
        dst.extend_from_slice(markers[at].as_bytes());
        true
    });
    // A text none of the spellings found, or an occurrence spelt with escapes no
    // encoder writes (`\u0061` for `a`, some `/` escaped and some not) after one that
    // was found: the strings are read as the upstream reads them.
    if counts.contains(&0) || (has_escapes(&out) && left_in_strings(&out, redact)) {
        out = in_strings(&out, redact, &markers, &mut counts)?;
    }
    Ok(Applied {
        body: Bytes::from(out),
        found: notes(redact, counts),
        markers,
    })
}

/// The ways JSON encoders spell `text` inside a string: as serde does (only `"`, `\`
/// and control characters escaped); with every non-ASCII character as `\uXXXX`, in
/// lower and upper case hex (Python's `json.dumps`, Java's); and each of those with
/// `/` as `\/` (PHP, older JavaScript encoders).
fn spellings(text: &str) -> Vec<String> {
    let quoted = serde_json::Value::String(text.to_owned()).to_string();
    let plain = quoted[1..quoted.len() - 1].to_owned();
    let mut out = vec![plain.clone()];
    if !text.is_ascii() {
        for upper in [false, true] {
            let mut ascii = String::with_capacity(plain.len() * 2);
            for c in plain.chars() {
                if c.is_ascii() {
                    ascii.push(c);
                    continue;
                }
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    if upper {
                        ascii.push_str(&format!("\\u{unit:04X}"));
                    } else {
                        ascii.push_str(&format!("\\u{unit:04x}"));
                    }
                }
            }
            out.push(ascii);
        }
    }
    if text.contains('/') {
        let slashed: Vec<String> = out.iter().map(|s| s.replace('/', "\\/")).collect();
        out.extend(slashed);
    }
    out.dedup();
    out
}

/// True when `body` holds an escape that can spell a character another way than the
/// spellings looked for.
fn has_escapes(body: &[u8]) -> bool {
    memchr::memmem::find(body, b"\\u").is_some() || memchr::memmem::find(body, b"\\/").is_some()
}

/// True when a text is still in a string of `body` once its escapes are decoded.
fn left_in_strings(body: &[u8], redact: &[(String, Redaction)]) -> bool {
    let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(body) else {
        return false;
    };
    let finds: Vec<&str> = redact.iter().map(|(_, r)| r.find.as_str()).collect();
    let Ok(finder) = AhoCorasick::new(&finds) else {
        return true;
    };
    let mut left = false;
    walk_strings(&mut value, &mut |text: &mut String| {
        left |= finder.is_match(text.as_str());
    });
    left
}

/// `body` parsed, with the texts replaced in every string (and key), re-serialised:
/// the slow way, for spellings the fast one cannot see.
fn in_strings(
    body: &[u8],
    redact: &[(String, Redaction)],
    markers: &[String],
    counts: &mut [usize],
) -> Result<Vec<u8>, ApiError> {
    let mut value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|err| ApiError::internal(format!("reading the redacted body: {err}")))?;
    in_value(&mut value, redact, markers, counts)?;
    serde_json::to_vec(&value)
        .map_err(|err| ApiError::internal(format!("writing the redacted body: {err}")))
}

/// `value` with the texts replaced by their markers in every string, counted.
fn in_value(
    value: &mut serde_json::Value,
    redact: &[(String, Redaction)],
    markers: &[String],
    counts: &mut [usize],
) -> Result<(), ApiError> {
    let finds: Vec<&str> = redact.iter().map(|(_, r)| r.find.as_str()).collect();
    let finder = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(&finds)
        .map_err(|err| ApiError::internal(format!("building the redaction search: {err}")))?;
    let mut replace = |text: &mut String| {
        if finder.is_match(text.as_str()) {
            let mut out = String::with_capacity(text.len());
            finder.replace_all_with(text, &mut out, |found, _, dst| {
                counts[found.pattern().as_usize()] += 1;
                dst.push_str(&markers[found.pattern().as_usize()]);
                true
            });
            *text = out;
        }
    };
    walk_strings(value, &mut replace);
    Ok(())
}

/// `value` (a summary call's body) with every redaction applied to its strings, and
/// the notes of what each took out.
pub(super) fn apply_to_value(
    value: &mut serde_json::Value,
    redact: &[(String, Redaction)],
    tag: impl Fn(&str) -> String,
) -> Result<Vec<Found>, ApiError> {
    let markers = markers(redact, tag);
    let mut counts = vec![0usize; redact.len()];
    in_value(value, redact, &markers, &mut counts)?;
    Ok(notes(redact, counts))
}

fn markers(redact: &[(String, Redaction)], tag: impl Fn(&str) -> String) -> Vec<String> {
    redact
        .iter()
        .map(|(_, r)| format!("[redacted:{}:{}]", marker_label(&r.label), tag(&r.find)))
        .collect()
}

/// One text a hook asked to take out, and how often it was found.
#[derive(Debug, Clone)]
pub(super) struct Found {
    hook: String,
    label: String,
    /// Occurrences replaced.
    pub(super) count: usize,
}

fn notes(redact: &[(String, Redaction)], counts: Vec<usize>) -> Vec<Found> {
    redact
        .iter()
        .zip(counts)
        .map(|((hook, r), count)| Found {
            hook: hook.clone(),
            label: marker_label(&r.label),
            count,
        })
        .collect()
}

/// What the record notes of `found`: by hook and label, how many texts and how many
/// occurrences (the markers are in the messages; a line per text would grow the record
/// with every request of a long session).
pub(super) fn grouped(found: &[Found]) -> Vec<RedactionNote> {
    let mut out: Vec<RedactionNote> = Vec::new();
    for one in found {
        match out
            .iter_mut()
            .find(|note| note.hook == one.hook && note.label == one.label)
        {
            Some(note) => {
                note.texts += 1;
                note.count += one.count;
            }
            None => out.push(RedactionNote {
                hook: one.hook.clone(),
                label: one.label.clone(),
                texts: 1,
                count: one.count,
            }),
        }
    }
    out
}

fn walk_strings(value: &mut serde_json::Value, each: &mut impl FnMut(&mut String)) {
    match value {
        serde_json::Value::String(text) => each(text),
        serde_json::Value::Array(items) => items.iter_mut().for_each(|v| walk_strings(v, each)),
        serde_json::Value::Object(members) => {
            members.values_mut().for_each(|v| walk_strings(v, each))
        }
        _ => {}
    }
}

/// Refuses a body some redaction found nothing in when its hook fails closed: the text
/// the hook saw is there in a spelling handoff cannot rewrite (inside a JSON-encoded
/// argument string, say), and sending it would leak it.
pub(super) fn unapplied(chain: &[&BuiltHook], notes: &[Found]) -> Result<(), ApiError> {
    for note in notes.iter().filter(|note| note.count == 0) {
        let closed = chain
            .iter()
            .find(|hook| hook.name == note.hook)
            .is_none_or(|hook| hook.failure == Failure::Closed);
        tracing::warn!(hook = %note.hook, label = %note.label, closed, "a redaction found nothing in the body as sent");
        if closed {
            return Err(ApiError::hook_failed(format!(
                "middleware hook {:?} asked to redact a {} that is not in the body in a form handoff can rewrite; it fails closed",
                note.hook, note.label
            )));
        }
    }
    Ok(())
}

/// A label as it may stand in a marker: what a JSON string holds without escapes.
fn marker_label(label: &str) -> String {
    let kept: String = label
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .take(32)
        .collect();
    if kept.is_empty() {
        "text".to_owned()
    } else {
        kept
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn redaction(find: &str, label: &str) -> (String, Redaction) {
        (
            "h".into(),
            Redaction {
                find: find.into(),
                label: label.into(),
            },
        )
    }

    #[test]
    fn every_spelling_in_the_body_becomes_one_stable_marker() {
        let body = Chunks::from(
            br#"{"messages":[{"content":"mail a@b.io, say \"hi\" to a@b.io"},{"content":"x\"y"}]}"#
                .to_vec(),
        );
        let out = apply(
            &body,
            &[
                redaction("a@b.io", "email"),
                redaction("x\"y", "odd label!"),
            ],
            |text| format!("{}", text.len()),
        )
        .unwrap();
        assert_eq!(
            out.found.iter().map(|n| n.count).collect::<Vec<_>>(),
            [2, 1]
        );
        let out = String::from_utf8(out.body.to_vec()).unwrap();
        assert_eq!(
            out,
            r#"{"messages":[{"content":"mail [redacted:email:6], say \"hi\" to [redacted:email:6]"},{"content":"[redacted:oddlabel:3]"}]}"#
        );
        serde_json::from_str::<serde_json::Value>(&out).unwrap();
    }

    #[test]
    fn the_longer_of_two_overlapping_texts_wins() {
        let body = Chunks::from(br#"{"c":"sk-abc-def"}"#.to_vec());
        let out = apply(
            &body,
            &[
                redaction("sk-abc", "short"),
                redaction("sk-abc-def", "long"),
            ],
            |_| "t".into(),
        )
        .unwrap();
        assert_eq!(&out.body[..], br#"{"c":"[redacted:long:t]"}"#);
    }

    #[test]
    fn every_encoder_s_spelling_is_looked_for() {
        assert_eq!(spellings("a/b"), ["a/b", "a\\/b"]);
        assert_eq!(
            spellings("\u{e9}\u{1F600}"),
            [
                "\u{e9}\u{1F600}",
                "\\u00e9\\ud83d\\ude00",
                "\\u00E9\\uD83D\\uDE00"
            ]
        );
    }

    #[test]
    fn a_text_spelt_with_escapes_is_found_and_the_rest_keeps_its_bytes() {
        // A client that escapes `/` and non-ASCII characters (PHP, Python's json.dumps).
        let body = Chunks::from(
            br#"{"z":1, "c":"key sk\/a\u00e9b end","d":"plain sk/a\u00e9b"}"#.to_vec(),
        );
        let out = apply(&body, &[redaction("sk/a\u{e9}b", "key")], |_| "t".into()).unwrap();
        assert_eq!(out.found[0].count, 2);
        assert_eq!(
            &out.body[..],
            br#"{"z":1, "c":"key [redacted:key:t] end","d":"plain [redacted:key:t]"}"#
        );
    }

    #[test]
    fn a_text_no_encoder_s_spelling_finds_is_found_in_the_parsed_strings() {
        // An ASCII letter as an escape: no encoder writes it, but JSON allows it.
        let body = Chunks::from(br#"{"c":"key sk-\u0061b end"}"#.to_vec());
        let out = apply(&body, &[redaction("sk-ab", "key")], |_| "t".into()).unwrap();
        assert_eq!(out.found[0].count, 1);
        let value: serde_json::Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(value["c"], "key [redacted:key:t] end");
    }

    #[test]
    fn a_second_occurrence_spelt_with_escapes_is_found_too() {
        let body =
            Chunks::from(br#"{"a":"sk-ab","c":"again sk-\u0061b","d":"x/y and x\/y"}"#.to_vec());
        let out = apply(
            &body,
            &[redaction("sk-ab", "key"), redaction("x/y", "path")],
            |_| "t".into(),
        )
        .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&out.body).unwrap();
        assert_eq!(value["a"], "[redacted:key:t]");
        assert_eq!(value["c"], "again [redacted:key:t]");
        assert_eq!(value["d"], "[redacted:path:t] and [redacted:path:t]");
        assert_eq!(out.found[0].count, 2);
    }
}
