//! What a Messages API message carries in its blocks: thinking, tool use and results,
//! media.

use serde_json::Value;

use crate::dialect::text::{push_content, push_media};
use crate::dialect::Markers;

/// The raw-JSON markers of Messages API messages.
pub(crate) const MARKERS: Markers = Markers {
    paired: &["\"tool_use_id\"", "\"tool_use\""],
    echoed: &["\"type\""],
    indexed: &[],
};

/// The text of thinking, tool-use and tool-result blocks; media by allowance.
pub(crate) fn push_part(part: &Value, push: &mut dyn FnMut(&str)) -> bool {
    let text = |key: &str| part.get(key).and_then(Value::as_str).unwrap_or("");
    match part.get("type").and_then(Value::as_str).unwrap_or("") {
        "thinking" => push(text("thinking")),
        "redacted_thinking" => push(text("data")),
        "tool_use" | "server_tool_use" => {
            push(text("name"));
            push(&part.get("input").map_or_else(String::new, Value::to_string));
        }
        "tool_result" => push_content(part.get("content"), push),
        "image" | "document" => push_media(push),
        _ => return false,
    }
    true
}

/// Each `tool_result` block's content.
pub(super) fn shorten_tool_results(
    message: &mut Value,
    shorten: &mut dyn FnMut(&mut Value) -> bool,
) -> bool {
    match message.get_mut("content") {
        Some(Value::Array(blocks)) => blocks
            .iter_mut()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
            .filter_map(|b| b.get_mut("content"))
            .fold(false, |changed, content| shorten(content) | changed),
        Some(content) => shorten(content),
        None => false,
    }
}

/// True for a message with a `tool_use` block.
pub(super) fn calls_tools(message: &Value) -> bool {
    message["content"]
        .as_array()
        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_use"))
}
