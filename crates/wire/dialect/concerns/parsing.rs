//! A wire format's reading a request: the body parsed and checked, its tool pairs and cuts, the text of its messages, and a request body written back.

use crate::base::chunks::Chunks;
use crate::dialect::ChatRequest;
use crate::dialect::DialectError;
use crate::dialect::Markers;
use crate::dialect::Message;
use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;

/// One wire format's reading a request.
pub trait Parsing: Send + Sync {
    /// What raw-JSON scans look for in this format's messages.
    fn markers(&self) -> Markers;

    /// Parses and checks a request body; the error says where it went wrong. The
    /// messages share `body`'s bytes.
    fn parse_body(&self, body: &Chunks) -> Result<ChatRequest, DialectError>;

    /// Parses a body posted to `target` (path and query): where the API names the model
    /// or the streaming in the path (Gemini), they are read from there.
    fn parse_at(&self, target: &str, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let _ = target;
        self.parse_body(body)
    }

    /// Like [`crate::dialect::Parsing::parse_body`], for a body held elsewhere (copied once).
    fn parse(&self, body: &[u8]) -> Result<ChatRequest, DialectError> {
        self.parse_body(&Chunks::from(Bytes::copy_from_slice(body)))
    }

    /// Checks the API's tool pairing rules over `messages` (no pinned ones).
    fn check_pairs(&self, messages: &[Message]) -> Result<(), DialectError>;

    /// True when `messages[at]` may open the verbatim part after a handoff.
    fn may_cut_at(&self, _request: &ChatRequest, _messages: &[Message], _at: usize) -> bool {
        true
    }

    /// Where the client marks the API's prompt cache (Anthropic's `cache_control`): true
    /// when a view whose other messages and tools (`raw`, as JSON text) carry the
    /// client's marks leaves room for one of handoff's. False where the API caches
    /// without marks, or when the client places none or all it may.
    fn room_for_cache_mark(&self, _raw: &mut dyn Iterator<Item = &str>) -> bool {
        false
    }

    /// `message` with a prompt-cache breakpoint after it; `None` where the API has no
    /// marks, or the message no content to mark.
    fn with_cache_mark(&self, _message: &Value) -> Option<Value> {
        None
    }

    /// True when an assistant message carries reasoning that the upstream wants on
    /// every assistant message, the handoff's included (DeepSeek's `reasoning_content`).
    fn carries_reasoning(&self, _message: &Value) -> bool {
        false
    }

    /// Shortens each tool-result text in `message` with `shorten` (which takes a string
    /// or a list of text parts); true when anything changed.
    fn shorten_tool_results(
        &self,
        message: &mut Value,
        shorten: &mut dyn FnMut(&mut Value) -> bool,
    ) -> bool;

    /// True when `message` calls tools, so the conversation waits for their results.
    fn calls_tools(&self, message: &Value) -> bool;

    /// Pushes the text the model reads in `message`'s fields that are this format's
    /// own (beyond `role`, `name` and `content`; see [`crate::dialect::text::message_text`]).
    fn push_text(&self, message: &Value, push: &mut dyn FnMut(&str));

    /// Pushes the text of one content part or block of this format's own kinds; false
    /// when the kind is not this format's.
    fn push_part(&self, _part: &Value, _push: &mut dyn FnMut(&str)) -> bool {
        false
    }

    /// A request body of this dialect for `messages`, with `top_level` (a pinned
    /// message standing for the top-level field) when there is one: what `handoff
    /// eval` replays a logged request as.
    fn request_body(
        &self,
        model: &str,
        top_level: Option<&Value>,
        messages: &[&RawValue],
    ) -> Vec<u8> {
        let mut body = format!(
            "{{\"model\":{},\"{}\":[",
            Value::String(model.to_owned()),
            self.list_field()
        );
        for (index, message) in messages.iter().enumerate() {
            if index > 0 {
                body.push(',');
            }
            body.push_str(message.get());
        }
        body.push(']');
        if let (Some(field), Some(pinned)) = (self.top_level_field(), top_level) {
            body.push_str(&format!(",\"{field}\":{}", pinned["content"]));
        }
        body.push('}');
        body.into_bytes()
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

    /// True when the top-level member `name` is one whose text the neutral messages
    /// carry (the list, the system prompt), under any spelling the API accepts.
    fn in_messages(&self, name: &str) -> bool {
        name == self.list_field() || Some(name) == self.top_level_field()
    }
}
