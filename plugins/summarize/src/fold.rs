//! Folding: a history too long for one summary request is summarised in parts, in
//! order, each call extending the handoff the previous one wrote.
//!
//! Each part is whole units and fits the summary model with room for the running
//! handoff, so no call can overflow. Only over-long tool bodies of a unit that does
//! not fit a call on its own are shortened; a unit that does not fit even then fails
//! the precheck, as does a history that needs more than `max_calls` calls.

use handoff_plugin_api::{AttemptError, FailureReason, StrategyInput};

use crate::render::{render_recent, render_unit, RenderOptions};

/// Share of a call's room the planner fills: per-unit counts may differ from the
/// count of their concatenation by a token at a boundary.
const FILL: f64 = 0.97;

/// One call's share of the history, rendered.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    /// The units' text, in order.
    pub history: String,
    /// The retained recent messages, shown with the last part when they fit.
    pub recent: Option<String>,
}

/// What a fold needs to know about one call's fixed costs.
#[derive(Debug, Clone, Copy)]
pub struct Room {
    /// Tokens a call's whole input may use.
    pub allowance: u64,
    /// Tokens of everything in a call but the history and the recent messages: the
    /// system prompt, the frame of the user message, and the running handoff at its
    /// largest.
    pub fixed: u64,
    /// Most calls allowed.
    pub max_calls: u32,
}

/// Splits the history of `input` into parts that each fit one call.
pub fn plan_parts(input: &StrategyInput, room: Room) -> Result<Vec<Part>, AttemptError> {
    let capacity = room.allowance.saturating_sub(room.fixed);
    let capacity = (capacity as f64 * FILL) as u64;
    let count = |text: &str| input.tokens.count_text(text);
    let total = input.history.len();
    let mut parts: Vec<Part> = Vec::new();
    let mut current = String::new();
    let mut used = 0;
    for (index, unit) in input.history.iter().enumerate() {
        let mut text = render_unit(unit, RenderOptions::default());
        let mut cost = count(&text);
        if cost > capacity {
            text = render_unit(
                unit,
                RenderOptions {
                    shorten_tool_bodies: true,
                },
            );
            cost = count(&text);
        }
        if cost > capacity {
            return Err(AttemptError::new(
                FailureReason::PrecheckFailed,
                format!(
                    "unit {} of {total} is {cost} tokens with tool bodies shortened; one call to {} has room for {capacity} (allowance {} − prompt, frame and running handoff {})",
                    index + 1,
                    input.model.summary_model,
                    room.allowance,
                    room.fixed
                ),
            ));
        }
        if used + cost > capacity && !current.is_empty() {
            parts.push(Part {
                history: std::mem::take(&mut current),
                recent: None,
            });
            used = 0;
        }
        current.push_str(&text);
        used += cost;
    }
    if !current.is_empty() {
        parts.push(Part {
            history: current,
            recent: None,
        });
    }
    attach_recent(input, &mut parts, capacity, used);
    let needed = parts.len();
    if needed > room.max_calls as usize {
        return Err(AttemptError::new(
            FailureReason::PrecheckFailed,
            format!(
                "folding this history into a handoff needs {needed} summary calls to {}; compaction.max_summary_calls allows {}",
                input.model.summary_model, room.max_calls
            ),
        ));
    }
    Ok(parts)
}

/// Shows the recent messages with the last part when they fit beside it (shortened
/// tool bodies if need be); they are reference only, so a call never fails for them.
fn attach_recent(input: &StrategyInput, parts: &mut [Part], capacity: u64, last_used: u64) {
    if input.retained_recent_messages.is_empty() {
        return;
    }
    let Some(last) = parts.last_mut() else {
        return;
    };
    for shorten in [false, true] {
        let text = render_recent(
            &input.retained_recent_messages,
            RenderOptions {
                shorten_tool_bodies: shorten,
            },
        );
        if last_used + input.tokens.count_text(&text) <= capacity {
            last.recent = Some(text);
            return;
        }
    }
}
