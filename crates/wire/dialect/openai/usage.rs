//! Usage for a streamed chat request that did not ask for it: handoff asks the
//! upstream (`stream_options.include_usage`), so the reply log and calibration get
//! the count, and takes it out of the client's stream again, leaving the bytes the
//! client would have got: OpenAI then adds `"usage":null` to every chunk and one last
//! chunk with empty `choices` and the usage, both removed here. The usage chunk goes
//! only from a stream that showed those nulls: an upstream that ignores
//! `stream_options` and sends usage anyway would have sent it to the client too.

use bytes::{Bytes, BytesMut};

use crate::base::chunks::Chunks;

use crate::rewrite::{trim_break, Lines, Rewrite};

/// The member handoff adds at the start of the body.
const ASK: &[u8] = br#""stream_options":{"include_usage":true},"#;

/// `body` (a JSON object) asking for usage in its stream, in parts sent one after the
/// other: its opening with the member handoff adds, then the rest of `body`, shared,
/// not copied.
pub(super) fn ask(body: &Chunks) -> Option<Vec<Bytes>> {
    let open = body.position(0, |b| !b.is_ascii_whitespace())?;
    if body.byte(open)? != b'{' {
        return None;
    }
    let mut head = Vec::with_capacity(open + 1 + ASK.len());
    body.copy_into(0..open + 1, &mut head);
    let empty = body
        .position(open + 1, |b| !b.is_ascii_whitespace())
        .and_then(|at| body.byte(at))
        .is_some_and(|b| b == b'}');
    if empty {
        head.extend_from_slice(&ASK[..ASK.len() - 1]);
    } else {
        head.extend_from_slice(ASK);
    }
    let mut parts = vec![Bytes::from(head)];
    parts.extend(body.parts_of(open + 1..body.len()));
    Some(parts)
}

/// Takes the usage handoff asked for out of an OpenAI chat stream, line by line.
#[derive(Debug, Default)]
pub(crate) struct StripUsage {
    lines: Lines,
    /// The usage chunk's line was dropped: so is the blank line that closes its event.
    drop_blank: bool,
    /// A chunk carried the `"usage":null` that asking adds: the upstream honoured it.
    honoured: bool,
}

impl StripUsage {
    /// The client's form of one whole line (its line break included), or nothing.
    fn line(&mut self, line: &[u8], out: &mut BytesMut) {
        let body = trim_break(line);
        if self.drop_blank {
            self.drop_blank = false;
            if body.is_empty() {
                return;
            }
        }
        let Some(data) = body.strip_prefix(b"data:") else {
            out.extend_from_slice(line);
            return;
        };
        if self.honoured {
            match usage_chunk(data) {
                UsageChunk::Not => {}
                UsageChunk::Only => {
                    self.drop_blank = true;
                    return;
                }
                UsageChunk::With(rest) => {
                    // Other data rode along (Azure's `prompt_filter_results`): only
                    // the usage the client never asked for goes.
                    out.extend_from_slice(b"data: ");
                    out.extend_from_slice(&rest);
                    out.extend_from_slice(&line[body.len()..]);
                    return;
                }
            }
        }
        match strip_null_usage(body) {
            Some((before, after)) => {
                self.honoured = true;
                out.extend_from_slice(before);
                out.extend_from_slice(after);
                out.extend_from_slice(&line[body.len()..]);
            }
            None => out.extend_from_slice(line),
        }
    }
}

impl Rewrite for StripUsage {
    fn data(&mut self, data: Bytes) -> Bytes {
        let mut lines = std::mem::take(&mut self.lines);
        let out = lines.feed(&data, |line, out| self.line(line, out));
        self.lines = lines;
        out
    }

    fn end(&mut self) -> Bytes {
        self.lines.rest().freeze()
    }
}

/// What a chunk is to the usage handoff asked for.
enum UsageChunk {
    /// Not the usage chunk.
    Not,
    /// The usage chunk and nothing else: the chunk's envelope, empty `choices`, usage.
    Only,
    /// The usage chunk with more data: that data without the usage, as JSON.
    With(Vec<u8>),
}

/// The members a bare usage chunk has beside `choices` and `usage`.
const ENVELOPE: &[&str] = &[
    "id",
    "object",
    "created",
    "model",
    "system_fingerprint",
    "service_tier",
    "obfuscation",
    "choices",
    "usage",
];

/// Reads a chunk with empty `choices` and a usage object.
fn usage_chunk(data: &[u8]) -> UsageChunk {
    if !contains(data, b"\"usage\"") {
        return UsageChunk::Not;
    }
    let Ok(serde_json::Value::Object(mut chunk)) =
        serde_json::from_slice::<serde_json::Value>(data.trim_ascii())
    else {
        return UsageChunk::Not;
    };
    let no_choices = chunk
        .get("choices")
        .and_then(|c| c.as_array())
        .is_some_and(|c| c.is_empty());
    if !(no_choices && chunk.get("usage").is_some_and(|u| u.is_object())) {
        return UsageChunk::Not;
    }
    if chunk.keys().all(|key| ENVELOPE.contains(&key.as_str())) {
        return UsageChunk::Only;
    }
    chunk.remove("usage");
    match serde_json::to_vec(&chunk) {
        Ok(rest) => UsageChunk::With(rest),
        Err(_) => UsageChunk::Not,
    }
}

/// The line around a `"usage":null` member that closes the chunk's object, as the
/// text before the member's comma and the closing brace on: what the chunk is without
/// it. Anywhere else the member stays (a client that never asked reads it as absent).
fn strip_null_usage(line: &[u8]) -> Option<(&[u8], &[u8])> {
    let end = line.iter().rposition(|b| !b.is_ascii_whitespace())?;
    if line[end] != b'}' {
        return None;
    }
    let mut at = skip_back_ws(line, end);
    at = at.checked_sub(4).filter(|&s| &line[s..at] == b"null")?;
    at = skip_back_ws(line, at);
    at = at.checked_sub(1).filter(|&s| line[s] == b':')?;
    at = skip_back_ws(line, at);
    at = at
        .checked_sub(7)
        .filter(|&s| &line[s..at] == b"\"usage\"")?;
    at = skip_back_ws(line, at);
    // A comma before a quote cannot be inside a JSON string: there a quote is escaped.
    let comma = at.checked_sub(1).filter(|&s| line[s] == b',')?;
    Some((&line[..comma], &line[end..]))
}

/// The index just past the last non-whitespace byte before `at`.
fn skip_back_ws(line: &[u8], mut at: usize) -> usize {
    while at > 0 && line[at - 1].is_ascii_whitespace() {
        at -= 1;
    }
    at
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLAIN: &str = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: [DONE]\n\n",
    );
    const ASKED: &str = concat!(
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":null}\n\n",
        "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":1}}\n\n",
        "data: [DONE]\n\n",
    );

    fn strip_in(chunks: &[&[u8]]) -> Vec<u8> {
        let mut strip = StripUsage::default();
        let mut out = Vec::new();
        for chunk in chunks {
            out.extend_from_slice(&strip.data(Bytes::copy_from_slice(chunk)));
        }
        out.extend_from_slice(&strip.end());
        out
    }

    #[test]
    fn the_client_gets_the_stream_it_would_have_got_at_every_split() {
        let asked = ASKED.as_bytes();
        assert_eq!(strip_in(&[asked]), PLAIN.as_bytes());
        for at in 0..asked.len() {
            let (a, b) = asked.split_at(at);
            assert_eq!(strip_in(&[a, b]), PLAIN.as_bytes(), "split at {at}");
        }
    }

    #[test]
    fn other_data_in_the_usage_chunk_reaches_the_client() {
        let asked = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}],\"usage\":null}\n\n",
            "data: {\"id\":\"c\",\"choices\":[],\"prompt_filter_results\":[{\"prompt_index\":0}],\"usage\":{\"prompt_tokens\":9}}\n\n",
            "data: [DONE]\n\n",
        );
        let out = String::from_utf8(strip_in(&[asked.as_bytes()])).unwrap();
        assert!(out.contains("prompt_filter_results"), "{out}");
        assert!(!out.contains("prompt_tokens"), "{out}");
        let chunk = out.lines().nth(2).unwrap().strip_prefix("data: ").unwrap();
        let chunk: serde_json::Value = serde_json::from_str(chunk).unwrap();
        assert_eq!(chunk["prompt_filter_results"][0]["prompt_index"], 0);
        assert!(chunk.get("usage").is_none());
    }

    #[test]
    fn usage_an_upstream_sends_unasked_stays() {
        // No nulls: this upstream ignores stream_options, and sends usage to everyone.
        let always = concat!(
            "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"}}]}\n\n",
            "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":9}}\n\n",
            "data: [DONE]\n\n",
        );
        assert_eq!(strip_in(&[always.as_bytes()]), always.as_bytes());
    }

    #[test]
    fn spaced_and_crlf_forms_are_stripped_too() {
        let asked = "data: {\"id\":\"c\", \"choices\":[], \"usage\" : null }\r\n\r\n";
        assert_eq!(
            strip_in(&[asked.as_bytes()]),
            b"data: {\"id\":\"c\", \"choices\":[]}\r\n\r\n"
        );
    }

    #[test]
    fn usage_elsewhere_and_text_that_looks_like_it_stay() {
        let inner = "data: {\"usage\":null,\"choices\":[{\"delta\":{\"content\":\"\\\"usage\\\":null\"}}]}\n\n";
        assert_eq!(strip_in(&[inner.as_bytes()]), inner.as_bytes());
        let other = "event: ping\ndata: {\"choices\":[]}\n\n";
        assert_eq!(strip_in(&[other.as_bytes()]), other.as_bytes());
    }

    #[test]
    fn the_ask_opens_the_body() {
        let asked = |body: &'static [u8]| {
            ask(&Chunks::from(Bytes::from_static(body))).map(|parts| parts.concat())
        };
        assert_eq!(
            asked(b" {\"model\":\"m\"}").unwrap(),
            b" {\"stream_options\":{\"include_usage\":true},\"model\":\"m\"}"
        );
        assert_eq!(
            asked(b"{ }").unwrap(),
            b"{\"stream_options\":{\"include_usage\":true} }"
        );
        assert!(asked(b"[1]").is_none());
        // A body in frames is asked the same, its frames after the opening shared.
        let text = b" { \"model\":\"m\", \"stream\":true}";
        for cut in 0..=text.len() {
            let mut chunks = Chunks::from(Bytes::from_static(&text[..cut]));
            chunks.push(Bytes::from_static(&text[cut..]));
            let parts = ask(&chunks).unwrap_or_default();
            assert_eq!(
                parts.concat(),
                b" {\"stream_options\":{\"include_usage\":true}, \"model\":\"m\", \"stream\":true}",
                "cut at {cut}"
            );
        }
    }
}
