//! A strict OpenAI Responses provider (`POST /v1/responses`): it refuses what the real
//! API refuses, with its error texts, so a test can prove that a proxy never sends an
//! invalid or over-window Responses request. It plays an agent (a user message gets a
//! `reasoning` item and a `function_call`; a call's output gets a text message) and a
//! summariser (a request whose `instructions` start like handoff's summary prompt),
//! streamed or not, and it stores responses for `previous_response_id`.
//!
//! What it enforces:
//! - every `function_call_output` has its `function_call`, and every call its output,
//!   with the real texts;
//! - a `reasoning` item is followed by another item;
//! - an `item_reference` names an item it output with `store` true or absent, and is
//!   read as that item (an unknown id is refused, as the API does);
//! - a per-model window, answered in one of three overflow styles.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};

use crate::native::{compacted_window, Asked, Refused};
use crate::strict::{asks_continued_summary, SUMMARY_PROMPT_START};
use crate::{Recorded, Reply};

/// How an over-window request is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverflowStyle {
    /// A 400 with code `context_length_exceeded`.
    Status,
    /// A stream that opens with an `error` event (a 400 when not streamed).
    StreamError,
    /// A stream (or a response) with `response.failed`.
    Failed,
}

/// The strict Responses provider's state, shared with the test.
pub struct StrictResponses {
    window: u64,
    serial: AtomicUsize,
    /// How over-window requests are refused.
    pub style: Mutex<OverflowStyle>,
    /// Requests refused, with the error text.
    pub refused: Mutex<Vec<String>>,
    /// Summary requests received.
    pub summaries: AtomicUsize,
    stored: Mutex<HashMap<String, Vec<Value>>>,
    /// The items of each conversation (`conversation`), as the Conversations API holds them.
    conversations: Mutex<HashMap<String, Vec<Value>>>,
    /// Output items it stored, by id, for `item_reference`s.
    items: Mutex<HashMap<String, Value>>,
    /// Bytes of opaque `encrypted_content` padding on each reasoning item.
    reasoning_bytes: AtomicUsize,
    /// Its own compaction (a trigger, `context_management`, `/responses/compact`).
    pub compactor: crate::native::Compactor,
    /// False for a server without the API's own compaction (a self-hosted model's):
    /// it refuses the asks as such servers do.
    native: std::sync::atomic::AtomicBool,
}

/// An error in OpenAI's shape.
pub fn error(status: u16, code: Option<&str>, message: &str) -> Reply {
    Reply::Json {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        body: json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}}),
    }
}

/// Tokens of a history, as this provider counts them (4 bytes a token).
pub fn count(items: &[Value], body: &Value) -> u64 {
    let text = |v: &Value| v.to_string().len() as u64 / 4;
    items.iter().map(text).sum::<u64>()
        + body.get("instructions").map_or(0, text)
        + body.get("tools").map_or(0, text)
}

const OVERFLOW: &str =
    "Your input exceeds the context window of this model. Please adjust your input and try again.";

impl StrictResponses {
    /// A provider whose models have a `window`-token context.
    pub fn new(window: u64) -> Arc<Self> {
        Arc::new(Self {
            window,
            serial: AtomicUsize::new(0),
            style: Mutex::new(OverflowStyle::Status),
            refused: Mutex::new(Vec::new()),
            summaries: AtomicUsize::new(0),
            stored: Mutex::new(HashMap::new()),
            conversations: Mutex::new(HashMap::new()),
            items: Mutex::new(HashMap::new()),
            reasoning_bytes: AtomicUsize::new(0),
            compactor: crate::native::Compactor::new(0x0a1_c0de),
            native: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Turns the API's own compaction off (or on again): the compaction endpoint is a
    /// 404, a `context_management` field, a `compaction_trigger` or `compaction` item
    /// a 400 that names it.
    pub fn set_native(&self, native: bool) {
        self.native.store(native, Ordering::SeqCst);
    }

    /// Without the API's own compaction, the refusal of what `body` asks, if it asks
    /// anything of it.
    fn refuse_native(&self, path: &str, body: &Value, items: &[Value]) -> Option<Reply> {
        if self.native.load(Ordering::SeqCst) {
            return None;
        }
        let (status, code, message) = crate::native::unsupported(path, body, items)?;
        Some(self.refuse(status, code, &message))
    }

    /// Makes each reasoning item's `encrypted_content` `bytes` longer, as a real
    /// model's runs to kilobytes.
    pub fn set_reasoning_bytes(&self, bytes: usize) {
        self.reasoning_bytes.store(bytes, Ordering::SeqCst);
    }

    /// Sets how over-window requests are refused.
    pub fn set_style(&self, style: OverflowStyle) {
        if let Ok(mut slot) = self.style.lock() {
            *slot = style;
        }
    }

    /// Answers one request.
    pub fn answer(&self, request: &Recorded) -> Reply {
        let body = request.json();
        let mut items = match &body["input"] {
            Value::String(text) => vec![json!({"role": "user", "content": text})],
            Value::Array(items) => items.clone(),
            _ => return self.refuse(400, None, "Missing required parameter: 'input'."),
        };
        // A conversation's items come first, as the API reads them; the input and the
        // output are added to it once answered.
        let conversation = match &body["conversation"] {
            Value::String(id) => Some(id.clone()),
            Value::Object(conversation) => conversation
                .get("id")
                .and_then(Value::as_str)
                .map(str::to_owned),
            _ => None,
        };
        let added = items.clone();
        if let Some(conversation) = &conversation {
            let held = self
                .conversations
                .lock()
                .map(|c| c.get(conversation).cloned().unwrap_or_default());
            items.splice(0..0, held.unwrap_or_default());
        }
        if let Some(previous) = body["previous_response_id"].as_str() {
            let stored = self.stored.lock().map(|s| s.get(previous).cloned());
            match stored {
                Ok(Some(history)) => items.splice(0..0, history),
                _ => {
                    return self.refuse(
                        400,
                        Some("previous_response_not_found"),
                        &format!("Previous response with id '{previous}' not found."),
                    )
                }
            };
        }
        // A reference is expanded to the stored item it names, as the API does.
        for item in items.iter_mut() {
            if item["type"] != "item_reference" {
                continue;
            }
            let id = item["id"].as_str().unwrap_or("").to_owned();
            let found = self.items.lock().ok().and_then(|s| s.get(&id).cloned());
            match found {
                Some(stored) => *item = stored,
                None => return self.refuse(404, None, &format!("Item with id '{id}' not found.")),
            }
        }
        let path = request.target.split('?').next().unwrap_or("");
        if let Some(refused) = self.refuse_native(path, &body, &items) {
            return refused;
        }
        let asked = Asked::of(path, &body, &items);
        // The API reads the input from its latest compaction item on.
        let (mut window, _) = match self.compactor.window(&items) {
            Ok(window) => window,
            Err(Refused(error)) => {
                let message = error["error"]["message"].as_str().unwrap_or("").to_owned();
                if let Ok(mut refused) = self.refused.lock() {
                    refused.push(message);
                }
                return Reply::Json {
                    status: StatusCode::BAD_REQUEST,
                    body: error,
                };
            }
        };
        if asked == Asked::Trigger {
            window.pop();
        }
        if let Err(message) = check(&window) {
            return self.refuse(400, None, &message);
        }
        let input = count(&window, &body);
        let streamed = body["stream"] == true && asked != Asked::Endpoint;
        if input > self.window {
            return self.overflow(streamed, input);
        }
        let serial = self.serial.fetch_add(1, Ordering::SeqCst);
        let instructions = body["instructions"].as_str().unwrap_or("");
        let output = match asked {
            Asked::Trigger => vec![self.compactor.mint(serial)],
            Asked::Endpoint => {
                let output = compacted_window(&items, self.compactor.mint(serial));
                return Reply::json(json!({
                    "id": format!("resp_mock_{serial:04}"), "object": "response.compaction",
                    "created_at": 1_700_000_000 + serial, "output": output,
                    "usage": {"input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens": 120, "output_tokens_details": {"reasoning_tokens": 0},
                              "total_tokens": input + 120}}));
            }
            _ if instructions.starts_with(SUMMARY_PROMPT_START)
                || asks_continued_summary(&Value::Array(window.clone())) =>
            {
                self.summaries.fetch_add(1, Ordering::SeqCst);
                vec![message(serial, &summary_text(&window))]
            }
            // Past the client's threshold, the API compacts before it answers.
            Asked::Threshold(threshold) if input > threshold => {
                let mut output = vec![self.compactor.mint(serial)];
                output.extend(agent_items(
                    &window,
                    serial,
                    self.reasoning_bytes.load(Ordering::SeqCst),
                ));
                output
            }
            _ => agent_items(&window, serial, self.reasoning_bytes.load(Ordering::SeqCst)),
        };
        let id = format!("resp_mock_{serial:04}");
        let model = body["model"].as_str().unwrap_or("gpt-mock").to_owned();
        let response = json!({
            "id": id, "object": "response", "created_at": 1_700_000_000 + serial, "status": "completed",
            "model": model, "output": output, "previous_response_id": body["previous_response_id"],
            "usage": {"input_tokens": input, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 12, "output_tokens_details": {"reasoning_tokens": 0},
                      "total_tokens": input + 12},
        });
        if let (Some(conversation), Ok(mut held)) = (&conversation, self.conversations.lock()) {
            let items = held.entry(conversation.clone()).or_default();
            items.extend(added);
            items.extend(output.iter().cloned());
        }
        if body["store"] != false {
            if let Ok(mut stored) = self.items.lock() {
                for item in &output {
                    if let Some(id) = item["id"].as_str() {
                        stored.insert(id.to_owned(), item.clone());
                    }
                }
            }
            items.extend(output.iter().cloned());
            if let Ok(mut stored) = self.stored.lock() {
                stored.insert(id, items);
            }
        }
        if streamed {
            Reply::Sse {
                frames: stream_events(&response),
                gap: Duration::ZERO,
                cut_after: None,
            }
        } else {
            Reply::json(response)
        }
    }

    fn refuse(&self, status: u16, code: Option<&str>, message: &str) -> Reply {
        if let Ok(mut refused) = self.refused.lock() {
            refused.push(message.to_owned());
        }
        error(status, code, message)
    }

    fn overflow(&self, streamed: bool, input: u64) -> Reply {
        let style = self.style.lock().map_or(OverflowStyle::Status, |s| *s);
        if let Ok(mut refused) = self.refused.lock() {
            refused.push(format!("{OVERFLOW} ({input} > {})", self.window));
        }
        let created = json!({"type": "response.created", "sequence_number": 0,
            "response": {"id": "resp_over", "object": "response", "status": "in_progress", "output": []}});
        let event =
            |e: &Value| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap_or(""));
        let failed = json!({"id": "resp_over", "object": "response", "status": "failed", "output": [],
            "error": {"code": "context_length_exceeded", "message": OVERFLOW}});
        match (style, streamed) {
            (OverflowStyle::Status, _) | (OverflowStyle::StreamError, false) => {
                error(400, Some("context_length_exceeded"), OVERFLOW)
            }
            (OverflowStyle::StreamError, true) => Reply::Sse {
                frames: vec![
                    event(&created),
                    event(
                        &json!({"type": "error", "code": "context_length_exceeded", "message": OVERFLOW, "param": null, "sequence_number": 1}),
                    ),
                ],
                gap: Duration::from_millis(2),
                cut_after: None,
            },
            (OverflowStyle::Failed, true) => Reply::Sse {
                frames: vec![
                    event(&created),
                    event(
                        &json!({"type": "response.failed", "sequence_number": 1, "response": failed}),
                    ),
                ],
                gap: Duration::from_millis(2),
                cut_after: None,
            },
            (OverflowStyle::Failed, false) => Reply::json(failed),
        }
    }
}

/// The Responses API's pairing and reasoning rules, with its error texts.
pub fn check(items: &[Value]) -> Result<(), String> {
    for (index, item) in items.iter().enumerate() {
        let kind = item["type"].as_str().unwrap_or("message");
        if let Some(role) = item.get("role").and_then(Value::as_str) {
            if !matches!(role, "user" | "assistant" | "system" | "developer") {
                return Err(format!("Invalid value: '{role}'. Supported values are: 'assistant', 'system', 'developer', and 'user'."));
            }
        }
        let call_id = item["call_id"].as_str().unwrap_or("");
        if kind == "function_call_output"
            && !items[..index]
                .iter()
                .any(|i| i["type"] == "function_call" && i["call_id"] == call_id)
        {
            return Err(format!(
                "No tool call found for function call output with call_id {call_id}."
            ));
        }
        if kind == "function_call"
            && !items[index + 1..]
                .iter()
                .any(|i| i["type"] == "function_call_output" && i["call_id"] == call_id)
        {
            return Err(format!("No tool output found for function call {call_id}."));
        }
        if kind == "reasoning" && index + 1 == items.len() {
            return Err(format!(
                "Item '{}' of type 'reasoning' was provided without its required following item.",
                item["id"].as_str().unwrap_or("")
            ));
        }
    }
    Ok(())
}

fn message(serial: usize, text: &str) -> Value {
    json!({"id": format!("msg_{serial:04}"), "type": "message", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// The agent's next items: reasoning and a call for a user's text, text after an output.
fn agent_items(items: &[Value], serial: usize, padding: usize) -> Vec<Value> {
    let last = items.last().cloned().unwrap_or(Value::Null);
    if last["type"] == "function_call_output" {
        return vec![message(
            serial,
            &format!("answer {serial}: the record is noted"),
        )];
    }
    let question = match &last["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join(" "),
        _ => String::new(),
    };
    vec![
        json!({"id": format!("rs_{serial:04}"), "type": "reasoning", "summary": [],
               "encrypted_content": format!("gAAAA-opaque-{serial}{}", "x".repeat(padding))}),
        json!({"id": format!("fc_{serial:04}"), "type": "function_call", "status": "completed",
               "call_id": format!("call_{serial:04}"), "name": "lookup",
               "arguments": json!({"query": question.chars().take(80).collect::<String>()}).to_string()}),
    ]
}

/// A summary that lists every `FACT-…` of the request's input.
fn summary_text(items: &[Value]) -> String {
    crate::strict::fact_summary(&Value::Array(items.to_vec()).to_string())
}

/// The SSE events of a streamed response, as the Responses API sends them.
pub fn stream_events(response: &Value) -> Vec<String> {
    let mut sequence = 0;
    let mut events = Vec::new();
    let mut push = |mut data: Value| {
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        let name = data["type"].as_str().unwrap_or("").to_owned();
        events.push(format!("event: {name}\ndata: {data}\n\n"));
    };
    let mut opening = response.clone();
    opening["status"] = json!("in_progress");
    opening["output"] = json!([]);
    opening["usage"] = Value::Null;
    push(json!({"type": "response.created", "response": opening.clone()}));
    push(json!({"type": "response.in_progress", "response": opening}));
    for (index, item) in response["output"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let id = item["id"].clone();
        let mut added = item.clone();
        match item["type"].as_str() {
            Some("message") => {
                added["content"] = json!([]);
                added["status"] = json!("in_progress");
                push(
                    json!({"type": "response.output_item.added", "output_index": index, "item": added}),
                );
                let text = item["content"][0]["text"].as_str().unwrap_or("");
                push(
                    json!({"type": "response.content_part.added", "item_id": id, "output_index": index, "content_index": 0,
                            "part": {"type": "output_text", "text": "", "annotations": []}}),
                );
                let (head, tail) = text.split_at(text.len() / 2);
                for delta in [head, tail] {
                    push(
                        json!({"type": "response.output_text.delta", "item_id": id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}),
                    );
                }
                push(
                    json!({"type": "response.output_text.done", "item_id": id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
                );
                push(
                    json!({"type": "response.content_part.done", "item_id": id, "output_index": index, "content_index": 0, "part": item["content"][0]}),
                );
            }
            Some("function_call") => {
                added["arguments"] = json!("");
                added["status"] = json!("in_progress");
                push(
                    json!({"type": "response.output_item.added", "output_index": index, "item": added}),
                );
                let arguments = item["arguments"].as_str().unwrap_or("");
                push(
                    json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": index, "delta": arguments}),
                );
                push(
                    json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": index, "arguments": arguments}),
                );
            }
            _ => push(
                json!({"type": "response.output_item.added", "output_index": index, "item": added}),
            ),
        }
        push(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }
    push(json!({"type": "response.completed", "response": response}));
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_real_apis_pairing_rules_are_enforced() {
        let call =
            json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"});
        let output = json!({"type": "function_call_output", "call_id": "c1", "output": "1"});
        let user = json!({"role": "user", "content": "q"});
        assert_eq!(check(&[user.clone(), call.clone(), output.clone()]), Ok(()));
        assert!(check(&[user.clone(), output.clone()])
            .unwrap_err()
            .contains("No tool call found for function call output with call_id c1"));
        assert!(check(&[user.clone(), call])
            .unwrap_err()
            .contains("No tool output found for function call c1"));
        let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": []});
        assert!(check(&[user, reasoning])
            .unwrap_err()
            .contains("without its required following item"));
    }
}
