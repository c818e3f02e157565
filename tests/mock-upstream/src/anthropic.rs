//! A strict Anthropic Messages provider (`POST /v1/messages`): it refuses what the real
//! API refuses, with its error texts, so a test can prove that a proxy never sends an
//! invalid or over-window Messages request. It plays an agent (a user turn gets a
//! `tool_use`, a `tool_result` gets text) and a summariser (a request whose `system`
//! starts like handoff's summary prompt), streamed or not, with real event sequences.
//!
//! What it enforces:
//! - the first message is `user`, and roles alternate;
//! - every message has non-empty content;
//! - an assistant's `tool_use` blocks are answered by `tool_result` blocks at the start
//!   of the very next user message, and no `tool_result` lacks its `tool_use`;
//! - the conversation does not end with an assistant message (no prefill);
//! - a per-model window, with the real "prompt is too long" and "exceed context limit"
//!   texts.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};

use crate::native::{
    clears_thinking, compact_trigger, pauses_after_compaction, trigger_refusal, Refused,
};
use crate::strict::{asks_continued_summary, SUMMARY_PROMPT_START};
use crate::{Recorded, Reply};

/// The strict Messages provider's state, shared with the test.
pub struct StrictAnthropic {
    window: u64,
    serial: AtomicUsize,
    /// Requests refused, with the error text.
    pub refused: Mutex<Vec<String>>,
    /// Summary requests received.
    pub summaries: AtomicUsize,
    /// When set, summary requests get a 529 `overloaded_error`.
    pub fail_summaries: AtomicBool,
    /// Its own compaction (`compact_20260112`), and what it minted.
    pub compactor: crate::native::Compactor,
    /// Requests whose old thinking it cleared (`clear_thinking_20251015`).
    pub cleared: AtomicUsize,
    /// False for an Anthropic-compatible endpoint without context management: its
    /// fields, beta flags and blocks are refused.
    native: AtomicBool,
    /// The `anthropic-beta` header of every request it answered.
    pub betas: Mutex<Vec<String>>,
}

/// An error in the Messages API's shape.
pub fn error(status: u16, kind: &str, message: &str) -> Reply {
    Reply::Json {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        body: json!({"type": "error", "error": {"type": kind, "message": message}}),
    }
}

/// Tokens of a Messages request, as this provider counts them (4 bytes a token).
pub fn count(body: &Value) -> u64 {
    let text = |v: &Value| v.to_string().len() as u64 / 4;
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| 4 + text(&m["content"]))
        .sum::<u64>()
        + text(&body["system"])
        + body.get("tools").map_or(0, text)
}

impl StrictAnthropic {
    /// A provider whose models have a `window`-token context.
    pub fn new(window: u64) -> Arc<Self> {
        Arc::new(Self {
            window,
            serial: AtomicUsize::new(0),
            refused: Mutex::new(Vec::new()),
            summaries: AtomicUsize::new(0),
            fail_summaries: AtomicBool::new(false),
            compactor: crate::native::Compactor::new(0x0a2_c0de),
            cleared: AtomicUsize::new(0),
            native: AtomicBool::new(true),
            betas: Mutex::new(Vec::new()),
        })
    }

    /// Turns the API's context management off (or on again), as an
    /// Anthropic-compatible endpoint of another provider answers: a
    /// `context_management` or `compaction` field is an extra input, a `compaction`
    /// block an unknown tag.
    pub fn set_native(&self, native: bool) {
        self.native.store(native, Ordering::SeqCst);
    }

    /// Without context management, the refusal of what `body` asks of it.
    fn refuse_native(&self, body: &Value) -> Option<Reply> {
        if self.native.load(Ordering::SeqCst) {
            return None;
        }
        for field in ["context_management", "compaction"] {
            if body.get(field).is_some() {
                return Some(self.refuse(&format!("{field}: Extra inputs are not permitted")));
            }
        }
        let messages = body["messages"].as_array()?;
        let (index, position) = messages.iter().enumerate().find_map(|(index, message)| {
            let blocks = message["content"].as_array()?;
            let position = blocks.iter().position(|b| b["type"] == "compaction")?;
            Some((index, position))
        })?;
        Some(self.refuse(&format!("messages.{index}.content.{position}: Input tag 'compaction' found using 'type' does not match any of the expected tags: 'text', 'image', 'tool_use', 'tool_result', 'thinking', 'redacted_thinking'")))
    }

    /// Answers one request.
    pub fn answer(&self, request: &Recorded) -> Reply {
        let sent = request.json();
        let beta = request
            .headers
            .get("anthropic-beta")
            .and_then(|v| v.to_str().ok());
        if let (Ok(mut betas), Some(beta)) = (self.betas.lock(), beta) {
            betas.push(beta.to_owned());
        }
        if let Some(refused) = self.refuse_native(&sent) {
            return refused;
        }
        if let Some(message) = trigger_refusal(&sent) {
            return self.refuse(&message);
        }
        // The API reads a request from the message holding its latest compaction block.
        let messages = sent["messages"].as_array().cloned().unwrap_or_default();
        let window = match self.compactor.message_window(&messages) {
            Ok(window) => window,
            Err(Refused(error)) => {
                let message = error["error"]["message"].as_str().unwrap_or("").to_owned();
                return self.refuse(&message);
            }
        };
        let mut body = sent.clone();
        if !messages.is_empty() {
            body["messages"] = Value::Array(window);
        }
        // Old thinking is not read when the request clears it: all but the last turn's.
        let cleared = if clears_thinking(&body) {
            clear_thinking(&mut body)
        } else {
            0
        };
        if let Err(message) = check(&body) {
            return self.refuse(&message);
        }
        let input = count(&body);
        let output = body["max_tokens"].as_u64().unwrap_or(0);
        if input > self.window {
            return self.refuse(&format!(
                "prompt is too long: {input} tokens > {} maximum",
                self.window
            ));
        }
        if input + output > self.window {
            return self.refuse(&format!(
                "input length and `max_tokens` exceed context limit: {input} + {output} > {}, decrease input length or `max_tokens` and try again",
                self.window
            ));
        }
        let serial = self.serial.fetch_add(1, Ordering::SeqCst);
        let system = match &body["system"] {
            Value::String(text) => text.clone(),
            Value::Array(blocks) => blocks
                .iter()
                .filter_map(|b| b["text"].as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            _ => String::new(),
        };
        let blocks = if system.starts_with(SUMMARY_PROMPT_START)
            || asks_continued_summary(&body["messages"])
        {
            self.summaries.fetch_add(1, Ordering::SeqCst);
            if self.fail_summaries.load(Ordering::SeqCst) {
                return error(529, "overloaded_error", "Overloaded");
            }
            vec![json!({"type": "text", "text": summary_text(&body)})]
        } else {
            agent_blocks(&body, serial)
        };
        // Past the trigger of its compaction edit, the API compacts first: the reply
        // opens with the block, and its usage counts each iteration.
        let compacted = compact_trigger(&body)
            .filter(|trigger| input > *trigger)
            .map(|_| {
                let summary = crate::strict::fact_summary(&body["messages"].to_string());
                self.compactor.mint_block(summary)
            });
        let mut blocks = blocks;
        let mut usage = json!({"input_tokens": input, "output_tokens": 12,
                               "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0});
        let paused = compacted.is_some() && pauses_after_compaction(&body);
        if let Some(block) = compacted {
            // Paused after it, the reply is the compaction alone.
            if paused {
                blocks.clear();
            }
            blocks.insert(0, block);
            usage["iterations"] = json!([
                {"type": "compaction", "input_tokens": input, "output_tokens": 200},
                {"type": "message", "input_tokens": 400, "output_tokens": 12}]);
        }
        let context_management = (cleared > 0).then(|| {
            self.cleared.fetch_add(1, Ordering::SeqCst);
            json!({"applied_edits": [{"type": "clear_thinking_20251015",
                "cleared_thinking_turns": cleared, "cleared_input_tokens": 100 * cleared}]})
        });
        let stop = if paused {
            "compaction"
        } else if blocks.iter().any(|b| b["type"] == "tool_use") {
            "tool_use"
        } else {
            "end_turn"
        };
        let model = body["model"].as_str().unwrap_or("claude-mock").to_owned();
        if body["stream"] == true {
            let mut frames = stream_events(&model, &blocks, stop, input);
            if let Some(applied) = &context_management {
                // The edits it applied come with the message's final delta.
                let delta = json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null},
                                   "usage": {"output_tokens": 12}, "context_management": applied});
                if let Some(last) = frames
                    .iter_mut()
                    .rev()
                    .find(|f| f.starts_with("event: message_delta"))
                {
                    *last = format!("event: message_delta\ndata: {delta}\n\n");
                }
            }
            Reply::Sse {
                frames,
                gap: Duration::ZERO,
                cut_after: None,
            }
        } else {
            let mut reply = json!({
                "id": format!("msg_mock_{serial}"), "type": "message", "role": "assistant",
                "model": model, "content": blocks, "stop_reason": stop, "stop_sequence": null,
                "usage": usage
            });
            if let Some(applied) = context_management {
                reply["context_management"] = applied;
            }
            Reply::json(reply)
        }
    }

    fn refuse(&self, message: &str) -> Reply {
        if let Ok(mut refused) = self.refused.lock() {
            refused.push(message.to_owned());
        }
        error(400, "invalid_request_error", message)
    }
}

/// The content blocks of a message: a string is one text block.
pub fn blocks_of(message: &Value) -> Vec<Value> {
    match &message["content"] {
        Value::String(text) => vec![json!({"type": "text", "text": text})],
        Value::Array(blocks) => blocks.clone(),
        _ => Vec::new(),
    }
}

/// The Messages API's structural rules, with its error texts.
pub fn check(body: &Value) -> Result<(), String> {
    let messages = body["messages"]
        .as_array()
        .ok_or("messages: Field required")?;
    let Some(first) = messages.first() else {
        return Err("messages: at least one message is required".into());
    };
    if first["role"] != "user" && crate::native::compaction_blocks(first).next().is_none() {
        return Err("messages: first message must use the \"user\" role".into());
    }
    let mut pending: HashSet<String> = HashSet::new();
    let mut previous_role = "";
    for (index, message) in messages.iter().enumerate() {
        let role = message["role"].as_str().unwrap_or("");
        if !matches!(role, "user" | "assistant") {
            return Err(format!(
                "messages.{index}.role: Input should be 'user' or 'assistant'"
            ));
        }
        // A reply paused after its compaction and the reply that went on from it are
        // one assistant turn, as the API combines them.
        let after_pause = index > 0 && role == "assistant" && {
            let before = blocks_of(&messages[index - 1]);
            !before.is_empty() && before.iter().all(|b| b["type"] == "compaction")
        };
        if role == previous_role && !after_pause {
            return Err(format!("messages: roles must alternate between \"user\" and \"assistant\", but found multiple \"{role}\" roles in a row"));
        }
        previous_role = role;
        let blocks = blocks_of(message);
        let empty = blocks.is_empty()
            || blocks
                .iter()
                .all(|b| b["type"] == "text" && b["text"].as_str().is_some_and(str::is_empty));
        if empty {
            return Err(format!("messages.{index}: all messages must have non-empty content except for the optional final assistant message"));
        }
        if role == "user" {
            // tool_result blocks first, answering exactly the previous tool_use blocks.
            let results: Vec<&Value> = blocks
                .iter()
                .take_while(|b| b["type"] == "tool_result")
                .collect();
            for (position, block) in blocks.iter().enumerate() {
                if block["type"] == "tool_result" && position >= results.len() {
                    return Err(format!("messages.{index}.content.{position}: tool_result blocks must come before any other content"));
                }
            }
            for (position, result) in results.iter().enumerate() {
                let id = result["tool_use_id"].as_str().unwrap_or("");
                if !pending.remove(id) {
                    return Err(format!("messages.{index}.content.{position}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."));
                }
            }
            if !pending.is_empty() {
                let mut ids: Vec<&String> = pending.iter().collect();
                ids.sort();
                return Err(format!("messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.", ids.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")));
            }
        } else {
            pending = blocks
                .iter()
                .filter(|b| b["type"] == "tool_use")
                .filter_map(|b| b["id"].as_str().map(str::to_owned))
                .collect();
        }
    }
    // A reply paused after its compaction is sent back as it is: the API goes on from
    // the compaction block.
    let paused = messages.last().is_some_and(|m| {
        let blocks = blocks_of(m);
        !blocks.is_empty() && blocks.iter().all(|b| b["type"] == "compaction")
    });
    if previous_role == "assistant" && !paused {
        return Err("This model does not support assistant message prefill. The conversation must end with a user message.".into());
    }
    Ok(())
}

/// Takes the thinking blocks out of every assistant turn but the last, as
/// `clear_thinking_20251015` does: how many turns it cleared.
fn clear_thinking(body: &mut Value) -> usize {
    let Some(messages) = body["messages"].as_array_mut() else {
        return 0;
    };
    let last = messages.iter().rposition(|m| m["role"] == "assistant");
    let mut cleared = 0;
    for (index, message) in messages.iter_mut().enumerate() {
        if Some(index) == last || message["role"] != "assistant" {
            continue;
        }
        if let Some(blocks) = message["content"].as_array_mut() {
            let before = blocks.len();
            blocks.retain(|b| b["type"] != "thinking" && b["type"] != "redacted_thinking");
            cleared += usize::from(blocks.len() < before);
        }
    }
    cleared
}

/// The agent's next blocks: a `tool_use` for a user's text, text after a tool result.
fn agent_blocks(body: &Value, serial: usize) -> Vec<Value> {
    let last = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or(Value::Null);
    let blocks = blocks_of(&last);
    if blocks.iter().any(|b| b["type"] == "tool_result") {
        return vec![
            json!({"type": "text", "text": format!("answer {serial}: the record is noted")}),
        ];
    }
    let question: String = blocks
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let thinking = (body["thinking"]["type"] == "enabled").then(|| {
        json!({"type": "thinking", "thinking": format!("Step {serial}: look it up."),
               "signature": format!("sig-{serial:04}")})
    });
    thinking
        .into_iter()
        .chain([
            json!({"type": "text", "text": "Let me look that up."}),
            json!({"type": "tool_use", "id": format!("toolu_{serial:04}"), "name": "lookup",
               "input": {"query": question.chars().take(80).collect::<String>()}}),
        ])
        .collect()
}

/// A summary that lists every `FACT-…` of the request's user message, or of the whole
/// conversation it continues.
fn summary_text(body: &Value) -> String {
    match asks_continued_summary(&body["messages"]) {
        true => crate::strict::fact_summary(&body["messages"].to_string()),
        false => crate::strict::fact_summary(&body["messages"][0]["content"].to_string()),
    }
}

/// The SSE events of a streamed message, as the Messages API sends them.
pub fn stream_events(model: &str, blocks: &[Value], stop: &str, input: u64) -> Vec<String> {
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {
            "id": "msg_mock_stream", "type": "message", "role": "assistant", "model": model,
            "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input, "output_tokens": 1,
                      "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0}}}),
    )];
    for (index, block) in blocks.iter().enumerate() {
        if block["type"] == "tool_use" {
            let start =
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}});
            events.push(event(
                "content_block_start",
                json!({"type": "content_block_start", "index": index, "content_block": start}),
            ));
            let arguments = block["input"].to_string();
            let (head, tail) = arguments.split_at(arguments.len() / 2);
            for part in [head, tail] {
                events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "input_json_delta", "partial_json": part}})));
            }
        } else if block["type"] == "thinking" {
            events.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "thinking", "thinking": "", "signature": ""}})));
            events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "thinking_delta", "thinking": block["thinking"]}})));
            events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "signature_delta", "signature": block["signature"]}})));
        } else if block["type"] == "compaction" {
            // The block arrives whole, in one delta, after an empty start.
            events.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "compaction", "content": null}})));
            events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "compaction_delta", "content": block["content"], "encrypted_content": block["encrypted_content"]}})));
        } else {
            let text = block["text"].as_str().unwrap_or("");
            events.push(event("content_block_start", json!({"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}})));
            let (head, tail) = text.split_at(text.len() / 2);
            for part in [head, tail] {
                events.push(event("content_block_delta", json!({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": part}})));
            }
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(event(
        "message_delta",
        json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 12}}),
    ));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(messages: Value) -> Value {
        json!({"model": "claude-mock", "max_tokens": 100, "messages": messages})
    }

    #[test]
    fn the_real_apis_structural_rules_are_enforced() {
        let tool_turn = json!([
            {"role": "user", "content": "look it up"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "lookup", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"}, {"type": "text", "text": "and?"}]},
        ]);
        assert_eq!(check(&body(tool_turn)), Ok(()));
        let cases = [
            (
                json!([{"role": "assistant", "content": "hi"}]),
                "first message",
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]),
                "alternate",
            ),
            (
                json!([{"role": "user", "content": ""}]),
                "non-empty content",
            ),
            (
                json!([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]),
                "prefill",
            ),
            (
                json!([
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
                    {"role": "user", "content": "no result"},
                ]),
                "without `tool_result`",
            ),
            (
                json!([
                    {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "x"}]},
                ]),
                "unexpected `tool_use_id`",
            ),
            (
                json!([
                    {"role": "user", "content": "a"},
                    {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}]},
                    {"role": "user", "content": [{"type": "text", "text": "first"}, {"type": "tool_result", "tool_use_id": "toolu_1", "content": "x"}]},
                ]),
                "must come before",
            ),
        ];
        for (messages, expected) in cases {
            let refused = check(&body(messages.clone())).unwrap_err();
            assert!(refused.contains(expected), "{messages}: {refused}");
        }
    }

    #[test]
    fn a_window_refuses_with_the_real_texts_and_streams_end_with_message_stop() {
        let provider = StrictAnthropic::new(50);
        let recorded = |value: Value| Recorded {
            method: http::Method::POST,
            target: "/v1/messages".into(),
            headers: http::HeaderMap::new(),
            body: value.to_string().into(),
        };
        let long = body(json!([{"role": "user", "content": "x".repeat(400)}]));
        let Reply::Json {
            status,
            body: refused,
        } = provider.answer(&recorded(long))
        else {
            panic!("not JSON")
        };
        assert_eq!(status, 400);
        assert!(refused["error"]["message"]
            .as_str()
            .unwrap()
            .starts_with("prompt is too long: "));
        let mut streamed = body(json!([{"role": "user", "content": "hi"}]));
        streamed["stream"] = json!(true);
        streamed["max_tokens"] = json!(10);
        let Reply::Sse { frames, .. } = provider.answer(&recorded(streamed)) else {
            panic!("not a stream")
        };
        assert!(frames[0].starts_with("event: message_start"));
        assert!(frames.iter().any(|f| f.contains("input_json_delta")));
        assert!(frames.last().unwrap().starts_with("event: message_stop"));
    }
}
