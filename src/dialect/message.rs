//! Dialect-neutral messages: a role, the parsed value and the raw bytes exactly as the
//! client sent them, and the tool ids a message calls or answers, in either wire shape.

use serde_json::value::RawValue;
use serde_json::Value;

use crate::error::ApiError;

/// Why a request body was refused.
#[derive(Debug, thiserror::Error)]
pub enum DialectError {
    /// The body is not JSON, or not the expected shape; carries line and column.
    #[error("request body is not a valid {api} request: {source}")]
    Json {
        /// The API the body was read as.
        api: &'static str,
        /// Where it went wrong.
        source: serde_json::Error,
    },
    /// A message is not a JSON object.
    #[error("messages[{index}] is not an object")]
    NotAnObject {
        /// Position in `messages`.
        index: usize,
    },
    /// A message's role is missing or unknown.
    #[error("messages[{index}].role: unknown role {role:?}; expected one of {expected}")]
    UnknownRole {
        /// Position in `messages`.
        index: usize,
        /// What the client sent.
        role: String,
        /// The roles the API knows.
        expected: &'static str,
    },
    /// A tool result answers no pending call.
    #[error("messages[{index}]: tool result for id {id:?} does not answer a tool call of the preceding assistant message")]
    OrphanToolResult {
        /// Position in `messages`.
        index: usize,
        /// The unmatched id.
        id: String,
    },
    /// An assistant's tool calls are not all answered before the next turn.
    #[error("messages[{index}]: assistant tool calls are not answered by the next message(s) for ids {ids:?}")]
    UnansweredToolCalls {
        /// Position of the assistant message.
        index: usize,
        /// The ids with no answer.
        ids: Vec<String>,
    },
    /// A structural rule of the API is broken (e.g. a tool result not first).
    #[error("messages[{index}]: {rule}")]
    Shape {
        /// Position in `messages`.
        index: usize,
        /// The rule.
        rule: String,
    },
}

impl DialectError {
    /// The error for a body that is not the expected JSON.
    pub fn json(api: &'static str, source: serde_json::Error) -> Self {
        Self::Json { api, source }
    }
}

impl From<DialectError> for ApiError {
    fn from(err: DialectError) -> Self {
        let code = match &err {
            DialectError::Json { .. } => "invalid_json",
            DialectError::NotAnObject { .. }
            | DialectError::UnknownRole { .. }
            | DialectError::Shape { .. } => "invalid_message",
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
    /// `system`, or Anthropic's top-level `system` as a pinned message.
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
    /// The role named `text`, if any dialect knows it.
    pub fn parse(text: &str) -> Option<Self> {
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

/// The content blocks of an Anthropic-shaped message (empty for a string content).
fn blocks<'v>(value: &'v Value, kind: &'static str) -> impl Iterator<Item = &'v Value> {
    value
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(move |block| block.get("type").and_then(Value::as_str) == Some(kind))
}

impl Message {
    /// Reads one message from its raw JSON; `expected` lists the roles the API knows.
    pub fn from_raw(
        index: usize,
        raw: Box<RawValue>,
        api: &'static str,
        known: fn(Role) -> bool,
        expected: &'static str,
    ) -> Result<Self, DialectError> {
        let value: Value =
            serde_json::from_str(raw.get()).map_err(|err| DialectError::json(api, err))?;
        let Value::Object(map) = &value else {
            return Err(DialectError::NotAnObject { index });
        };
        let role_text = map.get("role").and_then(Value::as_str).unwrap_or_default();
        let role = Role::parse(role_text)
            .filter(|role| known(*role))
            .ok_or_else(|| DialectError::UnknownRole {
                index,
                role: role_text.to_owned(),
                expected,
            })?;
        Ok(Self { role, value, raw })
    }

    /// The Responses item type (`function_call`, `reasoning`, …), if it has one.
    pub fn item_type(&self) -> Option<&str> {
        self.value.get("type").and_then(Value::as_str)
    }

    /// True for a Responses `reasoning` item, which must travel with the item after it.
    pub fn glues_to_next(&self) -> bool {
        self.item_type() == Some("reasoning")
    }

    /// True for a message of text (any dialect), as opposed to a call or a reasoning item.
    pub fn is_text_message(&self) -> bool {
        matches!(self.item_type(), None | Some("message"))
    }

    /// The ids of the tools this message calls: OpenAI `tool_calls`, Anthropic
    /// `tool_use` blocks, a Responses `function_call`/`custom_tool_call` item.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = &str> {
        let openai = self
            .value
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|call| call.get("id").and_then(Value::as_str));
        let anthropic = blocks(&self.value, "tool_use")
            .filter_map(|block| block.get("id").and_then(Value::as_str));
        let item = matches!(self.item_type(), Some("function_call" | "custom_tool_call"))
            .then(|| self.value.get("call_id").and_then(Value::as_str))
            .flatten();
        openai.chain(anthropic).chain(item)
    }

    /// True for an assistant message that calls tools.
    pub fn has_tool_calls(&self) -> bool {
        self.tool_call_ids().next().is_some()
    }

    /// The `tool_call_id` an OpenAI tool message answers.
    pub fn tool_call_id(&self) -> Option<&str> {
        self.value.get("tool_call_id").and_then(Value::as_str)
    }

    /// The ids this message answers: a tool message's `tool_call_id`, or the
    /// `tool_use_id` of each Anthropic `tool_result` block.
    pub fn answered_ids(&self) -> Vec<&str> {
        let mut ids: Vec<&str> = self.tool_call_id().into_iter().collect();
        if matches!(
            self.item_type(),
            Some("function_call_output" | "custom_tool_call_output")
        ) {
            ids.extend(self.value.get("call_id").and_then(Value::as_str));
        }
        ids.extend(
            blocks(&self.value, "tool_result")
                .filter_map(|block| block.get("tool_use_id").and_then(Value::as_str)),
        );
        ids
    }

    /// True for a message that carries tool results (and so belongs to the unit of the
    /// assistant turn that called them).
    pub fn is_tool_answer(&self) -> bool {
        match self.role {
            Role::Tool | Role::Function => true,
            Role::User => blocks(&self.value, "tool_result").next().is_some(),
            _ => false,
        }
    }
}
