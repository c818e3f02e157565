//! Which JSON texts may name upstream objects: those that hold one of the fields their
//! ids go in, or a key spelled with a `\u` escape, which can spell any field (and which
//! the upstream reads as that field). A text that may is parsed to find the ids
//! (`ownership`); most never may, and a search spares the parse.

use std::sync::OnceLock;

use aho_corasick::AhoCorasick;

use super::json_lex::{skip_space, string_end};

/// Body fields that name upstream objects (a string or a list of strings).
pub const ID_FIELDS: &[&str] = &[
    "previous_response_id",
    "conversation",
    "file_id",
    "file_ids",
    "input_file_id",
    "vector_store_id",
    "vector_store_ids",
    "assistant_id",
    "thread_id",
    "batch_id",
    "container",
    "container_id",
];

/// The `type` of an input item that names a stored item by its `id`.
pub const REFERENCE_TYPE: &str = "item_reference";

/// True when the JSON text `body` may hold one of [`ID_FIELDS`] as a key, or an
/// [`REFERENCE_TYPE`] item: its quoted
/// name appears, or a key is spelled with a `\u` escape. `body` is a whole value, or a
/// run of a value's text cut between tokens, where no string can straddle the cut.
///
/// One pass for all the names, where a search per name (after a lossy UTF-8 copy) read
/// a long body a dozen times: 1.3M instructions on Claude Code's 87 KB request.
pub fn may_name_objects(body: &[u8]) -> bool {
    static NAMES: OnceLock<Option<AhoCorasick>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        let quoted = ID_FIELDS.iter().chain([&REFERENCE_TYPE]);
        AhoCorasick::new(quoted.map(|field| format!("\"{field}\""))).ok()
    });
    // The patterns are constants; were they ever refused, every body is parsed.
    names.as_ref().is_none_or(|names| names.is_match(body)) || escaped_key(body)
}

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
