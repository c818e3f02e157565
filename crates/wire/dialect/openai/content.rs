//! What a chat-completions message carries beyond the shared fields: tool calls and
//! their results, DeepSeek's reasoning, media parts.

use serde_json::Value;

use crate::dialect::text::push_media;
use crate::dialect::Markers;

/// The raw-JSON markers of chat messages.
pub(crate) const MARKERS: Markers = Markers {
    paired: &["\"tool_calls\"", "\"tool_call_id\""],
    echoed: &["\"tool_calls\"", "\"type\""],
    // A restarted tracker maps re-sent tool calls (arguments reformatted, content
    // null) onto the logged ones, so their text stays in the index.
    indexed: &["\"tool_calls\""],
};

/// The text of the call ids, DeepSeek's reasoning and each tool call.
pub(crate) fn push_text(message: &Value, push: &mut dyn FnMut(&str)) {
    for key in ["tool_call_id", "reasoning_content"] {
        push(message.get(key).and_then(Value::as_str).unwrap_or(""));
    }
    for call in tool_calls(message) {
        for pointer in ["/id", "/function/name", "/function/arguments"] {
            push(call.pointer(pointer).and_then(Value::as_str).unwrap_or(""));
        }
    }
}

/// Media parts: `image_url`, `input_audio`, `file`.
pub(crate) fn push_part(part: &Value, push: &mut dyn FnMut(&str)) -> bool {
    let media = matches!(
        part.get("type").and_then(Value::as_str),
        Some("image_url" | "input_audio" | "file")
    );
    if media {
        push_media(push);
    }
    media
}

/// A tool message's `content`.
pub(super) fn shorten_tool_results(
    message: &mut Value,
    shorten: &mut dyn FnMut(&mut Value) -> bool,
) -> bool {
    message.get_mut("content").is_some_and(shorten)
}

/// True for an assistant message with tool calls.
pub(super) fn calls_tools(message: &Value) -> bool {
    tool_calls(message).next().is_some()
}

/// True when an assistant message carries `reasoning_content`.
pub(super) fn carries_reasoning(message: &Value) -> bool {
    message
        .get("reasoning_content")
        .is_some_and(|reasoning| !reasoning.is_null())
}

fn tool_calls(message: &Value) -> impl Iterator<Item = &Value> {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
}
