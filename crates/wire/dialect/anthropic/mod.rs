//! Anthropic's Messages API (`POST /v1/messages`).
//!
//! Every content block is kept exactly as sent, kinds handoff does not know included.
//! The top-level `system` is pinned: it is tracked as one system message
//! `{"role":"system","content":<system as sent>}` and never leaves the body's own
//! `system` field. An assistant `tool_use` turn and the next user message's
//! `tool_result` blocks form one unit. Roles must alternate, so when the recent part
//! opens with an assistant turn the handoff pair travels as one user message.

mod api;
mod assemble;
mod cache;
mod content;
mod credentials;
mod failures;
mod neutral;
mod pair;
mod parsing;
mod replies;
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
    ChatRequest, DialectError, DialectKind, KeyHeader, Markers, Message, Opening, Role, StreamEnd,
    StreamReply,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::{Failures, Parsing, Replies};

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
