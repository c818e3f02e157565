//! The `extract` strategy: a handoff built from the history itself, with no model, so
//! it can never fail. It merges the previous handoff's items with the new history's
//! (a previous summary is carried, its newest part first), every user message verbatim
//! as far as the budget allows, each tool call with its outcome and the first and last line
//! of its result (where facts tend to sit: a status line, a total, an id), and the last
//! assistant message. When it must choose it keeps the newest, and it says how much it
//! left out. Each part is capped head+tail with a visible mark.

#![forbid(unsafe_code)]

mod digest;
mod previous;
mod tools;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{
    cap_head_tail, content_text, identifiers, AttemptError, Strategy, StrategyInput, Summary,
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
pub(crate) fn cap(text: &str, chars: usize) -> String {
    let half = chars / 2;
    cap_head_tail(text, half, chars - half)
}

/// Most identifiers named for an omitted part.
const NAMED_MOST: usize = 24;

/// `names` as a handoff line says them: distinct, at most [`NAMED_MOST`], the count of
/// the others said.
fn named(names: &[String]) -> String {
    let mut seen = std::collections::HashSet::new();
    let distinct: Vec<&String> = names.iter().filter(|n| seen.insert(n.as_str())).collect();
    let shown: Vec<&str> = distinct
        .iter()
        .take(NAMED_MOST)
        .map(|n| n.as_str())
        .collect();
    let mut out = shown.join(", ");
    if distinct.len() > NAMED_MOST {
        out.push_str(&format!(" and {} more", distinct.len() - NAMED_MOST));
    }
    out
}

/// A user message capped to `chars` characters, head and tail, with the identifiers
/// (ids, paths, numbers) of the part it leaves out named after it: a user's figures
/// and names survive a cut.
fn cap_user(text: &str, chars: usize) -> String {
    let total = text.chars().count();
    if total <= chars {
        return text.to_owned();
    }
    let half = chars / 2;
    let middle: String = text.chars().skip(half).take(total - chars).collect();
    let kept = cap(text, chars);
    let lost: Vec<String> = identifiers(&middle)
        .into_iter()
        .filter(|id| !kept.to_lowercase().contains(id.as_str()))
        .collect();
    if lost.is_empty() {
        return kept;
    }
    format!("{kept}\n[the omitted part named: {}]", named(&lost))
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
    let previous = input
        .previous_handoff
        .as_deref()
        .map(|text| previous::read(text, PREAMBLE))
        .unwrap_or_default();
    // The previous handoff's items come first: repeated compactions drop the oldest.
    let entries = tools::entries(
        previous
            .tools
            .iter()
            .map(|(call, result)| tools::ToolEntry::read(call, result))
            .collect(),
        &messages,
        &tools::Mentions::of(&messages, &input.retained_recent_messages),
    );
    let last_assistant = last_assistant.or_else(|| {
        previous
            .last_assistant
            .as_deref()
            .map(|text| cap(text, chars_for(budget * LAST_ASSISTANT_SHARE / 100)))
    });
    let tools_whole = tools::whole_tokens(&entries, &count);
    // Each part is sure of a floor; above it, the user's own words come first, then
    // the tool results, and what the previous handoff carried (a summary, which
    // repeated compactions would otherwise shrink to nothing) gets all that is left.
    let tools_floor = tools_whole.min(budget * TOOLS_FLOOR / 100);
    let carried_floor = previous
        .carried
        .as_deref()
        .map_or(0, |p| count(p).min(budget * PREVIOUS_FLOOR / 100));
    let fixed = count(&out) + last_assistant.as_deref().map_or(0, count);
    let texts = user_texts(&messages, &previous);
    let users_whole: u64 = texts.iter().map(|t| count(&user_item(t)) + 4).sum::<u64>() + 16;
    // User text first: the handoff grows past its budget, as far as the view's room
    // under the trigger allows, before any user message is cut.
    let budget = budget
        .max((fixed + users_whole + tools_floor + carried_floor).min(input.budgets.user_room()));
    let rest = budget.saturating_sub(fixed);
    let users = user_messages(
        input,
        texts,
        previous.users_left_out,
        rest.saturating_sub(tools_floor + carried_floor)
            .max(budget / 4),
    );
    let rest = rest.saturating_sub(count(&users));
    let tools = tools::section(
        &entries,
        &count,
        (previous.calls_left_out, &previous.calls_left_out_named),
        rest.saturating_sub(carried_floor).max(tools_floor),
    );
    let rest = rest.saturating_sub(count(&tools)).max(carried_floor);

    if let Some(carried) = &previous.carried {
        out.push_str("\n## Previous handoff\n");
        out.push_str(&keep_newest(carried, chars_for(rest)));
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

/// `text` within `chars` characters: its end, the newest part, with what was left out
/// of its start said.
fn keep_newest(text: &str, chars: usize) -> String {
    let total = text.chars().count();
    if total <= chars {
        return text.to_owned();
    }
    let tail: String = text.chars().skip(total - chars).collect();
    format!(
        "[... the first {} characters left out by handoff ...]\n{tail}",
        total - chars
    )
}

/// The text of every compacted user message, the previous handoff's first, oldest first.
fn user_texts(messages: &[&Value], previous: &previous::Previous) -> Vec<String> {
    let mut texts: Vec<String> = previous.users.iter().map(|item| item_text(item)).collect();
    texts.extend(
        messages
            .iter()
            .filter(|m| m["role"] == "user")
            .map(|m| content_text(m))
            .filter(|text| !text.trim().is_empty()),
    );
    texts
}

/// A user message as an item of its section: `- ` and its lines indented.
fn user_item(text: &str) -> String {
    format!("- {}\n", text.trim_end().replace('\n', "\n  "))
}

/// The text of an item `user_item` wrote.
fn item_text(item: &str) -> String {
    let text = item.strip_prefix("- ").unwrap_or(item).trim_end();
    text.replace("\n  ", "\n")
}

/// Fewest characters a user message is shortened to before the oldest are left out.
const USER_FLOOR_CHARS: usize = 240;

/// Every user message within `budget` tokens: verbatim when they fit; else each one
/// longer than an even share shortened to it, head and tail, marked (the short ones
/// stay whole); and only when even the shortest shares do not fit, the oldest left out,
/// and said.
fn user_messages(
    input: &StrategyInput,
    texts: Vec<String>,
    left_out_before: usize,
    budget: u64,
) -> String {
    if texts.is_empty() && left_out_before == 0 {
        return String::new();
    }
    let count = |text: &str| input.tokens.count_text(&user_item(text)) + 4;
    let whole: u64 = texts.iter().map(|t| count(t)).sum();
    let mut texts = texts;
    if whole > budget {
        let lengths: Vec<usize> = texts.iter().map(|t| t.chars().count()).collect();
        let rate = lengths.iter().sum::<usize>() as f64 / whole.max(1) as f64;
        let mut room = (budget as f64 * rate) as usize;
        // The rate is an average and each cut adds its mark: a few tighter tries.
        let originals = texts.clone();
        for _ in 0..8 {
            let share = even_share(&lengths, room).max(USER_FLOOR_CHARS);
            texts = originals
                .iter()
                .map(|text| match text.chars().count() > share {
                    true => cap_user(text, share),
                    false => text.clone(),
                })
                .collect();
            if share == USER_FLOOR_CHARS || texts.iter().map(|t| count(t)).sum::<u64>() <= budget {
                break;
            }
            room = room * 7 / 8;
        }
    }
    let mut kept: Vec<&String> = Vec::new();
    let mut spent = 0;
    for text in texts.iter().rev() {
        let cost = count(text);
        if spent + cost > budget && !kept.is_empty() {
            break;
        }
        spent += cost;
        kept.push(text);
    }
    kept.reverse();
    let left_out = left_out_before + texts.len() - kept.len();
    let mut out = String::from("\n## User messages (verbatim, oldest first)\n");
    if left_out > 0 {
        out.push_str(&format!("[{left_out} earlier user message(s) left out for space; the originals are kept in handoff's log]\n"));
    }
    kept.iter().for_each(|text| out.push_str(&user_item(text)));
    out
}

/// The largest length `share` with the `lengths` capped at it summing to at most `room`:
/// the short ones keep all they have, the long ones split what is left evenly.
fn even_share(lengths: &[usize], room: usize) -> usize {
    let mut sorted = lengths.to_vec();
    sorted.sort_unstable();
    let mut left = room;
    for (i, length) in sorted.iter().enumerate() {
        let others = sorted.len() - i;
        if length * others > left {
            return left / others;
        }
        left -= length;
    }
    usize::MAX
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
        // The two calls with the same result are one line with their count.
        assert!(text.contains("grep({\"q\": \"needle\"}) -> ok (2 calls)\n  | found"));
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
    fn user_text_comes_first_the_handoff_grows_for_it_and_tools_give_way() {
        // Forty messages of ~60 tokens: 2,400 tokens in a handoff budget of 400.
        let mut input = input(40, 400);
        input.budgets.room_tokens = 4000;
        // Each call a result of its own, so that no two merge into one line.
        for (n, unit) in input.history.iter_mut().enumerate() {
            for message in &mut unit.messages {
                if message["role"] == "tool" {
                    message["content"] = json!(format!("found at line {n}{}", "y".repeat(80)));
                }
            }
        }
        let text = extract_handoff(&input);
        for n in 0..40 {
            assert!(
                text.contains(&format!("request {n}: {}", "x".repeat(200))),
                "user message {n} not verbatim"
            );
        }
        assert!(!text.contains("user message(s) left out"), "{text}");
        assert!(input.tokens.count_text(&text) <= 4000, "within the room");
        assert!(
            text.contains("tool call(s) left out") || text.contains("shown as the call only"),
            "tool results give way before user text: {text}"
        );
    }

    #[test]
    fn user_messages_over_the_room_are_each_cut_head_and_tail_not_dropped() {
        let mut input = input(6, 300);
        input.budgets.room_tokens = 800;
        input.history.insert(
            0,
            Unit {
                messages: vec![json!({"role": "user", "content": format!("OLDEST-HEAD {} OLDEST-TAIL", "q".repeat(4000))})],
            },
        );
        let text = extract_handoff(&input);
        assert!(!text.contains("user message(s) left out"), "{text}");
        assert!(
            text.contains("OLDEST-HEAD") && text.contains("OLDEST-TAIL"),
            "{text}"
        );
        assert!(text.contains("characters omitted by handoff"), "{text}");
        for n in 0..6 {
            assert!(
                text.contains(&format!("request {n}: {}", "x".repeat(200))),
                "{n}: {text}"
            );
        }
        assert!(
            input.tokens.count_text(&text) <= 800,
            "{}",
            input.tokens.count_text(&text)
        );
    }

    #[test]
    fn the_even_share_leaves_short_messages_whole() {
        assert_eq!(even_share(&[10, 10, 100], 119), 99);
        assert_eq!(even_share(&[10, 10, 100, 100], 120), 50);
        assert_eq!(even_share(&[10, 20], 1000), usize::MAX);
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

    #[test]
    fn three_compactions_in_a_row_keep_the_facts_of_all_three_spans() {
        let span = |tag: &str| -> Vec<Unit> {
            (0..4)
                .flat_map(|n| {
                    let id = format!("{tag}{n}");
                    [
                        Unit {
                            messages: vec![json!({"role": "user", "content": format!("USER-{tag}-{n} please look")})],
                        },
                        Unit {
                            messages: vec![
                                json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read", "arguments": "{}"}}]}),
                                json!({"role": "tool", "tool_call_id": id, "content": format!("RESULT-{tag}-{n} first\nmiddle\nmiddle\nLAST-{tag}-{n} total")}),
                            ],
                        },
                    ]
                })
                .collect()
        };
        let mut previous: Option<String> = None;
        for tag in ["A", "B", "C"] {
            let mut input = testing::input(span(tag), 8000, 2000);
            input.previous_handoff = previous.take();
            let text = extract_handoff(&input);
            assert!(input.tokens.count_text(&text) <= 2000, "{text}");
            previous = Some(text);
        }
        let text = previous.unwrap();
        for tag in ["A", "B", "C"] {
            for n in 0..4 {
                for fact in [
                    format!("USER-{tag}-{n}"),
                    format!("RESULT-{tag}-{n}"),
                    format!("LAST-{tag}-{n}"),
                ] {
                    assert!(text.contains(&fact), "{fact} lost:\n{text}");
                }
            }
        }
        assert!(!text.contains("## Previous handoff"), "no nesting: {text}");
        assert_eq!(text.matches("## User messages").count(), 1, "{text}");
        assert_eq!(text.matches(PREAMBLE).count(), 1, "{text}");
    }

    #[test]
    fn a_merged_handoff_short_of_room_drops_the_oldest_items_first() {
        let mut previous = None;
        for round in 0..6 {
            let history = (0..10)
                .map(|n| Unit {
                    messages: vec![json!({"role": "user", "content": format!("R{round}-U{n} {}", "y".repeat(120))})],
                })
                .collect();
            let mut input = testing::input(history, 8000, 400);
            input.previous_handoff = previous.take();
            previous = Some(extract_handoff(&input));
        }
        let text = previous.unwrap();
        assert!(text.contains("R5-U9"), "the newest stays: {text}");
        assert!(!text.contains("R0-U0"), "the oldest goes first: {text}");
        assert!(text.contains("earlier user message(s) left out"), "{text}");
        assert!(
            !text.contains("characters omitted"),
            "no middle cut: {text}"
        );
    }
}
