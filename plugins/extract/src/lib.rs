//! The `extract` strategy: a handoff built from the history itself, with no model, so
//! it can never fail. It keeps the previous handoff, every user message verbatim as far
//! as the budget allows (newest first when it must choose, saying how many it left
//! out), the tool calls made with their outcome, and the last assistant message. Each
//! part is capped head+tail with a visible mark.

#![forbid(unsafe_code)]

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{
    cap_head_tail, content_text, tool_calls as calls_of, AttemptError, Strategy, StrategyInput,
    Summary,
};
use serde_json::Value;

/// Share of the budget, in percent, for each part.
const PREVIOUS_SHARE: u64 = 30;
const TOOLS_SHARE: u64 = 15;
const LAST_ASSISTANT_SHARE: u64 = 10;

/// Characters of a tool call's arguments shown.
const ARGUMENTS_SHOWN: usize = 200;

/// The deterministic fallback.
#[derive(Debug, Default)]
pub struct Extract;

impl Strategy for Extract {
    fn kind(&self) -> &'static str {
        "extract"
    }

    fn is_deterministic(&self) -> bool {
        true
    }

    fn summarize<'a>(
        &'a self,
        input: &'a StrategyInput,
    ) -> BoxFuture<'a, Result<Summary, AttemptError>> {
        async move {
            Ok(Summary {
                text: extract_handoff(input),
                usage: None,
                calls: None,
            })
        }
        .boxed()
    }
}

/// Characters that fit `tokens`, at a conservative 3 characters per token.
fn chars_for(tokens: u64) -> usize {
    usize::try_from(tokens.saturating_mul(3)).unwrap_or(usize::MAX)
}

/// Caps `text` to `chars` characters, half head, half tail.
fn cap(text: &str, chars: usize) -> String {
    let half = chars / 2;
    cap_head_tail(text, half, chars - half)
}

/// Builds the deterministic handoff text.
pub fn extract_handoff(input: &StrategyInput) -> String {
    let budget = input.budgets.handoff_tokens.max(256);
    let messages: Vec<&Value> = input
        .history
        .iter()
        .flat_map(|u| u.messages.iter())
        .collect();
    let mut out = String::from(
        "# Handoff (deterministic extract)\n\nThis handoff was built from the conversation itself, without a model.\n",
    );

    if let Some(previous) = &input.previous_handoff {
        out.push_str("\n## Previous handoff\n");
        out.push_str(&cap(previous, chars_for(budget * PREVIOUS_SHARE / 100)));
        out.push('\n');
    }

    let tools = tool_calls(&messages);
    let last_assistant = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "assistant" && !content_text(m).trim().is_empty())
        .map(|m| {
            cap(
                &content_text(m),
                chars_for(budget * LAST_ASSISTANT_SHARE / 100),
            )
        });

    // What is left after the other parts goes to the user's own words.
    let used = input.tokens.count_text(&out)
        + input.tokens.count_text(&tools)
        + last_assistant
            .as_deref()
            .map_or(0, |t| input.tokens.count_text(t));
    let user_budget = budget.saturating_sub(used).max(budget / 4);
    out.push_str(&user_messages(input, &messages, user_budget));

    if !tools.is_empty() {
        out.push_str("\n## Tool calls made\n");
        out.push_str(&cap(&tools, chars_for(budget * TOOLS_SHARE / 100)));
        out.push('\n');
    }
    if let Some(last) = last_assistant {
        out.push_str("\n## Last assistant message\n");
        out.push_str(&last);
        out.push('\n');
    }
    out
}

/// Every user message verbatim, newest kept first when the budget is short.
fn user_messages(input: &StrategyInput, messages: &[&Value], budget: u64) -> String {
    let users: Vec<String> = messages
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| content_text(m))
        .collect();
    let mut kept: Vec<String> = Vec::new();
    let mut spent = 0;
    for text in users.iter().rev() {
        let cost = input.tokens.count_text(text) + 4;
        if spent + cost > budget {
            if kept.is_empty() {
                // A single message bigger than the whole part: keep its head and tail.
                kept.push(cap(text, chars_for(budget)));
            }
            break;
        }
        spent += cost;
        kept.push(text.clone());
    }
    kept.reverse();
    let left_out = users.len() - kept.len();
    let mut out = String::from("\n## User messages (verbatim, oldest first)\n");
    if left_out > 0 {
        out.push_str(&format!("[{left_out} earlier user message(s) left out for space; the originals are kept in handoff's log]\n"));
    }
    for text in kept {
        out.push_str("- ");
        out.push_str(&text.replace('\n', "\n  "));
        out.push('\n');
    }
    out
}

/// One line per tool call: name, shortened arguments, ok or error.
fn tool_calls(messages: &[&Value]) -> String {
    let mut out = String::new();
    for (index, message) in messages.iter().enumerate() {
        for (id, name, arguments) in calls_of(message) {
            let result = messages[index + 1..]
                .iter()
                .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
                .map(|m| content_text(m));
            let outcome = match result {
                None => "no result",
                Some(text) if looks_like_error(&text) => "error",
                Some(_) => "ok",
            };
            out.push_str(&format!(
                "- {name}({}) -> {outcome}\n",
                cap(arguments, ARGUMENTS_SHOWN)
            ));
        }
    }
    out
}

fn looks_like_error(text: &str) -> bool {
    let lower = text.trim_start().to_ascii_lowercase();
    lower.starts_with("error")
        || lower.starts_with("{\"error\"")
        || serde_json::from_str::<Value>(text)
            .is_ok_and(|v| v.get("error").is_some_and(|e| !e.is_null()))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use handoff_plugin_api::testing::{BytesPerFour, NoModel};
    use handoff_plugin_api::{Budgets, CancellationToken, ModelInfo, Unit};
    use serde_json::json;

    use super::*;

    fn input(users: usize, handoff_tokens: u64) -> StrategyInput {
        let mut history = Vec::new();
        for n in 0..users {
            history.push(Unit {
                messages: vec![
                    json!({"role": "user", "content": format!("request {n}: {}", "x".repeat(200))}),
                ],
            });
            history.push(Unit {
                messages: vec![
                    json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("c{n}"), "type": "function", "function": {"name": "grep", "arguments": "{\"q\": \"needle\"}"}}]}),
                    json!({"role": "tool", "tool_call_id": format!("c{n}"), "content": if n == 0 { "Error: no such file" } else { "found" }}),
                ],
            });
        }
        history.push(Unit {
            messages: vec![json!({"role": "assistant", "content": "LAST ASSISTANT WORDS"})],
        });
        StrategyInput {
            conversation_id: "c".into(),
            history,
            retained_recent_messages: vec![],
            previous_handoff: Some("PREVIOUS HANDOFF".into()),
            model: ModelInfo {
                model: "m".into(),
                context_window: 8000,
                summary_model: "m".into(),
                summary_context_window: 8000,
            },
            budgets: Budgets {
                input_budget: 8000,
                handoff_tokens,
                max_calls: 1,
            },
            cancel: CancellationToken::new(),
            client: Arc::new(NoModel),
            tokens: Arc::new(BytesPerFour),
        }
    }

    #[test]
    fn keeps_previous_handoff_users_tools_and_last_assistant() {
        let text = extract_handoff(&input(3, 4000));
        assert!(text.contains("PREVIOUS HANDOFF"));
        for n in 0..3 {
            assert!(
                text.contains(&format!("request {n}: {}", "x".repeat(200))),
                "user message {n} not verbatim"
            );
        }
        assert!(text.contains("grep({\"q\": \"needle\"}) -> error"));
        assert!(text.contains("grep({\"q\": \"needle\"}) -> ok"));
        assert!(text.contains("LAST ASSISTANT WORDS"));
        assert!(!text.contains("left out"));
    }

    #[test]
    fn a_short_budget_keeps_the_newest_users_and_says_how_many_it_left_out() {
        let text = extract_handoff(&input(40, 400));
        assert!(
            text.contains("request 39:"),
            "the newest user message is kept"
        );
        assert!(!text.contains("request 0:"));
        assert!(text.contains("earlier user message(s) left out"));
    }
}
