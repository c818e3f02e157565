//! Finds where a streamed reply ends: just after the blank line that closes its final
//! SSE event (`response.completed`, `message_stop`, `data: [DONE]`).
//!
//! The final event can be far larger than a chunk (Responses echoes the whole response,
//! tools included, in `response.completed`), so the end is found by reading SSE lines
//! across chunks rather than by spotting the event's name: the reply is over when the
//! event that named itself final is closed, not when it starts.

use crate::dialect::StreamEnd;

/// Bytes of a line kept to recognise `event: response.incomplete` and the like; the
/// rest of a long `data:` line is only scanned for its end.
const LINE_HEAD: usize = 48;

/// Reads SSE lines chunk by chunk and reports the offset at which the final event ends.
#[derive(Debug)]
pub(crate) struct FinalEvent {
    end: StreamEnd,
    // The start of the current line, up to `LINE_HEAD` bytes.
    head: Vec<u8>,
    // Bytes seen on the current line (the head may hold fewer).
    line_len: usize,
    // The previous byte was a CR, so an LF now ends nothing new.
    after_cr: bool,
    // The event being read has named itself final.
    in_final: bool,
    // Bytes of `end.containing` matched so far on the current line.
    matched: usize,
    // The current line holds `end.containing`.
    contains: bool,
    // The final event's closing blank line was a CR that ended a chunk: the reply ends
    // after the LF that may open the next one.
    closing_cr: bool,
}

impl FinalEvent {
    /// A scanner for a dialect's final event.
    pub(super) fn new(end: StreamEnd) -> Self {
        Self {
            end,
            head: Vec::with_capacity(LINE_HEAD),
            line_len: 0,
            after_cr: false,
            in_final: false,
            matched: 0,
            contains: false,
            closing_cr: false,
        }
    }

    /// Reads one chunk; returns the offset just past the final event's closing blank
    /// line when it is in this chunk.
    pub(crate) fn feed(&mut self, data: &[u8]) -> Option<usize> {
        if self.closing_cr && !data.is_empty() {
            self.closing_cr = false;
            return Some(usize::from(data[0] == b'\n'));
        }
        for (at, &byte) in data.iter().enumerate() {
            let is_break = byte == b'\n' || byte == b'\r';
            if byte == b'\n' && self.after_cr {
                self.after_cr = false;
                continue;
            }
            self.after_cr = byte == b'\r';
            if !is_break {
                if self.head.len() < LINE_HEAD {
                    self.head.push(byte);
                }
                self.line_len += 1;
                self.match_containing(byte);
                continue;
            }
            if self.line_len == 0 {
                if self.in_final {
                    self.in_final = false;
                    // A CRLF pair ends with its LF, which may open the next chunk.
                    if byte == b'\r' && at + 1 == data.len() {
                        self.closing_cr = true;
                        return None;
                    }
                    let close = if byte == b'\r' && data.get(at + 1) == Some(&b'\n') {
                        at + 2
                    } else {
                        at + 1
                    };
                    return Some(close);
                }
            } else {
                if self.names_final() {
                    self.in_final = true;
                }
                self.head.clear();
                self.line_len = 0;
                self.matched = 0;
                self.contains = false;
            }
        }
        None
    }

    /// Advances the match of `end.containing` by one byte of the line. Its first byte
    /// recurs in it only at its end, so a mismatch restarts at that byte alone.
    fn match_containing(&mut self, byte: u8) {
        let needle = self.end.containing;
        if needle.is_empty() || self.contains {
            return;
        }
        if needle[self.matched] == byte {
            self.matched += 1;
        } else {
            self.matched = usize::from(needle[0] == byte);
        }
        if self.matched == needle.len() {
            self.contains = true;
        }
    }

    /// True when the line just read is `field: value` for a final value, whole, or a
    /// `field` line holding `end.containing`.
    fn names_final(&self) -> bool {
        if self.contains && self.head.starts_with(self.end.field) {
            return true;
        }
        if self.line_len != self.head.len() {
            return false;
        }
        let Some(rest) = self.head.strip_prefix(self.end.field) else {
            return false;
        };
        let rest = rest.strip_prefix(b" ").unwrap_or(rest);
        self.end.values.contains(&rest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::DialectKind;

    fn end_of(kind: DialectKind, chunks: &[&[u8]]) -> Option<usize> {
        let mut scanner = FinalEvent::new(kind.get().stream_end());
        let mut offset = 0;
        for chunk in chunks {
            if let Some(at) = scanner.feed(chunk) {
                return Some(offset + at);
            }
            offset += chunk.len();
        }
        None
    }

    fn responses_stream(tools: usize) -> (Vec<u8>, usize) {
        let big = "t".repeat(tools);
        let mut out = Vec::new();
        out.extend_from_slice(
            b"event: response.created\ndata: {\"type\":\"response.created\"}\n\n",
        );
        out.extend_from_slice(b"event: response.output_text.delta\ndata: {\"delta\":\"event: response.completed\\n\\n\"}\n\n");
        out.extend_from_slice(b"event: response.completed\n");
        out.extend_from_slice(
            format!("data: {{\"type\":\"response.completed\",\"response\":{{\"tools\":\"{big}\",\"usage\":{{\"input_tokens\":7}}}}}}\n\n")
                .as_bytes(),
        );
        let end = out.len();
        out.extend_from_slice(b"event: trailing\ndata: {}\n\n");
        (out, end)
    }

    #[test]
    fn the_end_is_the_blank_line_after_the_final_event_at_every_split() {
        let (stream, end) = responses_stream(1_500);
        for split in 0..=stream.len() {
            let (a, b) = stream.split_at(split);
            assert_eq!(
                end_of(DialectKind::Responses, &[a, b]),
                Some(end),
                "split at {split}"
            );
        }
        // One byte per chunk, and a final event of 20 KB.
        let (stream, end) = responses_stream(20_000);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(end_of(DialectKind::Responses, &bytes), Some(end));
    }

    #[test]
    fn crlf_lines_and_every_dialect_end() {
        let anthropic = b"event: message_delta\r\ndata: {}\r\n\r\nevent: message_stop\r\ndata: {\"type\":\"message_stop\"}\r\n\r\n";
        assert_eq!(
            end_of(DialectKind::Anthropic, &[anthropic]),
            Some(anthropic.len())
        );
        let openai = b"data: {\"choices\":[]}\n\ndata: [DONE]\n\n";
        assert_eq!(
            end_of(DialectKind::OpenAiChat, &[openai]),
            Some(openai.len())
        );
        assert_eq!(
            end_of(DialectKind::OpenAiChat, &[b"data:[DONE]\n\n"]),
            Some(13)
        );
    }

    #[test]
    fn gemini_ends_after_the_event_that_carries_its_finish_reason_at_every_split() {
        let text = "t".repeat(9_000);
        let stream = format!(
            "data: {{\"candidates\": [{{\"content\": {{\"parts\": [{{\"text\": \"a \\\"finishReason\\\" in text\"}}]}}}}]}}\r\n\r\n\
             data: {{\"candidates\": [{{\"content\": {{\"parts\": [{{\"text\": \"{text}\"}}]}}, \"finishReason\": \"STOP\"}}]}}\r\n\r\n"
        );
        let stream = stream.as_bytes();
        for split in 0..=stream.len() {
            let (a, b) = stream.split_at(split);
            assert_eq!(
                end_of(DialectKind::Gemini, &[a, b]),
                Some(stream.len()),
                "split at {split}"
            );
        }
        // The escaped name inside a text is not the member.
        let first = stream.len() - text.len() - 100;
        assert_eq!(end_of(DialectKind::Gemini, &[&stream[..first]]), None);
    }

    #[test]
    fn names_inside_data_or_prefixes_do_not_end_the_stream() {
        let text = b"data: {\"content\":\"data: [DONE]\"}\n\ndata: [DONE]x\n\n";
        assert_eq!(end_of(DialectKind::OpenAiChat, &[text]), None);
        let prefix = b"event: response.completed.extra\ndata: {}\n\n";
        assert_eq!(end_of(DialectKind::Responses, &[prefix]), None);
        // Started but not closed: not over yet.
        let open = b"event: message_stop\ndata: {}\n";
        assert_eq!(end_of(DialectKind::Anthropic, &[open]), None);
    }
}
