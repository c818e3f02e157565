//! What a Responses item carries beyond the shared fields: calls, their outputs,
//! reasoning summaries, media parts.

use serde_json::Value;

use crate::dialect::text::{push_content, push_media};
use crate::dialect::Markers;

/// The raw-JSON markers of Responses items.
pub(crate) const MARKERS: Markers = Markers {
    paired: &["\"call_id\""],
    echoed: &["\"type\""],
    indexed: &[],
};

/// The text of a call's id, arguments and input, an output, a reasoning item. A
/// provider compaction item's sealed content is no text: the provider counts what it
/// stands for, which the calibration learns from its counts.
pub(crate) fn push_text(item: &Value, push: &mut dyn FnMut(&str)) {
    let sealed = crate::dialect::is_provider_compaction(item);
    for key in ["call_id", "arguments", "input", "encrypted_content"] {
        if sealed && key == "encrypted_content" {
            continue;
        }
        push(item.get(key).and_then(Value::as_str).unwrap_or(""));
    }
    push_content(item.get("output"), push);
    for part in item
        .get("summary")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        crate::dialect::text::push_part(part, push);
    }
}

/// Media parts: `input_image`, `input_file`.
pub(crate) fn push_part(part: &Value, push: &mut dyn FnMut(&str)) -> bool {
    let media = matches!(
        part.get("type").and_then(Value::as_str),
        Some("input_image" | "input_file")
    );
    if media {
        push_media(push);
    }
    media
}

/// An output item's `output`.
pub(super) fn shorten_tool_results(
    item: &mut Value,
    shorten: &mut dyn FnMut(&mut Value) -> bool,
) -> bool {
    let output = item
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|kind| kind.ends_with("_output"));
    output && item.get_mut("output").is_some_and(shorten)
}

/// True for a function or custom tool call item.
pub(super) fn calls_tools(item: &Value) -> bool {
    matches!(
        item["type"].as_str(),
        Some("function_call" | "custom_tool_call")
    )
}
