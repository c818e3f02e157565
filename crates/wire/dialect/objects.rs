//! What the providers' APIs name their stored objects by (responses, files, batches,
//! vector stores…), as each dialect declares it ([`crate::dialect::Credentials::objects`]): the body fields
//! their ids go in, the prefixes of the ids, and the collections a `GET` lists whole.
//! Ownership keeps each object to the tenant that made it through these.
//!
//! Which JSON texts may name objects: those that hold one of the id fields, or a key
//! spelled with a `\u` escape, which can spell any field (and which the upstream reads
//! as that field). A text that may is parsed to find the ids; most never may, and a
//! search spares the parse.
//!
//! [`crate::dialect::Credentials::objects`]: super::Credentials::objects

use std::sync::OnceLock;

use aho_corasick::AhoCorasick;

use super::{unique, DialectKind};
use crate::base::json_lex::{skip_space, string_end};

/// One API's stored objects.
#[derive(Debug, Clone, Copy)]
pub struct Objects {
    /// Body fields that name objects (a string or a list of strings), at any depth.
    pub id_fields: &'static [&'static str],
    /// Prefixes of the objects' ids.
    pub id_prefixes: &'static [&'static str],
    /// Collections a `GET` lists whole: through a shared key, every team's objects.
    pub listings: &'static [&'static str],
}

impl Objects {
    /// An API that stores nothing.
    pub(crate) const NONE: Objects = Objects {
        id_fields: &[],
        id_prefixes: &[],
        listings: &[],
    };
}

/// Every dialect's `pick`, once, without repeats.
fn all(
    cell: &'static OnceLock<Vec<&'static str>>,
    pick: fn(&Objects) -> &'static [&'static str],
) -> &'static [&'static str] {
    cell.get_or_init(|| {
        unique(
            DialectKind::ALL
                .iter()
                .flat_map(|d| pick(&d.get().objects()).iter().copied()),
        )
    })
}

/// Body fields that name upstream objects, in any dialect.
pub fn id_fields() -> &'static [&'static str] {
    static CELL: OnceLock<Vec<&'static str>> = OnceLock::new();
    all(&CELL, |o| o.id_fields)
}

/// Prefixes of upstream objects' ids, in any dialect.
pub fn id_prefixes() -> &'static [&'static str] {
    static CELL: OnceLock<Vec<&'static str>> = OnceLock::new();
    all(&CELL, |o| o.id_prefixes)
}

/// Collections a `GET` lists whole, in any dialect.
pub fn listings() -> &'static [&'static str] {
    static CELL: OnceLock<Vec<&'static str>> = OnceLock::new();
    all(&CELL, |o| o.listings)
}

/// Keys named like an id that name no stored object: what a client or a model chose (a
/// tool call's id, a batch entry's `custom_id`, a metadata `user_id`).
const CHOSEN_IDS: &[&str] = &[
    "tool_call_id",
    "call_id",
    "tool_use_id",
    "custom_id",
    "user_id",
    "item_id",
    "session_id",
    "request_id",
];

/// Members whose contents a client or a model writes freely (messages, tool inputs and
/// schemas, metadata): an id-like key inside them is data, not a reference.
pub const FREE_MEMBERS: &[&str] = &[
    "messages",
    "input",
    "contents",
    "system",
    "systemInstruction",
    "system_instruction",
    "instructions",
    "tools",
    "metadata",
    "requests",
    "params",
    "parameters",
    "input_schema",
    "args",
    "arguments",
    "response",
    "content",
];

/// True when `key` is named like an object id (`*_id`, `*_ids`, `*Id`, `*Ids`) but is
/// none of the fields the APIs' tables list, nor one a client chooses: a reference to
/// an object kind handoff does not know the owner of.
pub fn unknown_id_key(key: &str) -> bool {
    let camel = |suffix: &str| {
        key.strip_suffix(suffix)
            .and_then(|head| head.chars().last())
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
    };
    let id_like = key.ends_with("_id") || key.ends_with("_ids") || camel("Id") || camel("Ids");
    id_like && !id_fields().contains(&key) && !CHOSEN_IDS.contains(&key)
}

/// True when the key whose closing quote is at `quote` in `body` is an
/// [`unknown_id_key`] or a known id field: its text read back to its opening quote, a
/// colon after it.
fn unknown_key_at(body: &[u8], quote: usize) -> bool {
    if body.get(skip_space(body, quote + 1)) != Some(&b':') {
        return false;
    }
    let Some(open) = memchr::memrchr(b'"', &body[..quote]) else {
        return false;
    };
    std::str::from_utf8(&body[open + 1..quote])
        .is_ok_and(|key| unknown_id_key(key) || id_fields().contains(&key))
}

/// The `type` of an input item that names a stored item by its `id`.
pub const REFERENCE_TYPE: &str = "item_reference";

/// True when the JSON text `body` may hold one of [`id_fields`] as a key, or an
/// [`REFERENCE_TYPE`] item: its quoted
/// name appears, or a key is spelled with a `\u` escape. `body` is a whole value, or a
/// run of a value's text cut between tokens, where no string can straddle the cut.
///
/// One pass for all the names, where a search per name (after a lossy UTF-8 copy) read
/// a long body a dozen times: 1.3M instructions on Claude Code's 87 KB request.
pub fn may_name_objects(body: &[u8]) -> bool {
    static NAMES: OnceLock<Option<AhoCorasick>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        let quoted = id_fields().iter().chain([&REFERENCE_TYPE]);
        let mut patterns: Vec<String> = quoted.map(|field| format!("\"{field}\"")).collect();
        // The ends of id-like keys, looked at whole where one is found.
        patterns.extend(ID_ENDS.iter().map(|end| (*end).to_owned()));
        AhoCorasick::builder()
            .match_kind(aho_corasick::MatchKind::LeftmostLongest)
            .build(patterns)
            .ok()
    });
    // The patterns are constants; were they ever refused, every body is parsed.
    let Some(names) = names else {
        return true;
    };
    let known = id_fields().len() + 1;
    let named = names
        .find_iter(body)
        .any(|found| found.pattern().as_usize() < known || unknown_key_at(body, found.end() - 1));
    named || escaped_key(body)
}

/// How the keys [`unknown_id_key`] looks at end, their closing quote included.
const ID_ENDS: &[&str] = &["_id\"", "_ids\"", "Id\"", "Ids\""];

/// True when a key of `body` holds a `\u` escape, or a value spelled with one reads as
/// [`REFERENCE_TYPE`]. Every backslash of a JSON text is in a string and starts an
/// escape or is escaped, so the backslashes are read in order, and a string with a
/// `\u` is read to its end once.
fn escaped_key(body: &[u8]) -> bool {
    let mut at = 0;
    while let Some(found) = body.get(at..).and_then(|rest| memchr::memchr(b'\\', rest)) {
        let slash = at + found;
        if body.get(slash + 1) != Some(&b'u') {
            at = slash + 2;
            continue;
        }
        // Read on to the string's end: a key when a colon follows it.
        let Some(end) = string_end(body, slash + 1) else {
            return false;
        };
        if body.get(skip_space(body, end)) == Some(&b':') {
            return true;
        }
        if end - slash <= SPELT_REFERENCE_MAX && spells_reference(body, slash, end) {
            return true;
        }
        at = end;
    }
    false
}

/// The longest string that decodes to [`REFERENCE_TYPE`]: every character a `\uXXXX`,
/// and its quotes.
const SPELT_REFERENCE_MAX: usize = REFERENCE_TYPE.len() * 6 + 2;

/// True when the string that holds the escape at `slash` and ends at `end` decodes to
/// [`REFERENCE_TYPE`]. Its opening quote is the nearest one before `slash` that no
/// backslash escapes; only a string short enough to is looked for.
fn spells_reference(body: &[u8], slash: usize, end: usize) -> bool {
    let floor = end.saturating_sub(SPELT_REFERENCE_MAX);
    let mut open = slash;
    let start = loop {
        let Some(quote) = memchr::memrchr(b'"', &body[floor..open]).map(|at| floor + at) else {
            return false;
        };
        let escapes = body[..quote]
            .iter()
            .rev()
            .take_while(|b| **b == b'\\')
            .count();
        if escapes % 2 == 0 {
            break quote;
        }
        open = quote;
    };
    serde_json::from_slice::<String>(&body[start..end]).is_ok_and(|text| text == REFERENCE_TYPE)
}
