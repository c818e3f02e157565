//! StubDialect: reading a request: the body parsed and checked, its tool pairs and cuts, the text of its messages, and a request body written back.

use super::*;
use crate::dialect::Parsing;

impl Parsing for StubDialect {
    fn markers(&self) -> Markers {
        Markers {
            paired: &[],
            echoed: &[],
            indexed: &[],
        }
    }

    fn list_field(&self) -> &'static str {
        "turns"
    }

    fn parse_body(&self, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let body = body.contiguous();
        let wire: Wire<'_> = json_body(body).map_err(|err| DialectError::json(API, err))?;
        let messages = wire
            .turns
            .into_iter()
            .enumerate()
            .map(|(index, raw)| {
                Message::from_raw(
                    index,
                    RawMessage::within(body, raw.get()),
                    DialectKind::Stub,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ChatRequest {
            stream: wire.stream.unwrap_or(false),
            ..ChatRequest::new(DialectKind::Stub, wire.model.unwrap_or_default(), messages)
        })
    }

    fn check_pairs(&self, _messages: &[Message]) -> Result<(), DialectError> {
        Ok(())
    }

    fn shorten_tool_results(
        &self,
        _message: &mut Value,
        _shorten: &mut dyn FnMut(&mut Value) -> bool,
    ) -> bool {
        false
    }

    fn calls_tools(&self, _message: &Value) -> bool {
        false
    }

    fn push_text(&self, _message: &Value, _push: &mut dyn FnMut(&str)) {}
}
