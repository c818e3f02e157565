//! A Messages reply as the log keeps it: `{"role":"assistant","content":[…]}` with the
//! content blocks as the API sent them (or as its stream builds them), which is what
//! the SDKs echo on the next turn.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Map, Value};

use crate::base::reply::{Assembled, CapturedReply};
use crate::dialect::StreamReply;

#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(borrow)]
    content: &'a RawValue,
    #[serde(default)]
    stop_reason: Option<String>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    container: Option<Container>,
    #[serde(default)]
    context_management: Option<Value>,
}

/// True when a reply's `context_management` lists edits the API applied.
fn applied_edits(context_management: Option<&Value>) -> bool {
    context_management
        .and_then(|c| c.get("applied_edits"))
        .and_then(Value::as_array)
        .is_some_and(|edits| !edits.is_empty())
}

/// The code-execution container a reply ran in: the tenant's from then on, for a later
/// request to name (`container`). It stands where a Responses reply has its id.
#[derive(Deserialize)]
struct Container {
    id: String,
}

/// The reply of a non-streamed message, its content blocks byte for byte.
pub(super) fn replies_from_json(body: &[u8]) -> Result<Assembled, serde_json::Error> {
    let reply: Reply<'_> = crate::dialect::json_body(body)?;
    let message = RawValue::from_string(format!(
        r#"{{"role":"assistant","content":{}}}"#,
        reply.content.get()
    ))?;
    Ok(Assembled {
        replies: vec![CapturedReply {
            message,
            finish_reason: reply.stop_reason,
            choice: 0,
        }],
        usage: reply.usage,
        response_id: reply.container.map(|container| container.id),
        edited_upstream: applied_edits(reply.context_management.as_ref()),
        ..Assembled::default()
    })
}

/// One content block being built, and the `input_json_delta` text of a tool call.
struct Block {
    value: Value,
    json: String,
}

/// Folds `message_start`, `content_block_*` and `message_delta` events into a message.
#[derive(Default)]
pub(crate) struct MessageAssembler {
    started: bool,
    blocks: BTreeMap<u64, Block>,
    stop_reason: Option<String>,
    usage: Map<String, Value>,
    /// The container the reply ran in, from `message_start` or `message_delta`.
    container: Option<String>,
    /// The API edited the context it counted (`message_delta`'s `context_management`).
    edited: bool,
}

fn append(block: &mut Value, field: &str, piece: Option<&str>) {
    let Some(piece) = piece else { return };
    let slot = &mut block[field];
    match slot {
        Value::String(text) => text.push_str(piece),
        _ => *slot = Value::String(piece.to_owned()),
    }
}

impl StreamReply for MessageAssembler {
    fn push(&mut self, _event: &str, data: &str) {
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            return;
        };
        let index = event.get("index").and_then(Value::as_u64).unwrap_or(0);
        match event.get("type").and_then(Value::as_str).unwrap_or("") {
            "message_start" => {
                self.started = true;
                if let Some(Value::Object(usage)) = event.pointer("/message/usage") {
                    self.usage.extend(usage.clone());
                }
                self.note_container(event.pointer("/message/container/id"));
            }
            "content_block_start" => {
                let value = event.get("content_block").cloned().unwrap_or(json!({}));
                self.blocks.insert(
                    index,
                    Block {
                        value,
                        json: String::new(),
                    },
                );
            }
            "content_block_delta" => {
                let Some(block) = self.blocks.get_mut(&index) else {
                    return;
                };
                let delta = event.get("delta").cloned().unwrap_or(Value::Null);
                let text = |name: &str| delta.get(name).and_then(Value::as_str);
                match text("type").unwrap_or("") {
                    "text_delta" => append(&mut block.value, "text", text("text")),
                    "thinking_delta" => append(&mut block.value, "thinking", text("thinking")),
                    "signature_delta" => {
                        if let Some(signature) = text("signature") {
                            block.value["signature"] = json!(signature);
                        }
                    }
                    "input_json_delta" => block.json.push_str(text("partial_json").unwrap_or("")),
                    // A compaction block arrives whole in one delta: its summary (or
                    // null) and its opaque `encrypted_content`, which the client must
                    // send back verbatim. Every field it carries is the block's, as the
                    // SDKs' accumulators set them.
                    "compaction_delta" => {
                        if let (Some(fields), Value::Object(block)) =
                            (delta.as_object(), &mut block.value)
                        {
                            for (name, value) in fields.iter().filter(|(name, _)| *name != "type") {
                                block.insert(name.clone(), value.clone());
                            }
                        }
                    }
                    "citations_delta" => {
                        if let Some(citation) = delta.get("citation") {
                            match &mut block.value["citations"] {
                                Value::Array(list) => list.push(citation.clone()),
                                slot => *slot = json!([citation]),
                            }
                        }
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(reason) = event.pointer("/delta/stop_reason").and_then(Value::as_str) {
                    self.stop_reason = Some(reason.to_owned());
                }
                if let Some(Value::Object(usage)) = event.get("usage") {
                    self.usage.extend(usage.clone());
                }
                self.note_container(event.pointer("/delta/container/id"));
                self.edited |= applied_edits(event.get("context_management"));
            }
            _ => {}
        }
    }

    fn finish(self: Box<Self>) -> Assembled {
        let Self {
            started,
            blocks,
            stop_reason,
            usage,
            container,
            edited,
        } = *self;
        let usage = (!usage.is_empty()).then_some(Value::Object(usage));
        if !started {
            return Assembled {
                usage,
                edited_upstream: edited,
                ..Assembled::default()
            };
        }
        let content: Vec<Value> = blocks
            .into_values()
            .map(|mut block| {
                if !block.json.is_empty() {
                    if let Ok(input) = serde_json::from_str::<Value>(&block.json) {
                        block.value["input"] = input;
                    }
                }
                block.value
            })
            .collect();
        let message = json!({"role": "assistant", "content": content});
        let replies = serde_json::value::to_raw_value(&message)
            .ok()
            .map(|message| CapturedReply {
                message,
                finish_reason: stop_reason,
                choice: 0,
            })
            .into_iter()
            .collect();
        Assembled {
            replies,
            usage,
            response_id: container,
            edited_upstream: edited,
            ..Assembled::default()
        }
    }
}

impl MessageAssembler {
    fn note_container(&mut self, id: Option<&Value>) {
        if let Some(id) = id.and_then(Value::as_str) {
            self.container = Some(id.to_owned());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_tool_call_becomes_the_blocks_a_client_echoes() {
        let mut assembler: Box<dyn StreamReply> = Box::<MessageAssembler>::default();
        for data in [
            r#"{"type":"message_start","message":{"role":"assistant","content":[],"usage":{"input_tokens":40,"output_tokens":1}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Let me "}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"look."}}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"tool_use","id":"t1","name":"f","input":{}}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"{\"q\": "}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"input_json_delta","partial_json":"1}"}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"tool_use","container":{"id":"container_9","expires_at":"x"}},"usage":{"output_tokens":9}}"#,
            r#"{"type":"message_stop"}"#,
        ] {
            assembler.push("", data);
        }
        let Assembled {
            replies,
            usage,
            response_id,
            ..
        } = assembler.finish();
        assert_eq!(
            response_id.as_deref(),
            Some("container_9"),
            "the container it ran in"
        );
        let message: Value = serde_json::from_str(replies[0].message.get()).unwrap();
        assert_eq!(
            message,
            json!({"role": "assistant", "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "t1", "name": "f", "input": {"q": 1}}]})
        );
        assert_eq!(replies[0].finish_reason.as_deref(), Some("tool_use"));
        assert_eq!(
            usage.unwrap(),
            json!({"input_tokens": 40, "output_tokens": 9})
        );
    }

    #[test]
    fn a_json_reply_keeps_its_bytes() {
        let body = br#"{"id":"m","content":[{"type":"text","text":"hi","citations":null}],"stop_reason":"end_turn","usage":{"input_tokens":3}}"#;
        let Assembled { replies, usage, .. } = replies_from_json(body).unwrap();
        assert_eq!(
            replies[0].message.get(),
            r#"{"role":"assistant","content":[{"type":"text","text":"hi","citations":null}]}"#
        );
        assert_eq!(usage.unwrap()["input_tokens"], 3);
    }

    #[test]
    fn a_streamed_compaction_block_is_logged_as_the_client_assembles_it() {
        let mut assembler: Box<dyn StreamReply> = Box::<MessageAssembler>::default();
        for event in [
            r#"{"type":"message_start","message":{"role":"assistant","content":[],"usage":{"input_tokens":9000}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"compaction","content":null}}"#,
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"compaction_delta","content":"Summary: all of it.","encrypted_content":"EuYBCkYI"}}"#,
            r#"{"type":"content_block_stop","index":0}"#,
            r#"{"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}"#,
            r#"{"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Done."}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}"#,
        ] {
            assembler.push("", event);
        }
        let assembled = assembler.finish();
        let message: Value = serde_json::from_str(assembled.replies[0].message.get()).unwrap();
        assert_eq!(
            message["content"][0],
            json!({"type": "compaction", "content": "Summary: all of it.", "encrypted_content": "EuYBCkYI"})
        );
        assert_eq!(message["content"][1]["text"], "Done.");
    }

    #[test]
    fn a_reply_the_api_counted_after_its_own_edits_says_so() {
        let edited = br#"{"content":[{"type":"text","text":"ok"}],"usage":{"input_tokens":3},"context_management":{"applied_edits":[{"type":"clear_thinking_20251015","cleared_thinking_turns":2}]}}"#;
        assert!(replies_from_json(edited).unwrap().edited_upstream);
        let none = br#"{"content":[{"type":"text","text":"ok"}],"context_management":{"applied_edits":[]}}"#;
        assert!(!replies_from_json(none).unwrap().edited_upstream);
        let mut assembler: Box<dyn StreamReply> = Box::<MessageAssembler>::default();
        for event in [
            r#"{"type":"message_start","message":{"role":"assistant","content":[],"usage":{"input_tokens":9}}}"#,
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":"ok"}}"#,
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":1},"context_management":{"applied_edits":[{"type":"clear_tool_uses_20250919","cleared_tool_uses":3}]}}"#,
        ] {
            assembler.push("", event);
        }
        assert!(assembler.finish().edited_upstream);
    }
}
