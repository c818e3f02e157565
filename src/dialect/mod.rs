//! Wire formats. Each [`Dialect`] reads its API's requests into dialect-neutral
//! [`Message`]s (keeping every message's raw bytes), and owns everything else that
//! depends on the format: tool pairing, the handoff pair's shape, errors, overflow
//! detection, reply assembly, usage, and summary calls. The pipeline, tracking and
//! compaction only ever see the neutral form.

pub mod anthropic;
mod message;
pub mod openai;
pub mod overflow;
pub mod pair;
pub mod responses;
mod translate;

use std::sync::Arc;

use bytes::Bytes;
use handoff_plugin_api::ModelClient;
use serde_json::value::RawValue;
use serde_json::Value;

pub use message::{DialectError, Message, RawMessage, Role};
pub use openai::check_tool_pairs;

use crate::base::reply::Assembled;
use crate::error::ApiError;

/// The wire formats handoff understands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DialectKind {
    /// OpenAI chat completions, `POST …/chat/completions`.
    #[default]
    OpenAiChat,
    /// Anthropic Messages, `POST …/v1/messages`.
    Anthropic,
    /// OpenAI Responses, `POST …/v1/responses`.
    Responses,
}

impl DialectKind {
    /// The implementation.
    pub fn get(self) -> &'static dyn Dialect {
        match self {
            DialectKind::OpenAiChat => &openai::OpenAiChat,
            DialectKind::Anthropic => &anthropic::AnthropicMessages,
            DialectKind::Responses => &responses::OpenAiResponses,
        }
    }

    /// The name used in logs, records and the exec protocol.
    pub fn name(self) -> &'static str {
        match self {
            DialectKind::OpenAiChat => "openai",
            DialectKind::Anthropic => "anthropic",
            DialectKind::Responses => "responses",
        }
    }

    /// The API's name in error messages.
    pub fn api(self) -> &'static str {
        match self {
            DialectKind::OpenAiChat => "chat-completions",
            DialectKind::Anthropic => "Messages API",
            DialectKind::Responses => "Responses API",
        }
    }

    /// The dialect named `name` in a log line; unknown names read as OpenAI chat.
    pub fn from_name(name: Option<&str>) -> Self {
        match name {
            Some("anthropic") => DialectKind::Anthropic,
            Some("responses") => DialectKind::Responses,
            _ => DialectKind::OpenAiChat,
        }
    }

    /// The dialect whose error shape answers a request for `path` (every path, so a
    /// 401 on `/v1/messages` is already in Anthropic's shape).
    pub fn for_path(path: &str) -> Self {
        if path.ends_with("/v1/messages") || path.contains("/v1/messages/") {
            DialectKind::Anthropic
        } else {
            DialectKind::OpenAiChat
        }
    }

    /// The dialect that tracks `POST path`, if one does.
    pub fn tracking(path: &str) -> Option<Self> {
        if path.ends_with("/chat/completions") {
            Some(DialectKind::OpenAiChat)
        } else if path.ends_with("/v1/messages") {
            Some(DialectKind::Anthropic)
        } else if path.ends_with("/v1/responses") {
            Some(DialectKind::Responses)
        } else {
            None
        }
    }
}

/// The fields of a request that the proxy acts on, in any dialect.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The wire format it came in.
    pub dialect: DialectKind,
    /// The requested model; empty when the client sent none.
    pub model: String,
    /// Pinned messages first (OpenAI's leading system messages, Anthropic's top-level
    /// `system` as one system message), then the conversation in order.
    pub messages: Vec<Message>,
    /// How many leading pinned messages stand for top-level fields (`system`,
    /// `instructions`): tracked and counted, never rendered into the list.
    pub top_level: usize,
    /// True when the upstream holds the conversation (`previous_response_id`,
    /// `conversation`): tracked and logged, never rewritten.
    pub server_held: bool,
    /// What a server-held request continues: its `previous_response_id`, else its
    /// `conversation` id.
    pub continues: Option<String>,
    /// True when `continues` names a server-side conversation, which moves on with
    /// every response (a response id names one fixed point).
    pub continues_conversation: bool,
    /// How many leading messages are pinned, when `compaction.pin` widened it; the
    /// leading system/developer messages otherwise.
    pub pinned: Option<usize>,
    /// Where the last pinned messages sat in the client's list, in order, when
    /// `compaction.pin` found them after the history and floated them into the pinned
    /// part: the log keeps the places, so a replay puts them back.
    pub floated: Vec<usize>,
    /// The `tools` schemas, raw.
    pub tools: Option<Box<RawValue>>,
    /// True when the client asked for SSE.
    pub stream: bool,
    /// True when the client streams without asking for usage (OpenAI's
    /// `stream_options`), so handoff may ask for it ([`Dialect::ask_usage`]).
    pub usage_unasked: bool,
    /// The reserved output: `max_completion_tokens`, `max_tokens`.
    pub max_output: Option<u64>,
    /// True when extended thinking is on (Anthropic), which constrains the cut.
    pub thinking: bool,
}

impl ChatRequest {
    /// How many leading messages are pinned: kept verbatim in every view, logged as the
    /// pinned set, outside the prefix chain.
    pub fn pinned_len(&self) -> usize {
        self.pinned.unwrap_or_else(|| {
            self.messages
                .iter()
                .take_while(|m| m.role.is_instruction())
                .count()
        })
    }

    /// Parses an OpenAI chat-completions body (the log's own format).
    pub fn parse(body: &[u8]) -> Result<Self, DialectError> {
        openai::OpenAiChat.parse(body)
    }

    /// The dialect implementation.
    pub fn dialect(&self) -> &'static dyn Dialect {
        self.dialect.get()
    }
}

/// A streamed reply being reassembled from its SSE events.
pub trait StreamReply: Send {
    /// Feeds one event: its `event:` name (empty if none) and its `data`.
    fn push(&mut self, event: &str, data: &str);

    /// The assembled replies and the usage, in the non-streamed shape.
    fn finish(self: Box<Self>) -> Assembled;
}

/// The lines that end a stream: `field: value` at the start of a line, for any of
/// `values`.
#[derive(Debug, Clone, Copy)]
pub struct StreamEnd {
    /// The SSE field, e.g. `data:`.
    pub field: &'static [u8],
    /// Its values, e.g. `[DONE]`.
    pub values: &'static [&'static [u8]],
}

/// Reads a JSON body whose values borrow from it. The body is checked as UTF-8 once,
/// so serde_json does not check each borrowed message again.
pub fn json_body<'a, T: serde::Deserialize<'a>>(body: &'a [u8]) -> Result<T, serde_json::Error> {
    match std::str::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        // Not UTF-8: serde_json's own reading reports where.
        Err(_) => serde_json::from_slice(body),
    }
}

/// What the opening bytes of a streamed answer say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// An error event says the input exceeded the window; nothing else was sent.
    Overflow,
    /// Output (or another error) began: relay it.
    Relay,
    /// Only preamble so far: read more.
    NeedMore,
}

/// Most bytes of a stream's opening read before it is relayed regardless.
const OPENING_LIMIT: usize = 64 * 1024;

/// Reads the complete SSE events in `head`: an overflow error before any output is an
/// [`Opening::Overflow`]; the first output event, or any other error, is
/// [`Opening::Relay`].
pub fn stream_opening(dialect: &dyn Dialect, head: &[u8]) -> Opening {
    let text = String::from_utf8_lossy(head);
    let normalized = text.replace("\r\n", "\n");
    let mut events: Vec<&str> = normalized.split("\n\n").collect();
    // The last piece is an event still arriving (empty when `head` ends an event).
    events.pop();
    for event in events {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            continue;
        }
        let Ok(json) = serde_json::from_str::<Value>(&data.join("\n")) else {
            return Opening::Relay;
        };
        match dialect.opening_event(&json) {
            Opening::NeedMore => {}
            decided => return decided,
        }
    }
    if head.len() > OPENING_LIMIT {
        Opening::Relay
    } else {
        Opening::NeedMore
    }
}

/// One wire format.
pub trait Dialect: Send + Sync {
    /// Which one this is.
    fn kind(&self) -> DialectKind;

    /// The path a request of this dialect is posted to, for calls handoff makes itself.
    fn path(&self) -> &'static str;

    /// Parses and checks a request body; the error says where it went wrong. The
    /// messages share `body`'s bytes.
    fn parse_body(&self, body: &Bytes) -> Result<ChatRequest, DialectError>;

    /// Like [`Dialect::parse_body`], for a body held elsewhere (copied once).
    fn parse(&self, body: &[u8]) -> Result<ChatRequest, DialectError> {
        self.parse_body(&Bytes::copy_from_slice(body))
    }

    /// Checks the API's tool pairing rules over `messages` (no pinned ones).
    fn check_pairs(&self, messages: &[Message]) -> Result<(), DialectError>;

    /// True when `messages[at]` may open the verbatim part after a handoff.
    fn may_cut_at(&self, _request: &ChatRequest, _messages: &[Message], _at: usize) -> bool {
        true
    }

    /// The user continuation message of a handoff pair.
    fn continuation(&self) -> Value;

    /// The assistant handoff message; `reasoning_marker` only where the API allows one.
    fn handoff(&self, text: &str, reasoning_marker: bool) -> Value;

    /// The pair as one message, when it may not stand as two before `next` (roles must
    /// alternate); `None` when the two messages go as they are.
    fn joined_pair(
        &self,
        _continuation: &Value,
        _handoff: &Value,
        _next: &Message,
    ) -> Option<Value> {
        None
    }

    /// The top-level field a leading pinned message stands for (`system`,
    /// `instructions`), if the dialect has one.
    fn top_level_field(&self) -> Option<&'static str> {
        None
    }

    /// The body field that holds the message list (`messages`, `input`).
    fn list_field(&self) -> &'static str {
        "messages"
    }

    /// handoff's own error, in the API's error shape.
    fn error_json(&self, err: &ApiError) -> Value;

    /// True when an error body says the input exceeded the model's window.
    fn is_overflow(&self, body: &Value) -> bool;

    /// What one event at the opening of a stream says: an error event is an overflow
    /// or not; a preamble event (Anthropic's `message_start`, `ping`) needs more;
    /// anything else is output.
    fn opening_event(&self, event: &Value) -> Opening {
        let is_error = event.get("error").is_some_and(|e| !e.is_null())
            || event.get("type").and_then(Value::as_str) == Some("error");
        if is_error {
            if self.is_overflow(event) {
                Opening::Overflow
            } else {
                Opening::Relay
            }
        } else {
            Opening::Relay
        }
    }

    /// True when a successful, non-streamed reply stopped because the window was full.
    fn reply_overflowed(&self, _reply: &Value) -> bool {
        false
    }

    /// The replies of a non-streamed response, each message exactly as sent, and usage.
    fn replies_from_json(&self, body: &[u8]) -> Result<Assembled, serde_json::Error>;

    /// A fresh assembler for a streamed response.
    fn stream_reply(&self) -> Box<dyn StreamReply>;

    /// The line that ends a streamed response.
    fn stream_end(&self) -> StreamEnd;

    /// `body` asking for the usage its stream would omit, and what takes it out of the
    /// client's stream again; `None` where a stream always carries usage.
    fn ask_usage(&self, body: &[u8]) -> Option<(Bytes, Box<dyn crate::rewrite::Rewrite>)> {
        let _ = body;
        None
    }

    /// The input tokens the upstream counted, from its `usage`.
    fn input_tokens(&self, usage: &Value) -> Option<u64>;

    /// A message in the neutral form strategies read (OpenAI chat shape); one wire
    /// message may become several (Anthropic tool results become `tool` messages).
    fn neutral(&self, message: &Value) -> Vec<Value>;

    /// The summary client: `raw` posts JSON to the request's path with the client's
    /// headers; strategies always speak chat completions to what this returns.
    fn summary_client(&self, raw: Arc<dyn ModelClient>) -> Arc<dyn ModelClient>;
}

impl ApiError {
    /// The error as a complete HTTP response, in `dialect`'s error shape.
    pub fn into_response_for(self, dialect: DialectKind) -> http::Response<crate::body::ProxyBody> {
        let body = dialect.get().error_json(&self);
        self.into_response_with(&body)
    }
}
