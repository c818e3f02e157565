//! OpenAiResponses: reading a request: the body parsed and checked, its tool pairs and cuts, the text of its messages, and a request body written back.

use super::*;
use crate::dialect::Parsing;

impl Parsing for OpenAiResponses {
    /// A body posted to the compaction endpoint asks the provider to compact its
    /// input: logged as such, and never compacted by handoff while it fits.
    fn parse_at(&self, target: &str, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let mut request = self.parse_body(body)?;
        let path = target.split('?').next().unwrap_or(target);
        if path.ends_with(COMPACT_PATH) {
            request.provider_compacts = true;
            // The endpoint answers with JSON only.
            request.stream = false;
            request.asked.get_or_insert_with(Box::default).path = Some(path.to_owned());
        }
        Ok(request)
    }

    fn markers(&self) -> Markers {
        content::MARKERS
    }

    fn shorten_tool_results(
        &self,
        item: &mut Value,
        shorten: &mut dyn FnMut(&mut Value) -> bool,
    ) -> bool {
        content::shorten_tool_results(item, shorten)
    }

    fn calls_tools(&self, item: &Value) -> bool {
        content::calls_tools(item)
    }

    fn push_text(&self, item: &Value, push: &mut dyn FnMut(&str)) {
        content::push_text(item, push);
    }

    fn push_part(&self, part: &Value, push: &mut dyn FnMut(&str)) -> bool {
        content::push_part(part, push)
    }

    fn parse_body(&self, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let reading = Reading::new(body, DialectKind::Responses);
        let wire: Wire<'_> = reading
            .json(&["instructions", "tools"])
            .map_err(|err| DialectError::json(API, err))?;
        let server_held = wire.previous_response_id.is_some()
            || wire.conversation.as_ref().is_some_and(|c| !c.is_null());
        let input = items(&reading, wire.input.as_ref())?;
        let mut messages = Vec::with_capacity(input.len() + 1);
        if let Some(instructions) = reading.member("instructions", wire.instructions) {
            if !matches!(&*instructions, b"null" | b"\"\"") {
                let digest = reading.member_digest("instructions");
                messages.push(crate::dialect::pinned::system_message(
                    &instructions,
                    digest,
                    DialectKind::Responses,
                )?);
            }
        }
        let top_level = messages.len();
        messages.extend(input);
        let (asked, context_management, _) = crate::dialect::asked(wire.context_management, None);
        let provider_compacts = asks_compaction(context_management.as_ref())
            || messages.last().is_some_and(Message::is_compaction_trigger);
        Ok(ChatRequest {
            list: reading.list_span(),
            tools: reading.member_bytes("tools", wire.tools),
            tools_digest: reading.member_digest("tools"),
            stream: wire.stream.unwrap_or(false),
            max_output: wire.max_output_tokens,
            top_level,
            provider_compacts,
            asked,
            compacted_history: reading.compacted_history(),
            server_held,
            continues_conversation: wire.previous_response_id.is_none()
                && wire.conversation.as_ref().is_some_and(|c| !c.is_null()),
            continues: wire.previous_response_id.or_else(|| {
                let conversation = wire.conversation?;
                let id = conversation.get("id").unwrap_or(&conversation);
                id.as_str().map(str::to_owned)
            }),
            ..ChatRequest::new(
                DialectKind::Responses,
                wire.model.unwrap_or_default(),
                messages,
            )
        })
    }

    /// Every output answers a call sent before it, every call gets its output, and a
    /// `reasoning` item is never last: the API refuses each.
    fn check_pairs(&self, messages: &[Message]) -> Result<(), DialectError> {
        let mut calls: Vec<(usize, &str)> = Vec::new();
        let mut answered: HashSet<&str> = HashSet::new();
        for (index, message) in messages.iter().enumerate() {
            for id in message.answered_ids() {
                if !calls.iter().any(|(_, call)| *call == id) {
                    return Err(DialectError::OrphanToolResult {
                        index,
                        id: id.to_owned(),
                    });
                }
                answered.insert(id);
            }
            calls.extend(message.tool_call_ids().map(|id| (index, id)));
        }
        if let Some((index, _)) = calls.iter().find(|(_, id)| !answered.contains(id)) {
            return Err(DialectError::UnansweredToolCalls {
                index: *index,
                ids: calls
                    .iter()
                    .filter(|(_, id)| !answered.contains(id))
                    .map(|(_, id)| (*id).to_owned())
                    .collect(),
            });
        }
        if let Some(last) = messages.last().filter(|m| m.glues_to_next()) {
            return Err(DialectError::Shape {
                index: messages.len() - 1,
                rule: format!(
                    "item {} of type 'reasoning' was provided without its required following item",
                    last.value().get("id").unwrap_or(&Value::Null)
                ),
            });
        }
        Ok(())
    }

    fn top_level_field(&self) -> Option<&'static str> {
        Some("instructions")
    }

    fn list_field(&self) -> &'static str {
        "input"
    }
}
