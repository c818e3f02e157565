//! The real tool-calling conversations in `tests/fixtures/conversations` (bfcl-eval,
//! Apache-2.0), and long conversations stitched from them for load and benchmarks.

use serde_json::{json, Value};

const SOURCES: [&str; 6] = [
    include_str!("../../fixtures/conversations/bfcl_multi_turn_long_context_1.json"),
    include_str!("../../fixtures/conversations/bfcl_multi_turn_long_context_10.json"),
    include_str!("../../fixtures/conversations/bfcl_multi_turn_long_context_120.json"),
    include_str!("../../fixtures/conversations/bfcl_multi_turn_long_context_160.json"),
    include_str!("../../fixtures/conversations/bfcl_multi_turn_long_context_190.json"),
    include_str!("../../fixtures/conversations/bfcl_multi_turn_long_context_60.json"),
];

/// One fixture: `{"source", "tools", "messages"}`.
pub fn conversation(index: usize) -> Value {
    serde_json::from_str(SOURCES[index % SOURCES.len()]).unwrap_or(Value::Null)
}

/// The six fixtures.
pub fn conversations() -> Vec<Value> {
    (0..SOURCES.len()).map(conversation).collect()
}

/// A valid conversation of at least `min_bytes` of messages: the fixtures' non-system
/// messages in turn, tool-call ids made unique per round, then a closing user turn.
/// Returns `(messages, tools)`.
pub fn long_conversation(min_bytes: usize) -> (Vec<Value>, Value) {
    let all = conversations();
    let tools = all[0]["tools"].clone();
    let mut messages = vec![json!({"role": "system", "content": "You are a careful agent."})];
    let mut size = 0;
    let mut round = 0;
    while size < min_bytes {
        for fixture in &all {
            for message in fixture["messages"].as_array().into_iter().flatten() {
                if message["role"] == "system" {
                    continue;
                }
                let mut message = message.clone();
                rename_ids(&mut message, round);
                size += message.to_string().len();
                messages.push(message);
            }
            // Fixtures end on tool results; an assistant turn closes each before the next user.
            messages
                .push(json!({"role": "assistant", "content": format!("done with part {round}")}));
            round += 1;
        }
    }
    messages.push(json!({"role": "user", "content": "Summarise where we are."}));
    (messages, tools)
}

fn rename_ids(message: &mut Value, round: usize) {
    if let Some(id) = message.get_mut("tool_call_id") {
        if let Some(text) = id.as_str() {
            *id = json!(format!("{text}-r{round}"));
        }
    }
    if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            if let Some(text) = call["id"].as_str() {
                call["id"] = json!(format!("{text}-r{round}"));
            }
        }
    }
}
