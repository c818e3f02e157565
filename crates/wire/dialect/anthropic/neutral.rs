//! Anthropic messages in the neutral (chat-completions) form strategies read.

use serde_json::{json, Value};

use super::block_type;
use super::*;
use crate::dialect::text::named_block;
use crate::dialect::Neutral;

/// The text of a `tool_result`'s content: a string, or its text blocks.
fn result_text(block: &Value) -> String {
    let text = match block.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p.get("text").and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => named_block(block_type(p), p),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    };
    if block.get("is_error").and_then(Value::as_bool) == Some(true) {
        format!("[error] {text}")
    } else {
        text
    }
}

/// A Messages message in the chat shape strategies read: text joined, `tool_use` as
/// `tool_calls`, each `tool_result` as a `tool` message; thinking is left out (it is
/// the model's, not the conversation's) and other blocks are named, not inlined.
pub(super) fn neutral(message: &Value) -> Vec<Value> {
    let role = message
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("user");
    let blocks: Vec<Value> = match message.get("content") {
        Some(Value::String(text)) => vec![json!({"type": "text", "text": text})],
        Some(Value::Array(blocks)) => blocks.clone(),
        _ => Vec::new(),
    };
    let mut out = Vec::new();
    let mut text: Vec<String> = Vec::new();
    let mut calls = Vec::new();
    for block in &blocks {
        match block_type(block) {
            "text" => text.push(
                block
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            ),
            "thinking" | "redacted_thinking" => {}
            "tool_use" => calls.push(json!({
                "id": block.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": block.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": block.get("input").map_or_else(String::new, Value::to_string),
                },
            })),
            "tool_result" => out.push(json!({
                "role": "tool",
                "tool_call_id": block.get("tool_use_id").cloned().unwrap_or(Value::Null),
                "content": result_text(block),
            })),
            other => text.push(named_block(other, block)),
        }
    }
    if role == "assistant" {
        let mut neutral = json!({"role": "assistant", "content": text.join("\n")});
        if !calls.is_empty() {
            neutral["tool_calls"] = Value::Array(calls);
        }
        out.push(neutral);
    } else if !text.is_empty() {
        out.push(json!({"role": role, "content": text.join("\n")}));
    }
    out
}

impl Neutral for AnthropicMessages {
    fn neutral(&self, message: &Value) -> Vec<Value> {
        neutral::neutral(message)
    }

    fn summary_client(&self, raw: Arc<dyn ModelClient>) -> Arc<dyn ModelClient> {
        Arc::new(TranslatingClient::new(
            raw,
            summary::to_messages,
            summary::to_completion,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_form_splits_results_and_calls() {
        let assistant = json!({"role": "assistant", "content": [
            {"type": "thinking", "thinking": "hmm", "signature": "sig"},
            {"type": "text", "text": "checking"},
            {"type": "tool_use", "id": "t1", "name": "grep", "input": {"q": "x"}}]});
        let out = neutral(&assistant);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["content"], "checking");
        assert_eq!(
            out[0]["tool_calls"][0]["function"]["arguments"],
            r#"{"q":"x"}"#
        );
        let user = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "found"}], "is_error": true},
            {"type": "text", "text": "thanks"}]});
        let out = neutral(&user);
        assert_eq!(
            out[0],
            json!({"role": "tool", "tool_call_id": "t1", "content": "[error] found"})
        );
        assert_eq!(out[1], json!({"role": "user", "content": "thanks"}));
    }
}
