//! The OpenAI chat-completions dialect: the typed fields the proxy needs, read
//! without losing a byte of the rest.
//!
//! Each message keeps its raw JSON, so the log and the upstream get exactly what the
//! client sent, unknown fields included. Requests the provider would reject anyway
//! (unknown roles, broken tool pairs) are refused here with the provider's error shape.

mod assemble;
mod content;
mod usage;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use handoff_plugin_api::ModelClient;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

pub use assemble::{AssembledChoice, StreamAssembler};

use super::{
    ChatRequest, Dialect, DialectError, DialectKind, Markers, Message, Reading, Role, StreamEnd,
    StreamReply,
};
use crate::base::chunks::Chunks;
use crate::base::reply::{Assembled, CapturedReply};
use crate::error::ApiError;
use crate::rewrite::Rewrite;

const API: &str = "chat-completions";

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
    #[serde(default)]
    tools: Option<Box<RawValue>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default, borrow)]
    stream_options: Option<&'a RawValue>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
}

/// OpenAI chat completions.
pub struct OpenAiChat;

impl Dialect for OpenAiChat {
    fn kind(&self) -> DialectKind {
        DialectKind::OpenAiChat
    }

    fn path(&self) -> &'static str {
        "/v1/chat/completions"
    }

    fn objects(&self) -> super::objects::Objects {
        super::objects::Objects {
            id_fields: &[
                "file_id",
                "file_ids",
                "input_file_id",
                "vector_store_id",
                "vector_store_ids",
                "assistant_id",
                "thread_id",
                "batch_id",
            ],
            id_prefixes: &[
                "file-",
                "batch_",
                "vs_",
                "vsfb_",
                "chatcmpl-",
                "asst_",
                "thread_",
                "run_",
                "upload_",
                "part_",
                "ftjob-",
                "eval_",
                "evalrun_",
            ],
            listings: &[
                "/v1/files",
                "/v1/batches",
                "/v1/vector_stores",
                "/v1/chat/completions",
                "/v1/assistants",
                "/v1/threads",
                "/v1/fine_tuning/jobs",
                "/v1/evals",
            ],
        }
    }

    fn key_paths(&self) -> &'static [&'static str] {
        &[
            "/v1/completions",
            "/v1/embeddings",
            "/v1/moderations",
            "/v1/models",
            "/v1/audio",
            "/v1/images",
            "/v1/files",
            "/v1/uploads",
            "/v1/batches",
            "/v1/vector_stores",
        ]
    }

    fn name(&self) -> &'static str {
        "openai"
    }

    fn api(&self) -> &'static str {
        API
    }

    fn tracks(&self, path: &str) -> bool {
        path.ends_with("/chat/completions")
    }

    fn api_headers(&self) -> &'static [&'static str] {
        &["openai-organization", "openai-project"]
    }

    fn markers(&self) -> Markers {
        content::MARKERS
    }

    fn handoff_ok(&self, handoff: &Value) -> bool {
        handoff["content"].is_string()
    }

    fn carries_reasoning(&self, message: &Value) -> bool {
        content::carries_reasoning(message)
    }

    fn shorten_tool_results(
        &self,
        message: &mut Value,
        shorten: &mut dyn FnMut(&mut Value) -> bool,
    ) -> bool {
        content::shorten_tool_results(message, shorten)
    }

    fn calls_tools(&self, message: &Value) -> bool {
        content::calls_tools(message)
    }

    fn push_text(&self, message: &Value, push: &mut dyn FnMut(&str)) {
        content::push_text(message, push);
    }

    fn push_part(&self, part: &Value, push: &mut dyn FnMut(&str)) -> bool {
        content::push_part(part, push)
    }

    fn parse_body(&self, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let reading = Reading::new(body, DialectKind::OpenAiChat);
        let wire: Wire<'_> = reading
            .json(&["tools"])
            .map_err(|err| DialectError::json(API, err))?;
        let messages = reading.messages(&wire.messages, |index, raw| {
            Message::from_raw(index, raw, DialectKind::OpenAiChat)
        })?;
        Ok(ChatRequest {
            dialect: DialectKind::OpenAiChat,
            model: wire.model.unwrap_or_default(),
            messages,
            tools: reading.member_bytes("tools", wire.tools),
            tools_digest: reading.member_digest("tools"),
            stream: wire.stream.unwrap_or(false),
            usage_unasked: wire.stream == Some(true) && wire.stream_options.is_none(),
            max_output: wire.max_completion_tokens.or(wire.max_tokens),
            thinking: false,
            top_level: 0,
            provider_compacts: false,
            asked: None,
            compacted_history: false,
            expanded: None,
            server_held: false,
            continues: None,
            continues_conversation: false,
            pinned: None,
            floated: Vec::new(),
            list: reading.list_span(),
        })
    }

    fn check_pairs(&self, messages: &[Message]) -> Result<(), DialectError> {
        check_tool_pairs(messages)
    }

    fn continuation(&self) -> Value {
        json!({"role": "user", "content": crate::dialect::pair::CONTINUATION})
    }

    fn handoff(&self, text: &str, reasoning_marker: bool) -> Value {
        if reasoning_marker {
            json!({"role": "assistant", "content": text, "reasoning_content": crate::dialect::pair::REASONING_MARKER})
        } else {
            json!({"role": "assistant", "content": text})
        }
    }

    fn error_json(&self, err: &ApiError) -> Value {
        // handoff's own error shape is OpenAI's.
        err.to_json()
    }

    fn is_overflow(&self, body: &Value) -> bool {
        crate::dialect::overflow::is_context_length_error(body)
    }

    fn replies_from_json(&self, body: &[u8]) -> Result<Assembled, serde_json::Error> {
        replies_from_json(body)
    }

    fn stream_reply(&self) -> Box<dyn StreamReply> {
        Box::<StreamAssembler>::default()
    }

    fn ask_usage(&self, body: &Chunks) -> Option<(Vec<Bytes>, Box<dyn Rewrite>)> {
        Some((usage::ask(body)?, Box::<usage::StripUsage>::default()))
    }

    fn refused_usage_ask(&self, error_body: &[u8]) -> bool {
        // Servers that predate `stream_options` name it in their refusal.
        memchr::memmem::find(error_body, b"stream_options").is_some()
    }

    fn stream_end(&self) -> StreamEnd {
        StreamEnd {
            field: b"data:",
            values: &[b"[DONE]"],
            containing: b"",
        }
    }

    fn reply_deltas(&self, event: &Value) -> Vec<super::ReplyDelta> {
        let Some(choices) = event.get("choices").and_then(Value::as_array) else {
            return Vec::new();
        };
        let mut deltas = Vec::new();
        for (at, choice) in choices.iter().enumerate() {
            let index = choice["index"].as_u64().unwrap_or(at as u64);
            if choice["delta"]["content"].is_string() {
                let pointer = format!("/choices/{at}/delta/content");
                deltas.push(super::ReplyDelta::new(
                    format!("choice {index}"),
                    pointer,
                    false,
                ));
            }
            let calls = choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten();
            for (n, call) in calls.enumerate() {
                if call["function"]["arguments"].is_string() {
                    let channel = format!("choice {index} call {}", call["index"]);
                    let pointer = format!("/choices/{at}/delta/tool_calls/{n}/function/arguments");
                    deltas.push(super::ReplyDelta::new(channel, pointer, true));
                }
            }
        }
        deltas
    }

    fn input_tokens(&self, usage: &Value) -> Option<u64> {
        usage.get("prompt_tokens")?.as_u64()
    }

    fn billed(&self, usage: &Value) -> Option<crate::config::Billed> {
        let field = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64);
        let prompt = field("/prompt_tokens")?;
        let cached = field("/prompt_tokens_details/cached_tokens")
            .unwrap_or(0)
            .min(prompt);
        // A summary call through another API comes back in this shape, with the
        // cache writes that API bills apart (Anthropic's) kept beside.
        let written = field("/cache_creation_input_tokens")
            .unwrap_or(0)
            .min(prompt - cached);
        Some(crate::config::Billed {
            input: prompt - cached - written,
            cache_read: cached,
            cache_write: written,
            output: field("/completion_tokens").unwrap_or(0),
        })
    }

    fn neutral(&self, message: &Value) -> Vec<Value> {
        vec![message.clone()]
    }

    fn summary_client(&self, raw: Arc<dyn ModelClient>) -> Arc<dyn ModelClient> {
        raw
    }

    fn continued_call(&self) -> Option<crate::dialect::ContinuedCall> {
        Some(crate::dialect::ContinuedCall {
            append: crate::dialect::continued::push_user_turn,
            settle: |body, max_tokens| {
                crate::dialect::continued::not_streamed(body);
                // Reasoning models refuse max_tokens; a client that sent the newer
                // field has its limit there.
                let field = if body.contains_key("max_completion_tokens") {
                    "max_completion_tokens"
                } else {
                    "max_tokens"
                };
                body.insert(field.into(), max_tokens.into());
            },
            reply: crate::dialect::continued::as_is,
        })
    }
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<CompletionChoice>,
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct CompletionChoice {
    #[serde(default)]
    index: u64,
    message: Box<RawValue>,
    #[serde(default)]
    finish_reason: Option<String>,
}

/// The choices of a non-streamed completion, each message exactly as sent.
pub fn replies_from_json(body: &[u8]) -> Result<Assembled, serde_json::Error> {
    let completion: Completion = crate::dialect::json_body(body)?;
    let replies = completion
        .choices
        .into_iter()
        .map(|choice| CapturedReply {
            message: choice.message,
            finish_reason: choice.finish_reason,
            choice: choice.index,
        })
        .collect();
    Ok(Assembled {
        replies,
        usage: completion.usage,
        ..Assembled::default()
    })
}

impl StreamReply for StreamAssembler {
    fn push(&mut self, _event: &str, data: &str) {
        StreamAssembler::push(self, data);
    }

    fn finish(self: Box<Self>) -> Assembled {
        let usage = self.usage().cloned();
        let replies = StreamAssembler::finish(*self)
            .into_iter()
            .filter_map(|choice| {
                let message = serde_json::value::to_raw_value(&choice.message).ok()?;
                Some(CapturedReply {
                    message,
                    finish_reason: choice.finish_reason,
                    choice: choice.index,
                })
            })
            .collect();
        Assembled {
            replies,
            usage,
            ..Assembled::default()
        }
    }
}

/// Checks OpenAI's pairing rule: every tool result answers a call of the assistant
/// message before it, and every call is answered before the next non-tool message.
pub fn check_tool_pairs<'a>(
    messages: impl IntoIterator<Item = &'a Message>,
) -> Result<(), DialectError> {
    let mut pending: Vec<String> = Vec::new();
    let mut pending_from = 0;
    let unanswered = |index: usize, ids: &[String]| DialectError::UnansweredToolCalls {
        index,
        ids: ids.to_vec(),
    };
    for (index, message) in messages.into_iter().enumerate() {
        match message.role {
            Role::Tool => {
                let id = message.tool_call_id().unwrap_or_default();
                let Some(at) = pending.iter().position(|p| p == id) else {
                    return Err(DialectError::OrphanToolResult {
                        index,
                        id: id.to_owned(),
                    });
                };
                pending.swap_remove(at);
            }
            _ => {
                if !pending.is_empty() {
                    return Err(unanswered(pending_from, &pending));
                }
                if message.role == Role::Assistant {
                    let mut seen = HashSet::new();
                    pending = message
                        .tool_call_ids()
                        .filter(|id| seen.insert(*id))
                        .map(str::to_owned)
                        .collect();
                    pending_from = index;
                }
            }
        }
    }
    if pending.is_empty() {
        Ok(())
    } else {
        Err(unanswered(pending_from, &pending))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<ChatRequest, DialectError> {
        OpenAiChat.parse(json.as_bytes())
    }

    #[test]
    fn unknown_fields_survive_in_the_raw_message() {
        let req = parse(r#"{"model":"m","messages":[{"role":"user","content":"hi","x_extra":{"b":1,"a":2}}],"stream":true,"max_tokens":7}"#).unwrap();
        assert_eq!(
            req.messages[0].raw.get(),
            r#"{"role":"user","content":"hi","x_extra":{"b":1,"a":2}}"#
        );
        assert!(req.stream);
        assert_eq!(req.max_output, Some(7));
    }

    #[test]
    fn malformed_json_reports_the_position() {
        let err = parse("{\"messages\": [\n  {\"role\": \"user\",}\n]}").unwrap_err();
        assert!(err.to_string().contains("line 2"), "{err}");
    }

    #[test]
    fn an_unknown_role_passes_and_a_missing_one_is_named() {
        let request = parse(r#"{"messages":[{"role":"wizard","content":"x"}]}"#).unwrap();
        assert_eq!(request.messages[0].role, Role::Other);
        let err = parse(r#"{"messages":[{"content":"x"}]}"#).unwrap_err();
        assert!(err.to_string().contains("messages[0].role"), "{err}");
    }

    fn pairs(body: &str) -> Result<(), DialectError> {
        check_tool_pairs(&parse(body)?.messages)
    }

    #[test]
    fn tool_pairs_must_be_complete() {
        let ok = r#"{"messages":[{"role":"user","content":"x"},
            {"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"1"},{"role":"user","content":"y"}]}"#;
        pairs(ok).unwrap();
        let orphan = r#"{"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"zz","content":"1"}]}"#;
        assert!(matches!(
            pairs(orphan),
            Err(DialectError::OrphanToolResult { index: 1, .. })
        ));
        let unanswered = r#"{"messages":[{"role":"user","content":"x"},
            {"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"user","content":"y"}]}"#;
        assert!(matches!(
            pairs(unanswered),
            Err(DialectError::UnansweredToolCalls { index: 1, .. })
        ));
    }
}
