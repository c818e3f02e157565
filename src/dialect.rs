//! The OpenAI chat-completions dialect: the typed fields the proxy needs, read
//! without losing a byte of the rest.
//!
//! Each message keeps its raw JSON, so the log and the upstream get exactly what the
//! client sent, unknown fields included. Requests the provider would reject anyway
//! (unknown roles, broken tool pairs) are refused here with the provider's error shape.

use std::collections::HashSet;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::ApiError;

/// Why a chat-completions body was refused.
#[derive(Debug, thiserror::Error)]
pub enum DialectError {
    /// The body is not JSON, or not the expected shape; carries line and column.
    #[error("request body is not a valid chat-completions request: {0}")]
    Json(#[from] serde_json::Error),
    /// A message is not a JSON object.
    #[error("messages[{index}] is not an object")]
    NotAnObject {
        /// Position in `messages`.
        index: usize,
    },
    /// A message's role is missing or unknown.
    #[error("messages[{index}].role: unknown role {role:?}; expected one of system, developer, user, assistant, tool, function")]
    UnknownRole {
        /// Position in `messages`.
        index: usize,
        /// What the client sent.
        role: String,
    },
    /// A tool message answers no pending call.
    #[error("messages[{index}]: tool message with tool_call_id {id:?} does not answer a tool call of the preceding assistant message")]
    OrphanToolResult {
        /// Position in `messages`.
        index: usize,
        /// The unmatched id.
        id: String,
    },
    /// An assistant's tool calls are not all answered before the next turn.
    #[error(
        "messages[{index}]: assistant tool_calls are not followed by tool messages for ids {ids:?}"
    )]
    UnansweredToolCalls {
        /// Position of the assistant message.
        index: usize,
        /// The ids with no answer.
        ids: Vec<String>,
    },
}

impl From<DialectError> for ApiError {
    fn from(err: DialectError) -> Self {
        let code = match &err {
            DialectError::Json(_) => "invalid_json",
            DialectError::NotAnObject { .. } | DialectError::UnknownRole { .. } => {
                "invalid_message"
            }
            DialectError::OrphanToolResult { .. } | DialectError::UnansweredToolCalls { .. } => {
                "invalid_tool_pairs"
            }
        };
        ApiError::invalid_request(code, err.to_string())
    }
}

/// A message's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `system`.
    System,
    /// `developer`, the newer name for system on OpenAI reasoning models.
    Developer,
    /// `user`.
    User,
    /// `assistant`.
    Assistant,
    /// `tool`, a tool result.
    Tool,
    /// `function`, the legacy tool result.
    Function,
}

impl Role {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "function" => Role::Function,
            _ => return None,
        })
    }

    /// True for the roles that may be pinned at the head of a request.
    pub fn is_instruction(self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }
}

/// One message: its role, its parsed value, and its bytes exactly as received.
#[derive(Debug, Clone)]
pub struct Message {
    /// The role.
    pub role: Role,
    /// The parsed message; with serde_json's sorted maps this prints canonically.
    pub value: Value,
    /// The message exactly as the client sent it.
    pub raw: Box<RawValue>,
}

impl Message {
    /// Reads one message from its raw JSON.
    pub fn from_raw(index: usize, raw: Box<RawValue>) -> Result<Self, DialectError> {
        let value: Value = serde_json::from_str(raw.get())?;
        let Value::Object(map) = &value else {
            return Err(DialectError::NotAnObject { index });
        };
        let role_text = map.get("role").and_then(Value::as_str).unwrap_or_default();
        let role = Role::parse(role_text).ok_or_else(|| DialectError::UnknownRole {
            index,
            role: role_text.to_owned(),
        })?;
        Ok(Self { role, value, raw })
    }

    /// The ids of this message's `tool_calls`, if any.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = &str> {
        self.value
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|call| call.get("id").and_then(Value::as_str))
    }

    /// True for an assistant message that calls tools.
    pub fn has_tool_calls(&self) -> bool {
        self.tool_call_ids().next().is_some()
    }

    /// The `tool_call_id` a tool message answers.
    pub fn tool_call_id(&self) -> Option<&str> {
        self.value.get("tool_call_id").and_then(Value::as_str)
    }
}

#[derive(Deserialize)]
struct Wire {
    #[serde(default)]
    model: Option<String>,
    messages: Vec<Box<RawValue>>,
    #[serde(default)]
    tools: Option<Box<RawValue>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
}

/// The fields of a chat-completions request that the proxy acts on.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The requested model; empty when the client sent none.
    pub model: String,
    /// The messages in order.
    pub messages: Vec<Message>,
    /// The `tools` schemas, raw.
    pub tools: Option<Box<RawValue>>,
    /// True when the client asked for SSE.
    pub stream: bool,
    /// `max_completion_tokens`, else `max_tokens`.
    pub max_output: Option<u64>,
}

impl ChatRequest {
    /// Parses and checks a body; the error says where it went wrong.
    pub fn parse(body: &[u8]) -> Result<Self, DialectError> {
        let wire: Wire = serde_json::from_slice(body)?;
        let messages = wire
            .messages
            .into_iter()
            .enumerate()
            .map(|(index, raw)| Message::from_raw(index, raw))
            .collect::<Result<Vec<_>, _>>()?;
        check_tool_pairs(&messages)?;
        Ok(Self {
            model: wire.model.unwrap_or_default(),
            messages,
            tools: wire.tools,
            stream: wire.stream.unwrap_or(false),
            max_output: wire.max_completion_tokens.or(wire.max_tokens),
        })
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
        ChatRequest::parse(json.as_bytes())
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
    fn unknown_role_is_named() {
        let err = parse(r#"{"messages":[{"role":"wizard","content":"x"}]}"#).unwrap_err();
        assert!(err.to_string().contains("messages[0].role"), "{err}");
        assert!(err.to_string().contains("wizard"), "{err}");
    }

    #[test]
    fn tool_pairs_must_be_complete() {
        let ok = r#"{"messages":[{"role":"user","content":"x"},
            {"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"tool","tool_call_id":"a","content":"1"},{"role":"user","content":"y"}]}"#;
        parse(ok).unwrap();
        let orphan = r#"{"messages":[{"role":"user","content":"x"},{"role":"tool","tool_call_id":"zz","content":"1"}]}"#;
        assert!(matches!(
            parse(orphan),
            Err(DialectError::OrphanToolResult { index: 1, .. })
        ));
        let unanswered = r#"{"messages":[{"role":"user","content":"x"},
            {"role":"assistant","tool_calls":[{"id":"a","type":"function","function":{"name":"f","arguments":"{}"}}]},
            {"role":"user","content":"y"}]}"#;
        assert!(matches!(
            parse(unanswered),
            Err(DialectError::UnansweredToolCalls { index: 1, .. })
        ));
    }
}
