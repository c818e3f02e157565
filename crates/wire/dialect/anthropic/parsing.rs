//! AnthropicMessages: reading a request: the body parsed and checked, its tool pairs and cuts, the text of its messages, and a request body written back.

use super::*;
use crate::dialect::Parsing;

impl Parsing for AnthropicMessages {
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
            crate::dialect::asked(wire.context_management, wire.compaction);
        let provider_compacts = asks_compaction(context_management.as_ref(), compaction.as_ref());
        Ok(ChatRequest {
            provider_compacts,
            asked,
            compacted_history: reading.compacted_history(),
            tools: reading.member_bytes("tools", wire.tools),
            tools_digest: reading.member_digest("tools"),
            stream: wire.stream.unwrap_or(false),
            max_output: wire.max_tokens,
            thinking,
            top_level,
            list: reading.list_span(),
            ..ChatRequest::new(
                DialectKind::Anthropic,
                wire.model.unwrap_or_default(),
                messages,
            )
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

    fn room_for_cache_mark(&self, raw: &mut dyn Iterator<Item = &str>) -> bool {
        cache::room_for_one(raw.map(cache::marks_in).sum())
    }

    fn with_cache_mark(&self, message: &Value) -> Option<Value> {
        cache::marked(message)
    }
}
