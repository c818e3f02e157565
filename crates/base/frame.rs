//! The framing of a log line: one line is always one `\n`-terminated line, whatever
//! bytes a client or an upstream sent.
//!
//! Messages are logged as the bytes that arrived (`RawValue`), and JSON allows raw
//! line breaks as whitespace between tokens, so a message could end its line and start
//! lines of its own that a reader takes for the proxy's. A written line that holds a
//! `\n` or a `\r` is therefore wrapped whole as a JSON string in an `escaped` line: the
//! wrapper's fields are the proxy's, the client's bytes are only ever inside the
//! string, and the reader gets them back exactly. Lines without a break, which is
//! nearly all of them, are written as they were.

use serde::{Deserialize, Serialize};

use super::version::ESCAPED_VERSION;

/// The `kind` of a line that carries another line as a string.
pub const ESCAPED_KIND: &str = "escaped";

/// A line written as a JSON string, so its breaks are escapes.
#[derive(Serialize, Deserialize)]
struct EscapedLine<'a> {
    v: u32,
    at: &'a str,
    kind: &'a str,
    /// The line, exactly as it would have been written.
    line: std::borrow::Cow<'a, str>,
}

/// True when `bytes` would not stay one line of a JSONL file: a `\n`, or a `\r` that
/// readers in universal-newline mode take for one.
pub fn breaks_line(bytes: &[u8]) -> bool {
    memchr::memchr2(b'\n', b'\r', bytes).is_some()
}

/// Rewrites the line written into `out[start..]` as an `escaped` line when it holds a
/// line break; `at` is the time the wrapper carries.
pub fn escape_breaks(out: &mut Vec<u8>, start: usize, at: &str) -> Result<(), serde_json::Error> {
    if !breaks_line(&out[start..]) {
        return Ok(());
    }
    let written = out.split_off(start);
    let line = String::from_utf8(written).map_err(serde::ser::Error::custom)?;
    serde_json::to_writer(
        out,
        &EscapedLine {
            v: ESCAPED_VERSION,
            at,
            kind: ESCAPED_KIND,
            line: line.into(),
        },
    )
}

/// The line an `escaped` line carries, refused when it holds no break (the writer
/// wraps only lines that do). The caller refuses one that is `escaped` again.
pub fn unescape(bytes: &[u8]) -> Result<String, FrameError> {
    let escaped: EscapedLine<'_> = serde_json::from_slice(bytes)?;
    let line = escaped.line.into_owned();
    if !breaks_line(line.as_bytes()) {
        return Err(FrameError::NoBreak);
    }
    Ok(line)
}

/// Why an `escaped` line could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// Not JSON, or not the wrapper's shape.
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    /// It carries an `escaped` line: never written.
    #[error("an escaped line inside an escaped line")]
    Nested,
    /// It carries a line without a break: never written.
    #[error("an escaped line whose line holds no line break")]
    NoBreak,
}
