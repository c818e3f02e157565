//! The OpenAI chat-completions dialect: the typed fields the proxy needs, read
//! without losing a byte of the rest.
//!
//! Each message keeps its raw JSON, so the log and the upstream get exactly what the
//! client sent, unknown fields included. Requests the provider would reject anyway
//! (unknown roles, broken tool pairs) are refused here with the provider's error shape.

mod api;
mod assemble;
mod content;
mod credentials;
mod failures;
mod neutral;
mod pair;
mod parsing;
mod replies;
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
    ChatRequest, DialectError, DialectKind, Markers, Message, Reading, Role, StreamEnd, StreamReply,
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
    use crate::dialect::Parsing;

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
