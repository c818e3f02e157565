//! Gemini: reading a request: the body parsed and checked, its tool pairs and cuts, the text of its messages, and a request body written back.

use super::*;
use crate::dialect::Parsing;

impl Parsing for Gemini {
    fn markers(&self) -> Markers {
        content::MARKERS
    }

    fn parse_at(&self, target: &str, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let mut request = self.parse_body(body)?;
        if let Some((model, stream)) = path::generating(target.split('?').next().unwrap_or(target))
        {
            request.model = model.to_owned();
            // Without `alt=sse` the stream is one JSON array, read as a whole reply.
            request.stream = stream && path::asks_sse(target);
        }
        Ok(request)
    }

    fn parse_body(&self, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let reading = Reading::new(body, DialectKind::Gemini);
        let wire: Wire<'_> = reading
            .json(&[
                names::SYSTEM_INSTRUCTION.camel,
                names::SYSTEM_INSTRUCTION.snake,
                "tools",
            ])
            .map_err(|err| DialectError::json(API, err))?;
        let conversation = reading.messages(&wire.contents, |index, raw| {
            Message::read(raw, DialectKind::Gemini, |value| role_of(index, value))
        })?;
        let mut messages = Vec::with_capacity(conversation.len() + 1);
        // Either spelling is the system instruction; both at once mean two, and which
        // one Google keeps is not handoff's to guess.
        let camel = reading.member(names::SYSTEM_INSTRUCTION.camel, wire.system);
        let snake = reading.member(names::SYSTEM_INSTRUCTION.snake, wire.system_snake);
        let (key, system) = match (camel, snake) {
            (Some(_), Some(_)) => {
                return Err(DialectError::json(
                    API,
                    serde::de::Error::custom(
                        "systemInstruction and system_instruction are one field, given twice",
                    ),
                ))
            }
            (None, Some(snake)) => (names::SYSTEM_INSTRUCTION.snake, Some(snake)),
            (camel, None) => (names::SYSTEM_INSTRUCTION.camel, camel),
        };
        if let Some(system) = system {
            if !matches!(&*system, b"null" | b"{}") {
                messages.push(crate::dialect::pinned::system_message(
                    &system,
                    reading.member_digest(key),
                    DialectKind::Gemini,
                )?);
            }
        }
        let top_level = messages.len();
        messages.extend(conversation);
        let thinking = wire
            .config
            .as_ref()
            .and_then(|c| c.thinking.as_ref())
            .is_some_and(|t| {
                names::get(t, names::THINKING_BUDGET).and_then(Value::as_i64) != Some(0)
            });
        Ok(ChatRequest {
            tools: reading.member_bytes("tools", wire.tools),
            tools_digest: reading.member_digest("tools"),
            max_output: wire.config.as_ref().and_then(|c| c.max_output),
            thinking,
            top_level,
            list: reading.list_span(),
            ..ChatRequest::new(
                DialectKind::Gemini,
                wire.model.unwrap_or_default(),
                messages,
            )
        })
    }

    /// A `model` content's function calls are answered by the very next content, a
    /// `user` one, with one `functionResponse` per call: by `id` when the call has one
    /// and the response too, else by name, in order. Every response answers a call.
    fn check_pairs(&self, messages: &[Message]) -> Result<(), DialectError> {
        let mut pending: Vec<(Option<&str>, &str)> = Vec::new();
        let mut pending_from = 0;
        let unanswered =
            |pending: &[(Option<&str>, &str)], index| DialectError::UnansweredToolCalls {
                index,
                ids: pending
                    .iter()
                    .map(|(id, name)| id.unwrap_or(name).to_owned())
                    .collect(),
            };
        for (index, message) in messages.iter().enumerate() {
            if message.role.is_instruction() {
                continue;
            }
            let answers = functions(message.value(), names::FUNCTION_RESPONSE);
            for (id, name) in answers {
                let by_id = id.and_then(|id| pending.iter().position(|(p, _)| *p == Some(id)));
                let Some(at) = by_id.or_else(|| pending.iter().position(|(_, n)| *n == name))
                else {
                    return Err(DialectError::OrphanToolResult {
                        index,
                        id: id.unwrap_or(name).to_owned(),
                    });
                };
                pending.remove(at);
            }
            if !pending.is_empty() {
                return Err(unanswered(&pending, pending_from));
            }
            if message.role == Role::Assistant {
                pending = functions(message.value(), names::FUNCTION_CALL);
                pending_from = index;
            }
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(unanswered(&pending, pending_from))
        }
    }

    fn top_level_field(&self) -> Option<&'static str> {
        Some("systemInstruction")
    }

    fn list_field(&self) -> &'static str {
        "contents"
    }

    fn in_messages(&self, name: &str) -> bool {
        name == self.list_field() || names::is(name, names::SYSTEM_INSTRUCTION)
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
        part.get("type").is_none() && content::push_part(part, push)
    }

    fn request_body(
        &self,
        _model: &str,
        top_level: Option<&Value>,
        messages: &[&RawValue],
    ) -> Vec<u8> {
        let list: Vec<&str> = messages.iter().map(|m| m.get()).collect();
        let mut body = format!("{{\"contents\":[{}]", list.join(","));
        if let Some(pinned) = top_level {
            body.push_str(&format!(",\"systemInstruction\":{}", pinned["content"]));
        }
        body.push('}');
        body.into_bytes()
    }
}
