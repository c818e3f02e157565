//! The `extract` strategy: a handoff built from the history itself, with no model, so
//! it can never fail. It keeps the previous handoff, every user message verbatim as far
//! as the budget allows, each tool call with its outcome and the first and last line
//! of its result (where facts tend to sit: a status line, a total, an id), and the last
//! assistant message. When it must choose it keeps the newest, and it says how much it
//! left out. Each part is capped head+tail with a visible mark.

#![forbid(unsafe_code)]

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{
    cap_head_tail, content_text, tool_calls as calls_of, AttemptError, Strategy, StrategyInput,
    Summary,
};
use serde_json::Value;

/// Share of the budget, in percent, of the last assistant message.
const LAST_ASSISTANT_SHARE: u64 = 10;
/// Share of the budget, in percent, that the previous handoff keeps at least.
const PREVIOUS_FLOOR: u64 = 20;
/// Share of the budget, in percent, that tool results keep however long the user's
/// messages are.
const TOOLS_FLOOR: u64 = 15;

/// How an extract handoff starts.
const PREAMBLE: &str = "# Handoff (deterministic extract)\n\nThis handoff was built from the conversation itself, without a model.\n";

/// Characters of a tool call's arguments shown.
const ARGUMENTS_SHOWN: usize = 200;

/// Lines kept from the start and from the end of a tool result.
const RESULT_HEAD_LINES: usize = 1;
const RESULT_TAIL_LINES: usize = 1;

/// Characters kept of one kept line of a tool result.
const RESULT_LINE_CHARS: usize = 200;

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
    let count = |text: &str| input.tokens.count_text(text);
    let messages: Vec<&Value> = input
        .history
        .iter()
        .flat_map(|u| u.messages.iter())
        .collect();
    let mut out = String::from(PREAMBLE);

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
    let entries = tool_entries(&messages);
    let tools_whole: u64 = entries
        .iter()
        .map(|e| count(&e.call) + count(&e.result))
        .sum();
    // Each part is sure of a floor; above it, the user's own words come first, then
    // the tool results of this history, and the previous handoff (which repeated
    // compactions would otherwise shrink to nothing) gets all that is left.
    let tools_floor = tools_whole.min(budget * TOOLS_FLOOR / 100);
    let previous_floor = input
        .previous_handoff
        .as_deref()
        .map_or(0, |p| count(p).min(budget * PREVIOUS_FLOOR / 100));
    let fixed = count(&out) + last_assistant.as_deref().map_or(0, count);
    let rest = budget.saturating_sub(fixed);
    let users = user_messages(
        input,
        &messages,
        rest.saturating_sub(tools_floor + previous_floor)
            .max(budget / 4),
    );
    let rest = rest.saturating_sub(count(&users));
    let tools = tool_section(
        input,
        &entries,
        rest.saturating_sub(previous_floor).max(tools_floor),
    );
    let rest = rest.saturating_sub(count(&tools)).max(previous_floor);

    if let Some(previous) = &input.previous_handoff {
        out.push_str("\n## Previous handoff\n");
        out.push_str(&cap(without_preamble(previous), chars_for(rest)));
        out.push('\n');
    }
    out.push_str(&users);
    out.push_str(&tools);
    if let Some(last) = last_assistant {
        out.push_str("\n## Last assistant message\n");
        out.push_str(&last);
        out.push('\n');
    }
    out
}

/// The previous handoff without the preamble of an extract handoff: after a run of
/// fallbacks the preambles would nest, and the cap would keep them instead of facts.
fn without_preamble(previous: &str) -> &str {
    previous
        .strip_prefix(PREAMBLE)
        .map_or(previous, str::trim_start)
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

/// One tool call: the line naming it and its outcome, and the kept lines of its result.
struct ToolEntry {
    call: String,
    result: String,
}

/// Every tool call of `messages`, oldest first.
fn tool_entries(messages: &[&Value]) -> Vec<ToolEntry> {
    let mut entries = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        for (id, name, arguments) in calls_of(message) {
            let result = messages[index + 1..]
                .iter()
                .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
                .map(|m| content_text(m));
            let outcome = match &result {
                None => "no result",
                Some(text) if looks_like_error(text) => "error",
                Some(_) => "ok",
            };
            entries.push(ToolEntry {
                call: format!(
                    "- {name}({}) -> {outcome}\n",
                    cap(arguments, ARGUMENTS_SHOWN)
                ),
                result: result.as_deref().map(result_edges).unwrap_or_default(),
            });
        }
    }
    entries
}

/// The first and last lines of a tool result, each capped, with what was left out marked.
fn result_edges(text: &str) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let quote = |line: &str| format!("  | {}\n", cap(line, RESULT_LINE_CHARS));
    let mut out = String::new();
    if lines.len() <= RESULT_HEAD_LINES + RESULT_TAIL_LINES {
        lines.iter().for_each(|l| out.push_str(&quote(l)));
        return out;
    }
    lines[..RESULT_HEAD_LINES]
        .iter()
        .for_each(|l| out.push_str(&quote(l)));
    out.push_str(&format!(
        "  | [... {} lines omitted by handoff ...]\n",
        lines.len() - RESULT_HEAD_LINES - RESULT_TAIL_LINES
    ));
    lines[lines.len() - RESULT_TAIL_LINES..]
        .iter()
        .for_each(|l| out.push_str(&quote(l)));
    out
}

/// The tool section within `budget` tokens: newest calls first, each with its result's
/// edges while they fit, then the bare call line, then nothing; with counts of both.
fn tool_section(input: &StrategyInput, entries: &[ToolEntry], budget: u64) -> String {
    if entries.is_empty() {
        return String::new();
    }
    let mut kept: Vec<String> = Vec::new();
    let mut spent = 0;
    let (mut results_left_out, mut calls_left_out) = (0, 0);
    for entry in entries.iter().rev() {
        let whole = format!("{}{}", entry.call, entry.result);
        let whole_cost = input.tokens.count_text(&whole);
        let call_cost = input.tokens.count_text(&entry.call);
        if spent + whole_cost <= budget {
            spent += whole_cost;
            kept.push(whole);
        } else if spent + call_cost <= budget {
            spent += call_cost;
            results_left_out += usize::from(!entry.result.is_empty());
            kept.push(entry.call.clone());
        } else {
            calls_left_out += 1;
        }
    }
    kept.reverse();
    let mut out =
        String::from("\n## Tool calls and results (first and last lines, oldest first)\n");
    if calls_left_out > 0 {
        out.push_str(&format!(
            "[{calls_left_out} earlier tool call(s) left out for space; the originals are kept in handoff's log]\n"
        ));
    }
    if results_left_out > 0 {
        out.push_str(&format!(
            "[{results_left_out} older tool result(s) shown as the call only, for space]\n"
        ));
    }
    kept.iter().for_each(|k| out.push_str(k));
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
    use handoff_plugin_api::{testing, Unit};
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
        {
            let mut input = testing::input(history, 8000, handoff_tokens);
            input.previous_handoff = Some("PREVIOUS HANDOFF".into());
            input
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
        assert!(text.contains("grep({\"q\": \"needle\"}) -> error\n  | Error: no such file"));
        assert!(text.contains("grep({\"q\": \"needle\"}) -> ok\n  | found"));
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

    #[test]
    fn tool_results_keep_their_first_and_last_lines_newest_first() {
        let mut input = input(1, 600);
        let body = |n: usize| {
            let middle: Vec<String> = (0..50)
                .map(|i| format!("filler line {i} {}", "z".repeat(60)))
                .collect();
            format!(
                "HEAD-{n} status ok\nsecond {n}\n{}\npenultimate {n}\nTAIL-{n} total 42",
                middle.join("\n")
            )
        };
        input.history = (0..30)
            .map(|n| Unit {
                messages: vec![
                    json!({"role": "assistant", "content": null, "tool_calls": [{"id": format!("t{n}"), "type": "function", "function": {"name": "read", "arguments": "{}"}}]}),
                    json!({"role": "tool", "tool_call_id": format!("t{n}"), "content": body(n)}),
                ],
            })
            .collect();
        let text = extract_handoff(&input);
        assert!(text.contains("  | HEAD-29 status ok\n  | [... 52 lines omitted by handoff ...]\n  | TAIL-29 total 42"), "{text}");
        assert!(
            !text.contains("filler line"),
            "the middle of results is left out"
        );
        assert!(
            !text.contains("HEAD-0 "),
            "the oldest results give way first"
        );
        assert!(text.contains("left out for space") || text.contains("shown as the call only"));
        assert!(
            input.tokens.count_text(&text) <= 1500 + 200,
            "{}",
            input.tokens.count_text(&text)
        );
    }
}
