//! Reversible redaction: the markers a `reversible` hook's redactions put into a request
//! become their texts again in the reply the client gets, whole or streamed, while the
//! log keeps the reply as the provider sent it. A streamed marker may arrive split
//! across text deltas: the start of one is held back until it is whole or proves not to
//! be one, and sent before the next event that is not a delta. Tool arguments arrive
//! as pieces of JSON text: there a text comes back spelt for a JSON string.

use std::collections::HashMap;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, MatchKind};
use bytes::{Bytes, BytesMut};
use serde_json::Value;

use crate::dialect::{Dialect, ReplyDelta};
use crate::rewrite::{trim_break, Lines, Rewrite};

/// The markers of a request and the texts they stand for.
pub(in crate::pipeline) struct Reverse {
    finder: AhoCorasick,
    markers: Vec<String>,
    /// Each text, as it is.
    texts: Vec<String>,
    /// Each text as it is spelt inside a JSON string.
    spelt: Vec<String>,
}

impl Reverse {
    /// The reverse of `pairs` (marker, text); `None` when there are none.
    pub(in crate::pipeline) fn new(pairs: Vec<(String, String)>) -> Option<Arc<Self>> {
        if pairs.is_empty() {
            return None;
        }
        let (markers, texts): (Vec<String>, Vec<String>) = pairs.into_iter().unzip();
        let finder = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&markers)
            .ok()?;
        let spelt = texts
            .iter()
            .map(|text| {
                let quoted = Value::String(text.clone()).to_string();
                quoted[1..quoted.len() - 1].to_owned()
            })
            .collect();
        Some(Arc::new(Self {
            finder,
            markers,
            texts,
            spelt,
        }))
    }

    /// JSON text with every whole marker replaced by its text, spelt for a JSON string
    /// (a marker needs no escape, so it only ever stands inside one).
    pub(in crate::pipeline) fn json(&self, bytes: &[u8]) -> Bytes {
        if !self.finder.is_match(bytes) {
            return Bytes::copy_from_slice(bytes);
        }
        Bytes::from(self.finder.replace_all_bytes(bytes, &self.spelt))
    }

    /// Text with every whole marker replaced by its text: as it is, or spelt for a
    /// JSON string when the text is a piece of JSON (tool arguments).
    fn text(&self, text: &str, json: bool) -> String {
        if json {
            self.finder.replace_all(text, &self.spelt)
        } else {
            self.finder.replace_all(text, &self.texts)
        }
    }

    /// Where `text` splits into what can go now and a tail that may be the start of a
    /// marker still arriving.
    fn split_at(&self, text: &str) -> usize {
        let Some(open) = text.rfind('[') else {
            return text.len();
        };
        let tail = &text[open..];
        let partial = self
            .markers
            .iter()
            .any(|marker| marker.len() > tail.len() && marker.starts_with(tail));
        if partial {
            open
        } else {
            text.len()
        }
    }

    /// A stream rewriter for replies of `dialect`.
    pub(in crate::pipeline) fn stream(
        self: &Arc<Self>,
        dialect: &'static dyn Dialect,
    ) -> Box<dyn Rewrite> {
        Box::new(ReverseStream {
            reverse: Arc::clone(self),
            dialect,
            lines: Lines::default(),
            event_line: None,
            held: HashMap::new(),
            order: Vec::new(),
        })
    }
}

/// Text held back on one channel, and the event to send it in.
struct Held {
    text: String,
    /// The last delta event of the channel, its `event:` line if it had one, and the
    /// pointer to its text.
    event: Value,
    event_line: Option<Vec<u8>>,
    pointer: String,
    /// Whether the text is a piece of JSON.
    json: bool,
}

/// Turns markers back into texts in an SSE stream, line by line.
struct ReverseStream {
    reverse: Arc<Reverse>,
    dialect: &'static dyn Dialect,
    lines: Lines,
    /// An `event:` line, held until its data shows whether held text goes first.
    event_line: Option<Vec<u8>>,
    held: HashMap<String, Held>,
    /// The channels with held text, in the order they started holding.
    order: Vec<String>,
}

impl ReverseStream {
    fn line(&mut self, line: &[u8], out: &mut BytesMut) {
        let body = trim_break(line);
        if body.starts_with(b"event:") {
            if let Some(previous) = self.event_line.replace(line.to_vec()) {
                out.extend_from_slice(&previous);
            }
            return;
        }
        let Some(data) = body.strip_prefix(b"data:") else {
            self.pass(line, out);
            return;
        };
        if self.held.is_empty() && !data.contains(&b'[') {
            self.pass(line, out);
            return;
        }
        let Ok(mut event) = serde_json::from_slice::<Value>(data.trim_ascii()) else {
            self.pass(line, out);
            return;
        };
        let deltas = self.dialect.reply_deltas(&event);
        if deltas.is_empty() {
            // Any other event closes what was held: it goes first, whole or not.
            self.flush(out);
            self.pass(line, out);
            return;
        }
        let event_line = self.event_line.take();
        for ReplyDelta {
            channel,
            pointer,
            json,
        } in deltas
        {
            let Some(Value::String(delta)) = event.pointer_mut(&pointer) else {
                continue;
            };
            let mut text = self
                .held
                .remove(&channel)
                .map(|held| held.text)
                .unwrap_or_default();
            self.order.retain(|known| *known != channel);
            text.push_str(delta);
            let at = self.reverse.split_at(&text);
            let keep = text.split_off(at);
            *delta = self.reverse.text(&text, json);
            if !keep.is_empty() {
                self.order.push(channel.clone());
                self.held.insert(
                    channel,
                    Held {
                        text: keep,
                        event: event.clone(),
                        event_line: event_line.clone(),
                        pointer,
                        json,
                    },
                );
            }
        }
        if let Some(event_line) = event_line {
            out.extend_from_slice(&event_line);
        }
        write_data(&event, &line[body.len()..], out);
    }

    /// `line` as it came, after the `event:` line held for it, with whole markers
    /// turned back.
    fn pass(&mut self, line: &[u8], out: &mut BytesMut) {
        if let Some(event_line) = self.event_line.take() {
            out.extend_from_slice(&event_line);
        }
        out.extend_from_slice(&self.reverse.json(line));
    }

    /// Sends what every channel held, each in a copy of its last delta event.
    fn flush(&mut self, out: &mut BytesMut) {
        for channel in std::mem::take(&mut self.order) {
            let Some(mut held) = self.held.remove(&channel) else {
                continue;
            };
            if let Some(Value::String(delta)) = held.event.pointer_mut(&held.pointer) {
                *delta = self.reverse.text(&held.text, held.json);
            }
            if let Some(event_line) = &held.event_line {
                out.extend_from_slice(event_line);
            }
            write_data(&held.event, b"\n", out);
            out.extend_from_slice(b"\n");
        }
    }
}

/// `data: <event>` and the line break `end`.
fn write_data(event: &Value, end: &[u8], out: &mut BytesMut) {
    out.extend_from_slice(b"data: ");
    if let Ok(json) = serde_json::to_vec(event) {
        out.extend_from_slice(&json);
    }
    out.extend_from_slice(if end.is_empty() { &b"\n"[..] } else { end });
}

impl Rewrite for ReverseStream {
    fn data(&mut self, data: Bytes) -> Bytes {
        let mut lines = std::mem::take(&mut self.lines);
        let out = lines.feed(&data, |line, out| self.line(line, out));
        self.lines = lines;
        out
    }

    fn end(&mut self) -> Bytes {
        let mut out = BytesMut::new();
        self.flush(&mut out);
        if let Some(event_line) = self.event_line.take() {
            out.extend_from_slice(&event_line);
        }
        let rest = self.lines.rest();
        out.extend_from_slice(&self.reverse.json(&rest));
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::dialect::DialectKind;

    const MARKER: &str = "[redacted:email:ab12cd]";

    fn reverse() -> Arc<Reverse> {
        Reverse::new(vec![(MARKER.into(), "ana@x.io".into())]).unwrap()
    }

    /// The client's text of an OpenAI chat stream, `frames` sent cut at every `cut`.
    fn chat_text(stream: &str, cut: usize) -> String {
        let mut rewrite = reverse().stream(DialectKind::OpenAiChat.get());
        let mut out = Vec::new();
        for piece in stream.as_bytes().chunks(cut) {
            out.extend_from_slice(&rewrite.data(Bytes::copy_from_slice(piece)));
        }
        out.extend_from_slice(&rewrite.end());
        let text = String::from_utf8(out).unwrap();
        text.lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .filter_map(|event| {
                event["choices"][0]["delta"]["content"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect()
    }

    fn chat_stream(deltas: &[&str]) -> String {
        let mut out = String::new();
        for delta in deltas {
            let event = serde_json::json!({"choices": [{"index": 0, "delta": {"content": delta}}]});
            out.push_str(&format!("data: {event}\n\n"));
        }
        out.push_str("data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n");
        out
    }

    #[test]
    fn a_marker_split_across_deltas_and_frames_becomes_its_text() {
        let stream = chat_stream(&[
            "Write to [red",
            "acted:em",
            "ail:ab12cd] today, [not a marker] ok",
        ]);
        for cut in [1, 2, 7, 64, 4096] {
            assert_eq!(
                chat_text(&stream, cut),
                "Write to ana@x.io today, [not a marker] ok",
                "cut every {cut} bytes"
            );
        }
    }

    #[test]
    fn a_held_start_that_never_completes_is_sent_before_the_stream_ends() {
        let stream = chat_stream(&["ends with [redacted:em"]);
        assert_eq!(chat_text(&stream, 4096), "ends with [redacted:em");
    }

    #[test]
    fn anthropic_events_keep_their_event_lines_and_order() {
        let mut rewrite = reverse().stream(DialectKind::Anthropic.get());
        let delta = |text: &str| {
            format!(
                "event: content_block_delta\ndata: {}\n\n",
                serde_json::json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}})
            )
        };
        let stream = format!(
            "{}{}event: content_block_stop\ndata: {{\"type\":\"content_block_stop\",\"index\":0}}\n\n",
            delta("mail [redacted:email:"),
            delta("ab")
        );
        let mut out = rewrite.data(Bytes::from(stream)).to_vec();
        out.extend_from_slice(&rewrite.end());
        let text = String::from_utf8(out).unwrap();
        let events: Vec<&str> = text.lines().filter(|l| l.starts_with("event:")).collect();
        assert_eq!(
            events,
            [
                "event: content_block_delta",
                "event: content_block_delta",
                "event: content_block_delta",
                "event: content_block_stop"
            ],
            "{text}"
        );
        let said: String = text
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .filter_map(|event| event["delta"]["text"].as_str().map(str::to_owned))
            .collect();
        assert_eq!(said, "mail [redacted:email:ab");
    }

    #[test]
    fn a_marker_split_across_tool_argument_pieces_comes_back_spelt_for_json() {
        let reverse = Reverse::new(vec![(MARKER.into(), "a\"b@x.io".into())]).unwrap();
        let mut rewrite = reverse.stream(DialectKind::OpenAiChat.get());
        let piece = |arguments: &str| {
            let event = serde_json::json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": arguments}}]}}]});
            format!("data: {event}\n\n")
        };
        let stream = format!(
            "{}{}{}data: {{\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"tool_calls\"}}]}}\n\n",
            piece("{\"to\": \"[redacted:"),
            piece("email:ab12"),
            piece("cd]\"}")
        );
        let mut out = rewrite.data(Bytes::from(stream)).to_vec();
        out.extend_from_slice(&rewrite.end());
        let arguments: String = String::from_utf8(out)
            .unwrap()
            .lines()
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str::<Value>(data).ok())
            .filter_map(|e| {
                e["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                    .as_str()
                    .map(str::to_owned)
            })
            .collect();
        let parsed: Value = serde_json::from_str(&arguments).unwrap();
        assert_eq!(parsed["to"], "a\"b@x.io", "{arguments}");
    }

    #[test]
    fn gemini_text_pieces_and_a_call_s_args_come_back_once_each() {
        let chunk = |parts: serde_json::Value| {
            let event = serde_json::json!({"candidates": [{"content": {"role": "model", "parts": parts}, "index": 0}]});
            format!("data: {event}\r\n\r\n")
        };
        let stream = [
            chunk(serde_json::json!([{"text": "Mail [redacted:em"}])),
            chunk(serde_json::json!([{"text": "ail:ab12cd] now."}])),
            chunk(serde_json::json!([{"text": " Sending to "}, {"functionCall": {"name": "send", "args": {"to": MARKER}}}])),
        ]
        .concat();
        for cut in [1, 7, 64, 4096] {
            let mut rewrite = reverse().stream(DialectKind::Gemini.get());
            let mut out = Vec::new();
            for piece in stream.as_bytes().chunks(cut) {
                out.extend_from_slice(&rewrite.data(Bytes::copy_from_slice(piece)));
            }
            out.extend_from_slice(&rewrite.end());
            let text = String::from_utf8(out).unwrap();
            let events: Vec<Value> = text
                .lines()
                .filter_map(|line| line.strip_prefix("data: "))
                .filter_map(|data| serde_json::from_str(data).ok())
                .collect();
            let parts: Vec<&Value> = events
                .iter()
                .flat_map(|e| e["candidates"][0]["content"]["parts"].as_array().unwrap())
                .collect();
            let said: String = parts.iter().filter_map(|p| p["text"].as_str()).collect();
            assert_eq!(said, "Mail ana@x.io now. Sending to ", "cut {cut}");
            let calls: Vec<&&Value> = parts
                .iter()
                .filter(|p| p.get("functionCall").is_some())
                .collect();
            assert_eq!(calls.len(), 1, "cut {cut}: {text}");
            assert_eq!(
                calls[0]["functionCall"]["args"]["to"], "ana@x.io",
                "cut {cut}"
            );
        }
    }

    #[test]
    fn whole_markers_in_json_become_escaped_texts() {
        let reverse = Reverse::new(vec![(MARKER.into(), "a\"b".into())]).unwrap();
        let out = reverse.json(format!("{{\"text\":\"x {MARKER} y\"}}").as_bytes());
        let value: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["text"], "x a\"b y");
    }
}
