//! Units: a user message, or an assistant turn with every tool result that answers its
//! calls. A turn is one message (OpenAI, Anthropic) or consecutive items (Responses:
//! `function_call` items, then their outputs), and a `reasoning` item is glued to the
//! item after it. A cut inside a unit would send a result without its call, a call
//! without its result, or reasoning without its item, and providers answer each with
//! a 400.

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
        index = unit_end(messages, start);
        // Reasoning binds to what follows it: the unit takes the next one too.
        while index < messages.len() && messages[index - 1].glues_to_next() {
            index = unit_end(messages, index);
        }
        units.push(UnitSpan { start, end: index });
    }
    units
}

/// One past the last message of the unit starting at `start` (before gluing).
fn unit_end(messages: &[Message], start: usize) -> usize {
    let mut index = start + 1;
    if messages[start].role != Role::Assistant {
        return index;
    }
    let mut calls: HashSet<&str> = messages[start].tool_call_ids().collect();
    let mut answered: HashSet<&str> = HashSet::new();
    while let Some(next) = messages.get(index) {
        let pending = calls.iter().any(|id| !answered.contains(id));
        let answers_this_turn =
            next.is_tool_answer() && next.answered_ids().iter().all(|id| calls.contains(id));
        // More calls of the same turn (Responses sends one item per call, and its
        // reasoning) while earlier calls still wait for their outputs.
        let same_turn = pending && next.role == Role::Assistant && !next.is_text_message();
        if !(answers_this_turn || same_turn) {
            break;
        }
        calls.extend(next.tool_call_ids());
        answered.extend(next.answered_ids());
        index += 1;
    }
    index
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

    #[test]
    fn responses_calls_outputs_and_reasoning_stay_together() {
        use crate::dialect::DialectKind;
        let body = json!({"model": "m", "input": [
            {"role": "user", "content": "a"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "1"},
            {"type": "function_call_output", "call_id": "c2", "output": "2"},
            {"type": "reasoning", "id": "rs_2", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
            {"role": "user", "content": "b"}
        ]});
        let m = DialectKind::Responses
            .get()
            .parse(body.to_string().as_bytes())
            .unwrap()
            .messages;
        let starts: Vec<usize> = split_into_units(&m).iter().map(|u| u.start).collect();
        assert_eq!(starts, vec![0, 1, 6, 8]);
    }
}
