//! Units: a user message, or an assistant message with every tool result that answers
//! its calls (tool messages, or the next user message's `tool_result` blocks). A cut inside a unit would send a tool result without its call, or a call
//! without its result, and providers answer that with a 400.

use std::collections::HashSet;

use crate::dialect::{Message, Role};

/// A unit as a half-open range of message indices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnitSpan {
    /// First message.
    pub start: usize,
    /// One past the last message.
    pub end: usize,
}

/// Splits `messages` into units, in order; every message is in exactly one unit.
pub fn split_into_units(messages: &[Message]) -> Vec<UnitSpan> {
    let mut units = Vec::new();
    let mut index = 0;
    while index < messages.len() {
        let start = index;
        index += 1;
        if messages[start].role == Role::Assistant {
            let calls: HashSet<&str> = messages[start].tool_call_ids().collect();
            // Tool results (OpenAI `tool` messages, an Anthropic user message of
            // `tool_result` blocks) that answer this turn's calls.
            while index < messages.len()
                && messages[index].is_tool_answer()
                && messages[index]
                    .answered_ids()
                    .iter()
                    .all(|id| calls.contains(id))
            {
                index += 1;
            }
        }
        units.push(UnitSpan { start, end: index });
    }
    units
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::ChatRequest;
    use serde_json::json;

    pub(crate) fn messages(values: serde_json::Value) -> Vec<Message> {
        ChatRequest::parse(json!({"messages": values}).to_string().as_bytes())
            .unwrap()
            .messages
    }

    #[test]
    fn an_assistant_and_its_tool_results_form_one_unit() {
        let m = messages(json!([
            {"role": "user", "content": "a"},
            {"role": "assistant", "tool_calls": [
                {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                {"id": "2", "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "1", "content": "x"},
            {"role": "tool", "tool_call_id": "2", "content": "y"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "b"}
        ]));
        let units = split_into_units(&m);
        assert_eq!(
            units,
            vec![
                UnitSpan { start: 0, end: 1 },
                UnitSpan { start: 1, end: 4 },
                UnitSpan { start: 4, end: 5 },
                UnitSpan { start: 5, end: 6 }
            ]
        );
    }

    #[test]
    fn an_anthropic_tool_use_and_the_next_users_results_form_one_unit() {
        use crate::dialect::DialectKind;
        let body = json!({"messages": [
            {"role": "user", "content": "a"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "x"}, {"type": "text", "text": "and?"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
            {"role": "user", "content": "b"}
        ]});
        let m = DialectKind::Anthropic
            .get()
            .parse(body.to_string().as_bytes())
            .unwrap()
            .messages;
        let starts: Vec<usize> = split_into_units(&m).iter().map(|u| u.start).collect();
        assert_eq!(starts, vec![0, 1, 3, 4]);
    }
}
