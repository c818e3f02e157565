//! The text of a summary request: the handoff so far, the history (or one part of it),
//! then the recent messages marked reference only, and the instruction.

use handoff_plugin_api::{shorten_tool_body, tool_calls, StrategyInput, Unit};
use serde_json::Value;

/// How to render.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions {
    /// Shorten over-long tool results (the only text the precheck may shorten).
    pub shorten_tool_bodies: bool,
}

/// Where a call stands in a fold: part `index` (from 0) of `count`.
#[derive(Debug, Clone, Copy)]
pub struct Position {
    /// This call's part.
    pub index: usize,
    /// How many parts there are.
    pub count: usize,
}

/// The user message of a single summary request over the whole history.
pub fn render_request_text(input: &StrategyInput, options: RenderOptions) -> String {
    let history: String = input
        .history
        .iter()
        .map(|unit| render_unit(unit, options))
        .collect();
    let recent = (!input.retained_recent_messages.is_empty())
        .then(|| render_recent(&input.retained_recent_messages, options));
    render_part(
        input.previous_handoff.as_deref(),
        &history,
        recent.as_deref(),
        Position { index: 0, count: 1 },
    )
}

/// The user message of one call: `handoff` is the previous compaction's handoff for
/// the first call, and the handoff the previous call wrote for every later one.
pub fn render_part(
    handoff: Option<&str>,
    history: &str,
    recent: Option<&str>,
    at: Position,
) -> String {
    let folding = at.count > 1;
    let mut out = String::new();
    if let Some(handoff) = handoff {
        let tag = if folding {
            "running_handoff"
        } else {
            "previous_handoff"
        };
        out.push_str(&format!("<{tag}>\n{handoff}\n</{tag}>\n\n"));
    }
    if folding {
        out.push_str(&format!(
            "<history part=\"{}\" of=\"{}\">\n",
            at.index + 1,
            at.count
        ));
    } else {
        out.push_str("<history>\n");
    }
    out.push_str(history);
    out.push_str("</history>\n\n");
    if let Some(recent) = recent {
        out.push_str(recent);
    }
    out.push_str(&instruction(handoff.is_some(), at));
    out
}

/// The user message of one part of a parallel fold: the part alone, and what becomes
/// of its handoff.
pub(crate) fn render_parallel_part(
    history: &str,
    recent: Option<&str>,
    index: usize,
    count: usize,
) -> String {
    let mut out = format!("<history part=\"{}\" of=\"{count}\">\n", index + 1);
    out.push_str(history);
    out.push_str("</history>\n\n");
    if let Some(recent) = recent {
        out.push_str(recent);
    }
    out.push_str(&format!(
        "The history is long, so it is summarised in {count} parts at once; this is part {}. \
         Write the handoff for this part alone now, following the required sections: the \
         handoffs of all parts are merged afterwards, in order.",
        index + 1
    ));
    out
}

/// The user message of a merge: the previous compaction's handoff (first merge only),
/// then `handoffs` of consecutive parts (the first is part `first + 1` of `count`).
pub(crate) fn render_merge(
    previous: Option<&str>,
    handoffs: &[String],
    count: usize,
    first: usize,
) -> String {
    let mut out = String::new();
    if let Some(previous) = previous {
        out.push_str(&format!(
            "<previous_handoff>\n{previous}\n</previous_handoff>\n\n"
        ));
    }
    for (at, handoff) in handoffs.iter().enumerate() {
        let part = first + at + 1;
        out.push_str(&format!(
            "<part_handoff part=\"{part}\" of=\"{count}\">\n{handoff}\n</part_handoff>\n\n"
        ));
    }
    let before = if previous.is_some() {
        ", after <previous_handoff> (the conversation before them)"
    } else {
        ""
    };
    out.push_str(&format!(
        "Each <part_handoff> is the handoff of one consecutive part of the same \
         conversation, oldest first{before}. Merge them into one complete handoff now, \
         following the required sections: keep every fact that still matters; where parts \
         disagree, the later one is current."
    ));
    out
}

/// What the model is asked to do; a folding call always says it extends a handoff.
fn instruction(has_handoff: bool, at: Position) -> String {
    let (part, count) = (at.index + 1, at.count);
    match (at.count > 1, has_handoff) {
        (false, _) => {
            "Write the handoff for <history> now, following the required sections.".into()
        }
        (true, false) => format!(
            "The history is long, so you see it in {count} parts, in order; this is part {part}. \
             Write the handoff for this part now, following the required sections: the next \
             call will give you your handoff as <running_handoff> to extend with part {}.",
            part + 1
        ),
        (true, true) => format!(
            "You are extending a running handoff. <running_handoff> is the handoff of the \
             conversation before part {part} of {count} of <history>. Write the complete \
             updated handoff covering both, following the required sections: keep every fact \
             of <running_handoff> that still matters, and add what this part adds.{}",
            if part == count {
                ""
            } else {
                " More parts follow."
            }
        ),
    }
}

/// The text of one unit's messages.
pub(crate) fn render_unit(unit: &Unit, options: RenderOptions) -> String {
    let mut out = String::new();
    for message in &unit.messages {
        render_message(message, options, &mut out);
    }
    out
}

/// The reference-only block of the retained recent messages.
pub(crate) fn render_recent(messages: &[Value], options: RenderOptions) -> String {
    let mut out = String::from(
        "<retained_recent_messages reference_only=\"true\">\n\
         These messages stay in the conversation verbatim after your handoff. Use them only to \
         understand where the history leads; do not copy or summarise them.\n",
    );
    for message in messages {
        render_message(message, options, &mut out);
    }
    out.push_str("</retained_recent_messages>\n\n");
    out
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

/// The text of `content`: a string, or the text parts of an array, other parts named
/// so the model knows they were there.
pub(crate) fn content_text(content: &Value) -> String {
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
