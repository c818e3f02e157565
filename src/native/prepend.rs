//! The upstream's reply with what handoff served put in, as the provider would have
//! answered: the compaction first (a Responses `compaction` item, a Messages
//! `compaction` block), the reply's own items and blocks renumbered after it, the
//! summary calls' usage where the API reports compaction usage, and the context edits
//! applied. A JSON reply is rewritten whole; a stream event by event, as it passes.

use bytes::{Bytes, BytesMut};
use serde_json::{json, Value};

use crate::dialect::DialectKind;
use crate::rewrite::{trim_break, Lines, Rewrite};

/// What handoff puts into one reply.
#[derive(Debug, Clone, Default)]
pub(crate) struct Served {
    /// The compaction item or block, when this request compacted.
    pub(crate) artefact: Option<Value>,
    /// What the compaction's summary calls billed: input and output tokens.
    pub(crate) summary: (u64, u64),
    /// The Messages API's `applied_edits`, for the clearing edits handoff applied.
    pub(crate) applied: Vec<Value>,
}

impl Served {
    /// True when the reply needs nothing put in.
    pub(crate) fn is_empty(&self) -> bool {
        self.artefact.is_none() && self.applied.is_empty()
    }

    /// A whole JSON reply of `dialect`, with it put in; the upstream's bytes when it
    /// is not a reply of that API.
    pub(crate) fn put_in_json(&self, dialect: DialectKind, body: Bytes) -> Bytes {
        let Ok(mut reply) = serde_json::from_slice::<Value>(&body) else {
            return body;
        };
        match dialect {
            DialectKind::Anthropic => self.put_in_message(&mut reply),
            _ => self.put_in_response(&mut reply),
        }
        serde_json::to_vec(&reply).map_or(body, Bytes::from)
    }

    fn put_in_response(&self, response: &mut Value) {
        if let (Some(item), Some(output)) = (&self.artefact, response["output"].as_array_mut()) {
            output.insert(0, item.clone());
            add_usage(&mut response["usage"], self.summary);
        }
    }

    fn put_in_message(&self, message: &mut Value) {
        if let (Some(block), Some(content)) = (&self.artefact, message["content"].as_array_mut()) {
            content.insert(0, block.clone());
            let usage = &message["usage"];
            let iterations = iterations(self.summary, usage);
            message["usage"]["iterations"] = iterations;
        }
        if !self.applied.is_empty() {
            message["context_management"] = json!({"applied_edits": self.applied});
        }
    }

    /// The rewrite of a streamed reply of `dialect`.
    pub(crate) fn stream(self, dialect: DialectKind) -> Box<dyn Rewrite> {
        Box::new(Events {
            served: self,
            dialect,
            lines: Lines::default(),
            event: BytesMut::new(),
            inserted: false,
            shift: 0,
        })
    }
}

/// The Messages API's `usage.iterations`: the compaction's, then the message's.
fn iterations((input, output): (u64, u64), usage: &Value) -> Value {
    let of = |key: &str| usage.get(key).and_then(Value::as_u64).unwrap_or(0);
    json!([{"type": "compaction", "input_tokens": input, "output_tokens": output},
           {"type": "message", "input_tokens": of("input_tokens"), "output_tokens": of("output_tokens")}])
}

/// A Responses `usage` with the summary calls' tokens added.
fn add_usage(usage: &mut Value, (input, output): (u64, u64)) {
    if !usage.is_object() {
        return;
    }
    for (key, add) in [
        ("input_tokens", input),
        ("output_tokens", output),
        ("total_tokens", input + output),
    ] {
        let now = usage.get(key).and_then(Value::as_u64).unwrap_or(0);
        usage[key] = json!(now + add);
    }
}

/// A streamed reply, rewritten one whole event at a time.
struct Events {
    served: Served,
    dialect: DialectKind,
    lines: Lines,
    /// The lines of the event being read.
    event: BytesMut,
    /// True once the compaction's own events went out.
    inserted: bool,
    /// How many events were put in before the upstream's: its sequence numbers move on
    /// by as many.
    shift: u64,
}

impl Events {
    /// One whole event (its lines, the blank line that ends it included): out as it
    /// came, renumbered, or after the compaction's own events.
    fn event(&mut self, event: &[u8], out: &mut BytesMut) {
        let data = (event.split(|b| *b == b'\n'))
            .find_map(|line| trim_break(line).strip_prefix(b"data:"))
            .map(|data| data.trim_ascii());
        let Some(mut value) = data.and_then(|d| serde_json::from_slice::<Value>(d).ok()) else {
            out.extend_from_slice(event);
            return;
        };
        let kind = value["type"].as_str().unwrap_or("").to_owned();
        let opening = matches!(
            kind.as_str(),
            "response.created" | "response.in_progress" | "message_start" | "ping"
        );
        if !opening && !self.inserted {
            self.inserted = true;
            let sequence = value["sequence_number"].as_u64();
            self.insert(sequence, out);
        }
        if opening || !self.changes(&kind) {
            out.extend_from_slice(event);
            return;
        }
        self.renumber(&kind, &mut value);
        let name = (event.split(|b| *b == b'\n'))
            .find_map(|line| trim_break(line).strip_prefix(b"event:"))
            .map(|n| String::from_utf8_lossy(n.trim_ascii()).into_owned());
        write_event(out, name.as_deref(), &value);
    }

    /// True when an event of `kind` must be rewritten.
    fn changes(&self, kind: &str) -> bool {
        match self.dialect {
            DialectKind::Anthropic => self.served.artefact.is_some() || kind == "message_delta",
            _ => self.served.artefact.is_some(),
        }
    }

    fn renumber(&self, kind: &str, value: &mut Value) {
        let artefact = self.served.artefact.is_some();
        match self.dialect {
            DialectKind::Anthropic => {
                if let (true, Some(index)) = (artefact, value["index"].as_u64()) {
                    value["index"] = json!(index + 1);
                }
                if kind == "message_delta" {
                    if artefact {
                        value["usage"]["iterations"] =
                            iterations(self.served.summary, &value["usage"]);
                    }
                    if !self.served.applied.is_empty() {
                        value["context_management"] = json!({"applied_edits": self.served.applied});
                    }
                }
            }
            _ => {
                if let Some(sequence) = value["sequence_number"].as_u64() {
                    value["sequence_number"] = json!(sequence + self.shift);
                }
                if let Some(index) = value["output_index"].as_u64() {
                    value["output_index"] = json!(index + 1);
                }
                if let Some(item) = &self.served.artefact {
                    if let Some(output) = value["response"]["output"].as_array_mut() {
                        output.insert(0, item.clone());
                        add_usage(&mut value["response"]["usage"], self.served.summary);
                    }
                }
            }
        }
    }

    /// The compaction's own events, before the upstream's first output; `sequence` the
    /// number that event had.
    fn insert(&mut self, sequence: Option<u64>, out: &mut BytesMut) {
        let Some(artefact) = &self.served.artefact else {
            return;
        };
        match self.dialect {
            DialectKind::Anthropic => {
                for event in super::reply::compaction_block_events(0, artefact) {
                    let kind = event["type"].as_str().unwrap_or("").to_owned();
                    write_event(out, Some(&kind), &event);
                }
            }
            _ => {
                let first = sequence.unwrap_or(0);
                let events = [
                    ("response.output_item.added", first),
                    ("response.output_item.done", first + 1),
                ];
                for (kind, sequence) in events {
                    write_event(
                        out,
                        Some(kind),
                        &json!({"type": kind, "sequence_number": sequence,
                        "output_index": 0, "item": artefact}),
                    );
                }
                self.shift = 2;
            }
        }
    }
}

fn write_event(out: &mut BytesMut, name: Option<&str>, data: &Value) {
    if let Some(name) = name {
        out.extend_from_slice(format!("event: {name}\n").as_bytes());
    }
    out.extend_from_slice(format!("data: {data}\n\n").as_bytes());
}

impl Rewrite for Events {
    fn data(&mut self, data: Bytes) -> Bytes {
        let mut lines = std::mem::take(&mut self.lines);
        let mut event = std::mem::take(&mut self.event);
        let out = lines.feed(&data, |line, out| {
            event.extend_from_slice(line);
            if trim_break(line).is_empty() {
                let whole = std::mem::take(&mut event);
                self.event(&whole, out);
            }
        });
        self.lines = lines;
        self.event = event;
        out
    }

    fn end(&mut self) -> Bytes {
        let mut out = BytesMut::new();
        let mut rest = std::mem::take(&mut self.event);
        rest.extend_from_slice(&self.lines.rest());
        if !rest.is_empty() {
            self.event(&rest, &mut out);
        }
        out.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(stream: &[u8]) -> Vec<Value> {
        (String::from_utf8_lossy(stream).lines())
            .filter_map(|line| line.strip_prefix("data: "))
            .filter_map(|data| serde_json::from_str(data).ok())
            .collect()
    }

    fn rewrite(served: Served, dialect: DialectKind, stream: &str) -> Vec<u8> {
        let mut rewrite = served.stream(dialect);
        let mut out = Vec::new();
        // Cut anywhere: frames are not events.
        for chunk in stream.as_bytes().chunks(7) {
            out.extend_from_slice(&rewrite.data(Bytes::copy_from_slice(chunk)));
        }
        out.extend_from_slice(&rewrite.end());
        out
    }

    #[test]
    fn a_responses_stream_gets_the_item_first_and_every_number_after_it_moves_on() {
        let item = json!({"type": "compaction", "encrypted_content": "handoff-compaction.v1.x.y"});
        let served = Served {
            artefact: Some(item.clone()),
            summary: (900, 100),
            applied: Vec::new(),
        };
        let stream = concat!(
            "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"output\":[]}}\n\n",
            "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"output\":[]}}\n\n",
            "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\",\"sequence_number\":2,\"output_index\":0,\"item\":{\"type\":\"message\"}}\n\n",
            "event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":3,\"response\":{\"output\":[{\"type\":\"message\"}],\"usage\":{\"input_tokens\":50,\"output_tokens\":5,\"total_tokens\":55}}}\n\n",
        );
        let events = events(&rewrite(served, DialectKind::Responses, stream));
        let kinds: Vec<&str> = events.iter().filter_map(|e| e["type"].as_str()).collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.output_item.done",
                "response.output_item.added",
                "response.completed"
            ]
        );
        let numbers: Vec<u64> = events
            .iter()
            .filter_map(|e| e["sequence_number"].as_u64())
            .collect();
        assert_eq!(numbers, [0, 1, 2, 3, 4, 5]);
        assert_eq!(events[2]["item"], item);
        assert_eq!(events[4]["output_index"], 1);
        assert_eq!(events[5]["response"]["output"][0], item);
        assert_eq!(events[5]["response"]["usage"]["input_tokens"], 950);
    }

    #[test]
    fn a_messages_reply_gets_the_block_first_its_iterations_and_the_edits_applied() {
        let block = json!({"type": "compaction", "content": "Summary.", "encrypted_content": "handoff-compaction.v1.x.y"});
        let applied = vec![
            json!({"type": "clear_thinking_20251015", "cleared_thinking_turns": 2, "cleared_input_tokens": 80}),
        ];
        let served = Served {
            artefact: Some(block.clone()),
            summary: (900, 100),
            applied,
        };
        let stream = concat!(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"content\":[],\"usage\":{\"input_tokens\":50}}}\n\n",
            "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
            "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Done.\"}}\n\n",
            "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":5}}\n\n",
            "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
        );
        let out = rewrite(served.clone(), DialectKind::Anthropic, stream);
        let events = events(&out);
        assert_eq!(
            events[1]["content_block"],
            json!({"type": "compaction", "content": null})
        );
        assert_eq!(
            events[2]["delta"]["encrypted_content"],
            block["encrypted_content"]
        );
        assert_eq!(events[4]["index"], 1);
        assert_eq!(events[6]["usage"]["iterations"][0]["input_tokens"], 900);
        assert_eq!(
            events[6]["context_management"]["applied_edits"][0]["cleared_thinking_turns"],
            2
        );
        // The client's SDK assembles what the API would have sent.
        let mut assembler = DialectKind::Anthropic.get().stream_reply();
        for event in &events {
            assembler.push("", &event.to_string());
        }
        let assembled = assembler.finish();
        let message: Value = serde_json::from_str(assembled.replies[0].message.get()).unwrap();
        assert_eq!(message["content"][0], block);
        assert_eq!(message["content"][1]["text"], "Done.");
        // And the same reply, not streamed.
        let json = served.put_in_json(DialectKind::Anthropic, Bytes::from_static(
            br#"{"type":"message","content":[{"type":"text","text":"Done."}],"usage":{"input_tokens":50,"output_tokens":5}}"#));
        let message: Value = serde_json::from_slice(&json).unwrap();
        assert_eq!(message["content"][0], block);
        assert_eq!(message["usage"]["iterations"][1]["input_tokens"], 50);
    }
}
