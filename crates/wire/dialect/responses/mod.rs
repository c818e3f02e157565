//! OpenAI's Responses API (`POST /v1/responses`).
//!
//! A stateless request (the full `input`, no `previous_response_id` or
//! `conversation`) is tracked and compacted like chat. Every item is kept exactly as
//! sent, kinds handoff does not know included. `instructions` is pinned: it is tracked
//! as one system message `{"role":"system","content":<instructions as sent>}` and never
//! leaves the body's own field. A `function_call` and its output are one unit, and a
//! `reasoning` item is glued to the item after it. A stateful request is logged and
//! passed through, never rewritten: the upstream holds its history.

mod api;
mod assemble;
mod content;
mod credentials;
mod failures;
mod neutral;
mod pair;
mod parsing;
mod replies;
mod summary;

use std::collections::HashSet;
use std::sync::Arc;

use handoff_plugin_api::ModelClient;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::translate::TranslatingClient;
use super::{
    ChatRequest, DialectError, DialectKind, Markers, Message, Opening, Role, StreamEnd, StreamReply,
};
use super::{RawMessage, Reading};
use crate::base::chunks::Chunks;
use crate::base::reply::Assembled;
use crate::dialect::overflow::is_context_length_error;
use crate::dialect::pair::CONTINUATION;
use crate::error::ApiError;

const API: &str = "Responses API";

/// OpenAI Responses.
pub struct OpenAiResponses;

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(default, borrow)]
    input: Option<Input<'a>>,
    #[serde(default)]
    instructions: Option<Box<RawValue>>,
    #[serde(default)]
    tools: Option<Box<RawValue>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_output_tokens: Option<u64>,
    #[serde(default)]
    previous_response_id: Option<String>,
    #[serde(default)]
    conversation: Option<Value>,
    #[serde(default)]
    context_management: Option<Box<RawValue>>,
}

/// The provider's compaction endpoint, under the API's path.
const COMPACT_PATH: &str = "/v1/responses/compact";

/// True when `context_management` asks the server to compact (a `compaction` entry).
fn asks_compaction(context_management: Option<&Value>) -> bool {
    context_management
        .and_then(Value::as_array)
        .is_some_and(|entries| entries.iter().any(|e| e["type"] == "compaction"))
}

/// The item's role: a message's own, the model's for its calls and reasoning, a
/// tool's for call outputs.
fn item_role(index: usize, item: &Value) -> Result<Role, DialectError> {
    if let Some(role) = item.get("role") {
        return match role.as_str() {
            Some(text) => Ok(Role::parse(text)),
            None => Err(DialectError::MissingRole { index }),
        };
    }
    let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
    Ok(if kind.ends_with("_output") {
        Role::Tool
    } else if kind == super::message::COMPACTION_TRIGGER {
        // The client's request for a compaction, not the model's: it opens the last
        // unit, and no cut ever leaves it anywhere but last.
        Role::User
    } else {
        Role::Assistant
    })
}

/// The `input`: one string, or the items, borrowed, in one scan of the body.
enum Input<'a> {
    Text(String),
    Items(Vec<&'a RawValue>),
}

impl<'de: 'a, 'a> Deserialize<'de> for Input<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = Input<'de>;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a list of input items")
            }

            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<Input<'de>, E> {
                Ok(Input::Text(text.to_owned()))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Input<'de>, A::Error> {
                let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
                while let Some(item) = seq.next_element::<&'de RawValue>()? {
                    items.push(item);
                }
                Ok(Input::Items(items))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// The `input` as messages: a string is one user message, items share the body's bytes.
fn items(reading: &Reading<'_>, input: Option<&Input<'_>>) -> Result<Vec<Message>, DialectError> {
    match input {
        None => Ok(Vec::new()),
        Some(Input::Text(text)) => {
            let value = json!({"role": "user", "content": text});
            Ok(vec![Message::parsed(
                Role::User,
                RawMessage::from(value.to_string()),
                value,
            )])
        }
        Some(Input::Items(list)) => reading.messages(list, read_item),
    }
}

/// One input item at `index`, through the facts cache.
fn read_item(index: usize, raw: RawMessage) -> Result<Message, DialectError> {
    Message::read(raw, DialectKind::Responses, |value| {
        if !value.is_object() {
            return Err(DialectError::NotAnObject { index });
        }
        item_role(index, value)
    })
}

/// The text of a message's or an output's content: a string, or its text parts.
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .map(|p| match p.get("text").and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => format!(
                    "[{}]",
                    p.get("type").and_then(Value::as_str).unwrap_or("part")
                ),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// An item in the chat shape strategies read: messages as text, calls as
/// `tool_calls`, outputs as `tool` messages; reasoning is left out (it is the model's,
/// and encrypted), and other kinds are named.
fn neutral(item: &Value) -> Option<Value> {
    let field = |name: &str| item.get(name).cloned().unwrap_or(Value::Null);
    if let Some(role) = item.get("role").and_then(Value::as_str) {
        return Some(json!({"role": role, "content": text_of(item.get("content"))}));
    }
    match item.get("type").and_then(Value::as_str).unwrap_or("") {
        "reasoning" => None,
        kind @ ("function_call" | "custom_tool_call") => {
            let arguments = if kind == "function_call" {
                field("arguments")
            } else {
                field("input")
            };
            Some(
                json!({"role": "assistant", "content": null, "tool_calls": [{
                    "id": field("call_id"), "type": "function",
                    "function": {"name": field("name"), "arguments": arguments.as_str().unwrap_or("")},
                }]}),
            )
        }
        "function_call_output" | "custom_tool_call_output" => Some(json!({
            "role": "tool", "tool_call_id": field("call_id"), "content": text_of(item.get("output")),
        })),
        other => Some(
            json!({"role": "assistant", "content": crate::dialect::text::named_block(other, item)}),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::{Api, Failures, Parsing};

    fn parse(body: Value) -> Result<ChatRequest, DialectError> {
        OpenAiResponses.parse(body.to_string().as_bytes())
    }

    #[test]
    fn the_compaction_endpoint_asks_the_provider_to_compact_and_is_never_called_by_handoff() {
        assert!(OpenAiResponses.tracks("/v1/responses/compact"));
        let body =
            json!({"model": "m", "input": [{"role": "user", "content": "hi"}], "stream": true});
        let body = Chunks::from(bytes::Bytes::from(body.to_string()));
        let compact = OpenAiResponses
            .parse_at("/openai/v1/responses/compact?api-version=1", &body)
            .unwrap();
        assert!(compact.provider_compacts && !compact.stream);
        let asked = compact.asked.unwrap();
        assert_eq!(asked.path.as_deref(), Some("/openai/v1/responses/compact"));
        let create = OpenAiResponses.parse_at("/v1/responses", &body).unwrap();
        assert!(!create.provider_compacts && create.asked.is_none());
        assert_eq!(
            OpenAiResponses.call_path("m", Some("/openai/v1/responses/compact?api-version=1")),
            "/openai/v1/responses?api-version=1"
        );
        assert_eq!(OpenAiResponses.call_path("m", None), "/v1/responses");
    }

    #[test]
    fn only_a_failed_reply_with_a_window_error_overflowed() {
        let overflowed =
            |reply: Value| OpenAiResponses.reply_overflowed(reply.to_string().as_bytes());
        let window = json!({"code": "context_length_exceeded", "message": "too long"});
        assert!(overflowed(
            json!({"object": "response", "status": "failed", "error": window, "output": []})
        ));
        assert!(!overflowed(
            json!({"status": "failed", "error": {"code": "server_error", "message": "oops"}})
        ));
        assert!(!overflowed(
            json!({"status": "completed", "error": null, "output": []})
        ));
        assert!(!OpenAiResponses.reply_overflowed(b"[1,"));
    }

    #[test]
    fn instructions_are_pinned_and_items_kept() {
        let request = parse(json!({"model": "m", "instructions": "be brief", "input": [
            {"role": "user", "content": "hi"},
            {"type": "item_reference", "id": "msg_1"},
            {"type": "compaction", "encrypted_content": "zzz"},
        ]}))
        .unwrap();
        assert_eq!(request.top_level, 1);
        assert_eq!(request.messages.len(), 4);
        assert_eq!(request.messages[0].role, Role::System);
        assert!(request.messages[3].raw.get().contains("zzz"));
        let short = parse(json!({"model": "m", "input": "hello"})).unwrap();
        assert_eq!(
            *short.messages[0].value(),
            json!({"role": "user", "content": "hello"})
        );
    }

    #[test]
    fn a_request_asks_the_provider_to_compact_by_context_management_or_a_trigger() {
        let user = json!({"role": "user", "content": "hi"});
        let asks = |body: Value| parse(body).unwrap().provider_compacts;
        assert!(asks(json!({"model": "m", "input": [user],
            "context_management": [{"type": "compaction", "compact_threshold": 1000}]})));
        let triggered =
            parse(json!({"model": "m", "input": [user, {"type": "compaction_trigger"}]})).unwrap();
        assert!(triggered.provider_compacts);
        assert_eq!(
            triggered.messages[1].role,
            Role::User,
            "the client's, not the model's"
        );
        assert!(triggered.messages[1].is_provider_compaction());
        assert!(!asks(json!({"model": "m", "input": [user]})));
        assert!(!asks(
            json!({"model": "m", "input": [user], "context_management": []})
        ));
    }

    #[test]
    fn pairing_and_reasoning_rules() {
        let pairs = |body: Value| OpenAiResponses.check_pairs(&parse(body).unwrap().messages);
        let orphan =
            json!({"input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]});
        assert!(matches!(
            pairs(orphan),
            Err(DialectError::OrphanToolResult { .. })
        ));
        let unanswered = json!({"input": [{"role": "user", "content": "q"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}]});
        assert!(matches!(
            pairs(unanswered),
            Err(DialectError::UnansweredToolCalls { .. })
        ));
        let dangling = json!({"input": [{"role": "user", "content": "q"}, {"type": "reasoning", "id": "rs_1", "summary": []}]});
        assert!(matches!(pairs(dangling), Err(DialectError::Shape { .. })));
        let stateful = json!({"previous_response_id": "resp_1", "input": [{"type": "function_call_output", "call_id": "c9", "output": "x"}]});
        assert!(parse(stateful).unwrap().server_held);
    }

    #[test]
    fn overflow_is_seen_in_all_three_styles() {
        let status = json!({"error": {"message": "Your input exceeds the context window of this model.", "type": "invalid_request_error", "code": "context_length_exceeded"}});
        assert!(OpenAiResponses.is_overflow(&status));
        let event = json!({"type": "error", "code": "context_length_exceeded", "message": "too long", "sequence_number": 2});
        assert_eq!(OpenAiResponses.opening_event(&event), Opening::Overflow);
        let failed = json!({"type": "response.failed", "response": {"status": "failed", "error": {"code": "context_length_exceeded", "message": "too long"}}});
        assert_eq!(OpenAiResponses.opening_event(&failed), Opening::Overflow);
        let created = json!({"type": "response.created", "response": {}});
        assert_eq!(OpenAiResponses.opening_event(&created), Opening::NeedMore);
        let server =
            json!({"type": "response.failed", "response": {"error": {"code": "server_error"}}});
        assert_eq!(OpenAiResponses.opening_event(&server), Opening::Relay);
    }

    #[test]
    fn neutral_form_of_items() {
        let call = json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\":1}", "id": "fc_1"});
        assert_eq!(neutral(&call).unwrap()["tool_calls"][0]["id"], "c1");
        let output = json!({"type": "function_call_output", "call_id": "c1", "output": "42"});
        assert_eq!(
            neutral(&output).unwrap(),
            json!({"role": "tool", "tool_call_id": "c1", "content": "42"})
        );
        assert!(neutral(&json!({"type": "reasoning", "summary": []})).is_none());
        let message = json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]});
        assert_eq!(neutral(&message).unwrap()["content"], "hi");
    }
}
