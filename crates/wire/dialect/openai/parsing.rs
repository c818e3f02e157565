//! OpenAiChat: reading a request: the body parsed and checked, its tool pairs and cuts, the text of its messages, and a request body written back.

use super::*;
use crate::dialect::Parsing;

impl Parsing for OpenAiChat {
    fn markers(&self) -> Markers {
        content::MARKERS
    }

    fn carries_reasoning(&self, message: &Value) -> bool {
        content::carries_reasoning(message)
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
        content::push_part(part, push)
    }

    fn parse_body(&self, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let reading = Reading::new(body, DialectKind::OpenAiChat);
        let wire: Wire<'_> = reading
            .json(&["tools"])
            .map_err(|err| DialectError::json(API, err))?;
        let messages = reading.messages(&wire.messages, |index, raw| {
            Message::from_raw(index, raw, DialectKind::OpenAiChat)
        })?;
        Ok(ChatRequest {
            tools: reading.member_bytes("tools", wire.tools),
            tools_digest: reading.member_digest("tools"),
            stream: wire.stream.unwrap_or(false),
            usage_unasked: wire.stream == Some(true) && wire.stream_options.is_none(),
            max_output: wire.max_completion_tokens.or(wire.max_tokens),
            list: reading.list_span(),
            ..ChatRequest::new(
                DialectKind::OpenAiChat,
                wire.model.unwrap_or_default(),
                messages,
            )
        })
    }

    fn check_pairs(&self, messages: &[Message]) -> Result<(), DialectError> {
        check_tool_pairs(messages)
    }
}
