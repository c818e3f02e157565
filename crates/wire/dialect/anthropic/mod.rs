//! Anthropic's Messages API (`POST /v1/messages`).
//!
//! Every content block is kept exactly as sent, kinds handoff does not know included.
//! The top-level `system` is pinned: it is tracked as one system message
//! `{"role":"system","content":<system as sent>}` and never leaves the body's own
//! `system` field. An assistant `tool_use` turn and the next user message's
//! `tool_result` blocks form one unit. Roles must alternate, so when the recent part
//! opens with an assistant turn the handoff pair travels as one user message.

mod assemble;
mod cache;
mod content;
mod neutral;
mod summary;

use std::sync::Arc;

use handoff_plugin_api::ModelClient;
use http::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::translate::TranslatingClient;
use super::Reading;
use super::{
    ChatRequest, Dialect, DialectError, DialectKind, KeyHeader, Markers, Message, Opening, Role,
    StreamEnd, StreamReply,
};
use crate::base::chunks::Chunks;
use crate::base::reply::Assembled;
use crate::dialect::pair::CONTINUATION;
use crate::error::ApiError;

const API: &str = "Messages API";

/// The continuation when the handoff shares its user message: the text block after
/// this one is the handoff.
pub(crate) const CONTINUATION_JOINED: &str = "Continue from the compacted state. The earlier part of this conversation was compacted by handoff: the text that follows in this message is its handoff and the source of prior context, and the messages after this one are the most recent ones, verbatim.";

/// Anthropic Messages.
pub struct AnthropicMessages;

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(borrow)]
    messages: Vec<&'a RawValue>,
    #[serde(default)]
    system: Option<Box<RawValue>>,
    #[serde(default)]
    tools: Option<Box<RawValue>>,
    #[serde(default)]
    stream: Option<bool>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    thinking: Option<Value>,
    #[serde(default)]
    context_management: Option<Box<RawValue>>,
    #[serde(default)]
    compaction: Option<Box<RawValue>>,
}

/// True when the request asks the API to compact: a `compact_*` edit in
/// `context_management.edits` (`compact_20260112`), or an on-demand `compaction`.
fn asks_compaction(context_management: Option<&Value>, compaction: Option<&Value>) -> bool {
    let edits = context_management
        .and_then(|c| c.get("edits"))
        .and_then(Value::as_array);
    let compacting = |edit: &Value| {
        (edit.get("type").and_then(Value::as_str)).is_some_and(|t| t.starts_with("compact_"))
    };
    edits.is_some_and(|edits| edits.iter().any(compacting))
        || compaction.is_some_and(|c| !c.is_null())
}

fn block_type(block: &Value) -> &str {
    block.get("type").and_then(Value::as_str).unwrap_or("")
}

/// The pinned message standing for a top-level `system` (`digest` as
/// [`Reading::member_digest`] gives it): its bytes kept inside.
fn system_message(text: &[u8], digest: Option<u128>) -> Result<Option<Message>, DialectError> {
    let empty = matches!(text, b"null" | b"\"\"")
        || text
            .strip_prefix(b"[")
            .and_then(|list| list.strip_suffix(b"]"))
            .is_some_and(|inside| inside.trim_ascii().is_empty());
    if empty {
        return Ok(None);
    }
    super::pinned::system_message(text, digest, DialectKind::Anthropic).map(Some)
}

impl Dialect for AnthropicMessages {
    fn kind(&self) -> DialectKind {
        DialectKind::Anthropic
    }

    fn path(&self) -> &'static str {
        "/v1/messages"
    }

    fn objects(&self) -> super::objects::Objects {
        super::objects::Objects {
            // A custom skill is named by `skill_id` (in a request's `container`) and by
            // its path; a code-execution container by `container` (its id, or an object
            // with its `id`), and is the tenant's whose reply ran in it.
            id_fields: &["file_id", "skill_id", "container"],
            id_prefixes: &["file_", "msgbatch_", "skill_", "container_"],
            listings: &["/v1/messages/batches", "/v1/files", "/v1/skills"],
        }
    }

    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn api(&self) -> &'static str {
        API
    }

    fn tracks(&self, path: &str) -> bool {
        path.ends_with("/v1/messages")
    }

    fn answers_path(&self, path: &str) -> bool {
        path.ends_with("/v1/messages") || path.contains("/v1/messages/")
    }

    fn key_header(&self) -> KeyHeader {
        KeyHeader::Named("x-api-key")
    }

    fn api_headers(&self) -> &'static [&'static str] {
        &["anthropic-version"]
    }

    fn key_env(&self) -> &'static str {
        "ANTHROPIC_API_KEY"
    }

    fn required_headers(&self) -> &'static [(&'static str, &'static str)] {
        &[("anthropic-version", "2023-06-01")]
    }

    fn markers(&self) -> Markers {
        content::MARKERS
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

    fn push_text(&self, _message: &Value, _push: &mut dyn FnMut(&str)) {}

    fn push_part(&self, part: &Value, push: &mut dyn FnMut(&str)) -> bool {
        content::push_part(part, push)
    }

    fn parse_body(&self, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let reading = Reading::new(body, DialectKind::Anthropic);
        let wire: Wire<'_> = reading
            .json(&["system", "tools"])
            .map_err(|err| DialectError::json(API, err))?;
        let conversation = reading.messages(&wire.messages, |index, raw| {
            Message::from_raw(index, raw, DialectKind::Anthropic)
        })?;
        let mut messages = Vec::with_capacity(conversation.len() + 1);
        if let Some(system) = reading.member("system", wire.system) {
            messages.extend(system_message(&system, reading.member_digest("system"))?);
        }
        let top_level = messages.len();
        messages.extend(conversation);
        let thinking = wire
            .thinking
            .as_ref()
            .and_then(|t| t.get("type"))
            .and_then(Value::as_str)
            .is_some_and(|kind| kind != "disabled");
        let (asked, context_management, compaction) =
            super::asked(wire.context_management, wire.compaction);
        let provider_compacts = asks_compaction(context_management.as_ref(), compaction.as_ref());
        Ok(ChatRequest {
            provider_compacts,
            asked,
            compacted_history: reading.compacted_history(),
            expanded: None,
            dialect: DialectKind::Anthropic,
            model: wire.model.unwrap_or_default(),
            messages,
            tools: reading.member_bytes("tools", wire.tools),
            tools_digest: reading.member_digest("tools"),
            stream: wire.stream.unwrap_or(false),
            max_output: wire.max_tokens,
            thinking,
            top_level,
            server_held: false,
            continues: None,
            usage_unasked: false,
            continues_conversation: false,
            pinned: None,
            floated: Vec::new(),
            list: reading.list_span(),
        })
    }

    /// Each `tool_use` is answered by a `tool_result` block at the start of the very
    /// next user message, and every `tool_result` answers one.
    fn check_pairs(&self, messages: &[Message]) -> Result<(), DialectError> {
        let mut pending: Vec<&str> = Vec::new();
        let mut pending_from = 0;
        for (index, message) in messages.iter().enumerate() {
            match message.role {
                Role::User => {
                    if !message.tool_results_lead() {
                        return Err(DialectError::Shape {
                            index,
                            rule: "tool_result blocks must come before any other content".into(),
                        });
                    }
                    for id in message.answered_ids() {
                        let Some(at) = pending.iter().position(|p| *p == id) else {
                            return Err(DialectError::OrphanToolResult {
                                index,
                                id: id.to_owned(),
                            });
                        };
                        pending.swap_remove(at);
                    }
                }
                Role::Assistant => {}
                _ => continue,
            }
            if !pending.is_empty() {
                return Err(DialectError::UnansweredToolCalls {
                    index: pending_from,
                    ids: pending.iter().map(|s| (*s).to_owned()).collect(),
                });
            }
            if message.role == Role::Assistant {
                pending = message.tool_call_ids().collect();
                pending_from = index;
            }
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(DialectError::UnansweredToolCalls {
                index: pending_from,
                ids: pending.iter().map(|s| (*s).to_owned()).collect(),
            })
        }
    }

    /// Every unit boundary is an allowed cut, thinking or not. What the Messages API
    /// requires of thinking: the blocks of the current tool-use cycle (the assistant
    /// turns after the last user message that is not only tool results) come back
    /// unmodified, signatures included; thinking from earlier cycles may be dropped
    /// (the API strips it); with `enabled` thinking the final assistant turn opens with
    /// its thinking. A handoff view puts a user text message (the pair, or the joined
    /// pair) right before the recent part, so the cycle the model sees starts there,
    /// and the recent part is sent verbatim: every thinking block of that cycle, and
    /// the final assistant turn, are the client's own bytes.
    fn may_cut_at(&self, _request: &ChatRequest, _messages: &[Message], _at: usize) -> bool {
        true
    }

    fn top_level_field(&self) -> Option<&'static str> {
        Some("system")
    }

    fn continuation(&self) -> Value {
        json!({"role": "user", "content": [{"type": "text", "text": CONTINUATION}]})
    }

    fn handoff(&self, text: &str, _reasoning_marker: bool) -> Value {
        json!({"role": "assistant", "content": [{"type": "text", "text": text}]})
    }

    fn room_for_cache_mark(&self, raw: &mut dyn Iterator<Item = &str>) -> bool {
        cache::room_for_one(raw.map(cache::marks_in).sum())
    }

    fn with_cache_mark(&self, message: &Value) -> Option<Value> {
        cache::marked(message)
    }

    fn joined_pair(&self, _continuation: &Value, handoff: &Value, next: &Message) -> Option<Value> {
        if next.role != Role::Assistant {
            return None;
        }
        let mut content = vec![json!({"type": "text", "text": CONTINUATION_JOINED})];
        match handoff.get("content") {
            Some(Value::String(text)) => content.push(json!({"type": "text", "text": text})),
            Some(Value::Array(blocks)) => content.extend(blocks.iter().cloned()),
            _ => {}
        }
        Some(json!({"role": "user", "content": content}))
    }

    fn error_json(&self, err: &ApiError) -> Value {
        let kind = match err.status {
            StatusCode::UNAUTHORIZED => "authentication_error",
            StatusCode::FORBIDDEN => "permission_error",
            StatusCode::NOT_FOUND => "not_found_error",
            StatusCode::PAYLOAD_TOO_LARGE => "request_too_large",
            StatusCode::TOO_MANY_REQUESTS => "rate_limit_error",
            StatusCode::SERVICE_UNAVAILABLE => "overloaded_error",
            status if status.is_client_error() => "invalid_request_error",
            _ => "api_error",
        };
        let message = match err.code {
            Some(code) => format!("{} ({code})", err.message),
            None => err.message.clone(),
        };
        json!({"type": "error", "error": {"type": kind, "message": message}})
    }

    fn is_overflow(&self, body: &Value) -> bool {
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("");
        message.contains("prompt is too long")
            || message.contains("exceed context limit")
            || crate::dialect::overflow::is_context_length_error(body)
    }

    fn opening_event(&self, event: &Value) -> Opening {
        match event.get("type").and_then(Value::as_str) {
            Some("message_start" | "ping") => Opening::NeedMore,
            Some("error") if self.is_overflow(event) => Opening::Overflow,
            _ => Opening::Relay,
        }
    }

    fn reply_overflowed(&self, reply: &[u8]) -> bool {
        #[derive(serde::Deserialize)]
        struct Stopped {
            stop_reason: Option<String>,
        }
        const STOP: &str = "model_context_window_exceeded";
        // Nearly every reply lacks the word: its bytes are searched before any parse.
        memchr::memmem::find(reply, STOP.as_bytes()).is_some()
            && crate::dialect::json_body::<Stopped>(reply)
                .is_ok_and(|r| r.stop_reason.as_deref() == Some(STOP))
    }

    fn replies_from_json(&self, body: &[u8]) -> Result<Assembled, serde_json::Error> {
        assemble::replies_from_json(body)
    }

    fn stream_reply(&self) -> Box<dyn StreamReply> {
        Box::<assemble::MessageAssembler>::default()
    }

    fn stream_end(&self) -> StreamEnd {
        StreamEnd {
            field: b"event:",
            values: &[b"message_stop"],
            containing: b"",
        }
    }

    /// Cached input counts too: the window holds all of it.
    fn reply_deltas(&self, event: &Value) -> Vec<super::ReplyDelta> {
        if event["type"] != "content_block_delta" {
            return Vec::new();
        }
        let channel = format!("block {}", event["index"]);
        match event["delta"]["type"].as_str() {
            Some("text_delta") => vec![super::ReplyDelta::new(channel, "/delta/text", false)],
            Some("input_json_delta") => {
                vec![super::ReplyDelta::new(channel, "/delta/partial_json", true)]
            }
            _ => Vec::new(),
        }
    }

    fn input_tokens(&self, usage: &Value) -> Option<u64> {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        let input = field("input_tokens")?;
        Some(
            input
                + field("cache_read_input_tokens").unwrap_or(0)
                + field("cache_creation_input_tokens").unwrap_or(0),
        )
    }

    fn billed(&self, usage: &Value) -> Option<crate::config::Billed> {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        Some(crate::config::Billed {
            input: field("input_tokens")?,
            cache_read: field("cache_read_input_tokens").unwrap_or(0),
            cache_write: field("cache_creation_input_tokens").unwrap_or(0),
            output: field("output_tokens").unwrap_or(0),
        })
    }

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

    fn continued_call(&self) -> Option<crate::dialect::ContinuedCall> {
        Some(crate::dialect::ContinuedCall {
            append: summary::append_user_text,
            settle: summary::settle_continued,
            reply: summary::to_completion,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: Value) -> Result<ChatRequest, DialectError> {
        AnthropicMessages.parse(body.to_string().as_bytes())
    }

    #[test]
    fn a_compact_edit_or_an_on_demand_compaction_asks_the_provider_to_compact() {
        let asks = |extra: Value| {
            let mut body = json!({"model": "claude", "max_tokens": 10,
                                  "messages": [{"role": "user", "content": "hi"}]});
            body.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            parse(body).unwrap().provider_compacts
        };
        assert!(asks(
            json!({"context_management": {"edits": [{"type": "compact_20260112"}]}})
        ));
        assert!(asks(
            json!({"compaction": {"instructions": "keep the plan"}})
        ));
        assert!(!asks(
            json!({"context_management": {"edits": [{"type": "clear_tool_uses_20250919"}, {"type": "clear_thinking_20251015"}]}})
        ));
        assert!(!asks(json!({"compaction": null})));
        assert!(!asks(json!({})));
        // A compaction block in the history is the provider's artefact.
        let history = parse(json!({"model": "claude", "max_tokens": 10, "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": [{"type": "compaction", "content": "s", "encrypted_content": "e"}]},
            {"role": "user", "content": "go on"}]}))
        .unwrap();
        assert!(history.messages[1].is_provider_compaction());
        assert!(!history.messages[0].is_provider_compaction());
    }

    #[test]
    fn only_a_reply_stopped_by_the_window_overflowed() {
        let overflowed =
            |reply: Value| AnthropicMessages.reply_overflowed(reply.to_string().as_bytes());
        assert!(overflowed(
            json!({"type": "message", "content": [{"type": "text", "text": "par"}],
            "stop_reason": "model_context_window_exceeded", "usage": {"input_tokens": 9}})
        ));
        assert!(!overflowed(
            json!({"type": "message", "stop_reason": "end_turn"})
        ));
        assert!(!overflowed(json!({"type": "message", "stop_reason": null})));
        // The word in the text is not the stop reason.
        assert!(!overflowed(
            json!({"type": "message", "content": [{"type": "text", "text": "model_context_window_exceeded"}],
            "stop_reason": "end_turn"})
        ));
        assert!(!AnthropicMessages.reply_overflowed(b"not json"));
    }

    #[test]
    fn system_is_pinned_and_blocks_are_kept() {
        let request = parse(json!({"model": "claude", "max_tokens": 10, "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi", "x_new": 1}]}]})).unwrap();
        assert_eq!(request.messages.len(), 2);
        assert_eq!(request.messages[0].role, Role::System);
        assert!(request.messages[0].raw.get().contains("cache_control"));
        assert!(request.messages[1].raw.get().contains("x_new"));
        assert_eq!(request.max_output, Some(10));
    }

    #[test]
    fn tool_pairs_follow_the_messages_rules_but_parsing_never_checks_them() {
        let pairs = |body: Value| {
            let request = parse(body).unwrap();
            AnthropicMessages.check_pairs(&request.messages)
        };
        let ok = json!({"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "r"}, {"type": "text", "text": "more"}]}]});
        pairs(ok).unwrap();
        let orphan = json!({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t9", "content": "r"}]}]});
        assert!(matches!(
            pairs(orphan),
            Err(DialectError::OrphanToolResult { .. })
        ));
        let late = json!({"messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "tool_result", "tool_use_id": "t1", "content": "r"}]}]});
        assert!(matches!(pairs(late), Err(DialectError::Shape { .. })));
    }

    #[test]
    fn roles_it_does_not_expect_pass_through() {
        // Claude Code sends its environment as a system message inside `messages`.
        let request = parse(json!({"messages": [
            {"role": "user", "content": "q"},
            {"role": "system", "content": [{"type": "text", "text": "env"}]},
            {"role": "critic", "content": "a role from the future"}]}))
        .unwrap();
        let roles: Vec<Role> = request.messages.iter().map(|m| m.role).collect();
        assert_eq!(roles, [Role::User, Role::System, Role::Other]);
        assert!(matches!(
            parse(json!({"messages": [{"content": "no role"}]})),
            Err(DialectError::MissingRole { index: 0 })
        ));
    }

    #[test]
    fn an_error_event_before_any_output_is_an_overflow() {
        use crate::dialect::{stream_opening, Opening};
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\nevent: ping\ndata: {\"type\":\"ping\"}\n\n";
        assert_eq!(
            stream_opening(&AnthropicMessages, start.as_bytes()),
            Opening::NeedMore
        );
        let overflow = format!("{start}event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long: 9 tokens > 5 maximum\"}}}}\n\n");
        assert_eq!(
            stream_opening(&AnthropicMessages, overflow.as_bytes()),
            Opening::Overflow
        );
        let output = format!("{start}event: content_block_start\ndata: {{\"type\":\"content_block_start\",\"index\":0}}\n\n");
        assert_eq!(
            stream_opening(&AnthropicMessages, output.as_bytes()),
            Opening::Relay
        );
        let busy = format!("{start}event: error\ndata: {{\"type\":\"error\",\"error\":{{\"type\":\"overloaded_error\",\"message\":\"Overloaded\"}}}}\n\n");
        assert_eq!(
            stream_opening(&AnthropicMessages, busy.as_bytes()),
            Opening::Relay
        );
    }

    #[test]
    fn with_thinking_any_unit_start_may_open_the_recent_part() {
        let tool = |id: &str, thinking: bool| {
            let mut content = vec![json!({"type": "tool_use", "id": id, "name": "f", "input": {}})];
            if thinking {
                content.insert(
                    0,
                    json!({"type": "thinking", "thinking": "t", "signature": "s"}),
                );
            }
            json!({"role": "assistant", "content": content})
        };
        let result = |id: &str| json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": id, "content": "r"}]});
        let messages = json!([
            {"role": "user", "content": "first task"},
            tool("a", true), result("a"),
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "second task"},
            tool("b", true), result("b"),
            tool("c", false), result("c"),
        ]);
        let body = |thinking: bool| {
            let mut body = json!({"model": "claude", "max_tokens": 10, "messages": messages});
            if thinking {
                body["thinking"] = json!({"type": "enabled", "budget_tokens": 1024});
            }
            parse(body).unwrap()
        };
        // A loop with thinking on some turns only (adaptive) or on all: every unit start
        // may open the recent part, as the pair before it starts a new cycle.
        let on = body(true);
        for at in [1, 3, 4, 5, 7] {
            assert!(AnthropicMessages.may_cut_at(&on, &on.messages, at), "{at}");
        }
        let off = body(false);
        assert!(AnthropicMessages.may_cut_at(&off, &off.messages, 7));
    }

    #[test]
    fn usage_counts_cached_input() {
        let usage = json!({"input_tokens": 10, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 5, "output_tokens": 3});
        assert_eq!(AnthropicMessages.input_tokens(&usage), Some(115));
    }
}
