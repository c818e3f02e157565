//! Reassembly of a streamed chat completion from its `chat.completion.chunk` events:
//! content, `reasoning_content`, `refusal`, `tool_calls` by index, `finish_reason` and
//! `usage`, per choice.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Map, Value};

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<ChunkChoice>,
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct ChunkChoice {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    delta: Delta,
    #[serde(default)]
    finish_reason: Option<String>,
}

#[derive(Deserialize, Default)]
struct Delta {
    #[serde(default)]
    role: Option<String>,
    #[serde(default)]
    content: Option<String>,
    #[serde(default)]
    reasoning_content: Option<String>,
    #[serde(default)]
    refusal: Option<String>,
    #[serde(default)]
    tool_calls: Vec<ToolCallDelta>,
}

#[derive(Deserialize)]
struct ToolCallDelta {
    #[serde(default)]
    index: u64,
    #[serde(default)]
    id: Option<String>,
    #[serde(default, rename = "type")]
    kind: Option<String>,
    #[serde(default)]
    function: Option<FunctionDelta>,
}

#[derive(Deserialize)]
struct FunctionDelta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    arguments: Option<String>,
}

#[derive(Default)]
struct ToolCall {
    id: String,
    kind: String,
    name: String,
    arguments: String,
}

#[derive(Default)]
struct Choice {
    role: Option<String>,
    content: Option<String>,
    reasoning: Option<String>,
    refusal: Option<String>,
    tool_calls: BTreeMap<u64, ToolCall>,
    finish_reason: Option<String>,
}

/// An assembled choice: the message and its finish reason.
#[derive(Debug, Clone, PartialEq)]
pub struct AssembledChoice {
    /// The choice index.
    pub index: u64,
    /// The assistant message, as a non-streamed response would carry it.
    pub message: Value,
    /// `finish_reason`, if one arrived.
    pub finish_reason: Option<String>,
}

/// Folds chunk events into whole messages.
#[derive(Default)]
pub struct StreamAssembler {
    choices: BTreeMap<u64, Choice>,
    usage: Option<Value>,
    unreadable: usize,
}

fn append(slot: &mut Option<String>, piece: Option<String>) {
    if let Some(piece) = piece {
        slot.get_or_insert_with(String::new).push_str(&piece);
    }
}

impl StreamAssembler {
    /// Feeds one event's `data`; `[DONE]` and non-chunk events are ignored.
    pub fn push(&mut self, data: &str) {
        if data.trim() == "[DONE]" {
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Chunk>(data) else {
            self.unreadable += 1;
            return;
        };
        if chunk.usage.as_ref().is_some_and(|u| !u.is_null()) {
            self.usage = chunk.usage;
        }
        for part in chunk.choices {
            let choice = self.choices.entry(part.index).or_default();
            if part.delta.role.is_some() {
                choice.role = part.delta.role;
            }
            append(&mut choice.content, part.delta.content);
            append(&mut choice.reasoning, part.delta.reasoning_content);
            append(&mut choice.refusal, part.delta.refusal);
            for call in part.delta.tool_calls {
                let slot = choice.tool_calls.entry(call.index).or_default();
                if let Some(id) = call.id {
                    slot.id = id;
                }
                if let Some(kind) = call.kind {
                    slot.kind = kind;
                }
                if let Some(function) = call.function {
                    if let Some(name) = function.name {
                        slot.name.push_str(&name);
                    }
                    if let Some(arguments) = function.arguments {
                        slot.arguments.push_str(&arguments);
                    }
                }
            }
            if part.finish_reason.is_some() {
                choice.finish_reason = part.finish_reason;
            }
        }
    }

    /// Events whose data was not a chunk.
    pub fn unreadable(&self) -> usize {
        self.unreadable
    }

    /// The stream's `usage`, if the upstream sent it.
    pub fn usage(&self) -> Option<&Value> {
        self.usage.as_ref()
    }

    /// The assembled choices, in index order.
    pub fn finish(self) -> Vec<AssembledChoice> {
        self.choices
            .into_iter()
            .map(|(index, choice)| {
                let mut message = Map::new();
                message.insert("role".into(), json!(choice.role.unwrap_or_else(|| "assistant".into())));
                // OpenAI's non-streamed shape: a reply that only calls tools has `content:
                // null`, even when the stream opened with `"content": ""`.
                let content = choice
                    .content
                    .filter(|text| !text.is_empty() || choice.tool_calls.is_empty());
                message.insert("content".into(), content.map_or(Value::Null, Value::String));
                if let Some(reasoning) = choice.reasoning {
                    message.insert("reasoning_content".into(), Value::String(reasoning));
                }
                if let Some(refusal) = choice.refusal {
                    message.insert("refusal".into(), Value::String(refusal));
                }
                if !choice.tool_calls.is_empty() {
                    let calls: Vec<Value> = choice
                        .tool_calls
                        .into_values()
                        .map(|call| {
                            json!({
                                "id": call.id,
                                "type": if call.kind.is_empty() { "function".to_owned() } else { call.kind },
                                "function": {"name": call.name, "arguments": call.arguments}
                            })
                        })
                        .collect();
                    message.insert("tool_calls".into(), Value::Array(calls));
                }
                AssembledChoice {
                    index,
                    message: Value::Object(message),
                    finish_reason: choice.finish_reason,
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_call_reply_opened_with_empty_text_has_null_content() {
        let mut asm = StreamAssembler::default();
        asm.push(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#);
        asm.push(r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f","arguments":"{}"}}]}}]}"#);
        asm.push(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#);
        let choices = asm.finish();
        assert_eq!(choices[0].message["content"], Value::Null);

        let mut text = StreamAssembler::default();
        text.push(r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}"#);
        text.push(r#"{"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#);
        assert_eq!(
            text.finish()[0].message["content"],
            "",
            "an empty text reply stays text"
        );
    }

    #[test]
    fn tool_calls_are_joined_by_index_and_text_by_choice() {
        let mut asm = StreamAssembler::default();
        for data in [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":null,"reasoning_content":"think "}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"reasoning_content":"more"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"ls","arguments":"{\"pa"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_b","function":{"name":"cat","arguments":"{}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"th\":1}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":3}}"#,
            "[DONE]",
        ] {
            asm.push(data);
        }
        assert_eq!(asm.usage().unwrap()["prompt_tokens"], 9);
        let choices = asm.finish();
        assert_eq!(choices.len(), 1);
        assert_eq!(choices[0].finish_reason.as_deref(), Some("tool_calls"));
        assert_eq!(
            choices[0].message,
            json!({
                "role": "assistant", "content": null, "reasoning_content": "think more",
                "tool_calls": [
                    {"id": "call_a", "type": "function", "function": {"name": "ls", "arguments": "{\"path\":1}"}},
                    {"id": "call_b", "type": "function", "function": {"name": "cat", "arguments": "{}"}}
                ]
            })
        );
    }
}
