//! The text of the summary request: previous handoff, history, then the recent
//! messages marked reference only.

use handoff_plugin_api::{shorten_tool_body, tool_calls, StrategyInput};
use serde_json::Value;

/// How to render.
#[derive(Debug, Clone, Copy)]
pub struct RenderOptions {
    /// Shorten over-long tool results (the only text the precheck may shorten).
    pub shorten_tool_bodies: bool,
}

/// The user message of the summary request.
pub fn render_request_text(input: &StrategyInput, options: RenderOptions) -> String {
    let mut out = String::new();
    if let Some(previous) = &input.previous_handoff {
        out.push_str("<previous_handoff>\n");
        out.push_str(previous);
        out.push_str("\n</previous_handoff>\n\n");
    }
    out.push_str("<history>\n");
    for unit in &input.history {
        for message in &unit.messages {
            render_message(message, options, &mut out);
        }
    }
    out.push_str("</history>\n\n");
    if !input.retained_recent_messages.is_empty() {
        out.push_str(
            "<retained_recent_messages reference_only=\"true\">\n\
             These messages stay in the conversation verbatim after your handoff. Use them only to \
             understand where the history leads; do not copy or summarise them.\n",
        );
        for message in &input.retained_recent_messages {
            render_message(message, options, &mut out);
        }
        out.push_str("</retained_recent_messages>\n\n");
    }
    out.push_str("Write the handoff for <history> now, following the required sections.");
    out
}

/// The text of `content`: a string, or the text parts of an array.
pub fn content_text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|part| match part.get("text").and_then(Value::as_str) {
                Some(text) => text.to_owned(),
                None => format!(
                    "[{} part]",
                    part.get("type")
                        .and_then(Value::as_str)
                        .unwrap_or("non-text")
                ),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

fn render_message(message: &Value, options: RenderOptions, out: &mut String) {
    let role = message
        .get("role")
        .and_then(Value::as_str)
        .unwrap_or("unknown");
    let text = content_text(message.get("content").unwrap_or(&Value::Null));
    match role {
        "tool" | "function" => {
            let body = if options.shorten_tool_bodies {
                shorten_tool_body(&text)
            } else {
                text
            };
            let id = message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            out.push_str(&format!("[tool result {id}]\n{body}\n\n"));
        }
        _ => {
            if !text.is_empty() {
                out.push_str(&format!("[{role}]\n{text}\n\n"));
            }
            for (id, name, arguments) in tool_calls(message) {
                out.push_str(&format!("[{role} calls {name} {id}]\n{arguments}\n\n"));
            }
        }
    }
}
