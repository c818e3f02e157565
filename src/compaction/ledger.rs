//! The ledger: the exact facts of every compacted span, appended by handoff to each
//! handoff whatever strategy wrote it, so no model can lose them. A model's text
//! carries the narrative; the ledger carries the user's instructions verbatim, the
//! identifiers the tool calls and results named, and each call's outcome.
//!
//! It is deterministic and bounded: it gets `compaction.ledger_share` of the handoff
//! budget and is built before the strategy runs, which gets what the ledger leaves.
//! Over its share it drops the oldest tool outcomes first, then shortens the user's
//! messages (head and tail, marked), then drops the oldest identifiers, and says how
//! much it left out. The record keeps it structured, so the next compaction carries
//! it forward without parsing text.

use handoff_plugin_api::{
    cap_head_tail, content_text, identifiers, tool_calls, TokenCounter, Unit,
};
use serde_json::Value;

pub use crate::base::ledger::Ledger;

/// The ledger's heading; it opens the last section of every handoff that has one.
pub const HEADING: &str = "## Ledger (exact, kept by handoff)";

/// What the ledger's heading is followed by.
const INTRO: &str = "Facts of the compacted messages, copied by handoff, not written by a model.";

/// Characters of one user message kept before the share forces fewer.
const INSTRUCTION_CHARS: usize = 2000;
/// Fewest characters a user message is shortened to.
const INSTRUCTION_FLOOR: usize = 240;
/// Characters of a call's arguments, and of each kept line of its result.
const OUTCOME_PART_CHARS: usize = 160;
/// Longest identifier kept.
const IDENTIFIER_CHARS: usize = 120;

impl Ledger {
    /// The ledger of `history` after `previous`'s, whole.
    pub fn build(previous: Option<&Ledger>, history: &[Unit]) -> Ledger {
        let mut ledger = previous.cloned().unwrap_or_default();
        let mut outcomes = Vec::new();
        let mut found = Vec::new();
        for unit in history {
            let results: Vec<(&str, String)> = unit
                .messages
                .iter()
                .filter(|m| m["role"] == "tool")
                .map(|m| {
                    let id = m.get("tool_call_id").and_then(Value::as_str).unwrap_or("");
                    (id, content_text(m))
                })
                .collect();
            for message in &unit.messages {
                match message["role"].as_str() {
                    Some("user") => {
                        let text = content_text(message);
                        if !text.trim().is_empty() {
                            ledger
                                .instructions
                                .push(shorten(text.trim(), INSTRUCTION_CHARS));
                        }
                    }
                    Some("assistant") => {
                        for (id, name, arguments) in tool_calls(message) {
                            let result = results
                                .iter()
                                .find(|(answers, _)| *answers == id)
                                .map(|(_, text)| text.as_str());
                            found.extend(identifiers(arguments));
                            if let Some(result) = result {
                                found.extend(identifiers(result));
                            }
                            outcomes.push(outcome_line(name, arguments, result));
                        }
                    }
                    _ => {}
                }
            }
        }
        found.retain(|id| id.chars().count() <= IDENTIFIER_CHARS);
        let mut identifiers = std::mem::take(&mut ledger.identifiers);
        // An identifier named again moves to where it was last seen: the newest survive.
        // A span's tool results can name thousands: one set, not a scan per id.
        let named: std::collections::HashSet<&String> = found.iter().collect();
        identifiers.retain(|id| !named.contains(id));
        let mut seen = std::collections::HashSet::new();
        let new: Vec<String> = found
            .iter()
            .filter(|id| seen.insert(id.as_str()))
            .cloned()
            .collect();
        identifiers.extend(new);
        ledger.identifiers = identifiers;
        outcomes.reverse();
        outcomes.append(&mut ledger.outcomes);
        ledger.outcomes = outcomes;
        ledger
    }

    /// True when there is nothing to list.
    pub fn is_empty(&self) -> bool {
        self.instructions.is_empty() && self.identifiers.is_empty() && self.outcomes.is_empty()
    }

    /// Cuts the ledger to `limit` tokens of its rendering after `above` (the text it
    /// is appended to; what that quotes costs nothing): the oldest outcomes first, then
    /// the user's messages shortened, then the oldest identifiers.
    pub fn fit(&mut self, limit: u64, tokens: &dyn TokenCounter, above: &str) {
        let above_lower = above.to_lowercase();
        let quoted = |text: &str| !above.is_empty() && above.contains(text);
        let named = |id: &str| !above.is_empty() && above_lower.contains(id);
        let cost = |text: &str| tokens.count_text(text) + 1;
        let fixed = cost(HEADING)
            + cost(INTRO)
            + 3 * cost("### Tool calls and outcomes, newest first")
            + 16;
        let instruction_cost = |texts: &[String]| -> u64 {
            texts.iter().filter(|s| !quoted(s)).map(|s| cost(s)).sum()
        };
        let instructions = instruction_cost(&self.instructions);
        let identifiers: u64 = self
            .identifiers
            .iter()
            .filter(|id| !named(id))
            .map(|s| cost(s))
            .sum();
        let mut outcome_costs: Vec<u64> = self.outcomes.iter().map(|s| cost(s)).collect();
        let mut outcomes: u64 = outcome_costs.iter().sum();
        while fixed + instructions + identifiers + outcomes > limit {
            let Some(oldest) = outcome_costs.pop() else {
                break;
            };
            self.outcomes.pop();
            self.outcomes_left_out += 1;
            outcomes -= oldest;
        }
        // The user's messages leave the identifiers up to a third of the room.
        let room = limit.saturating_sub(fixed + identifiers.min(limit / 3) + outcomes);
        let mut instructions = instructions;
        let unquoted = self.instructions.iter().filter(|s| !quoted(s)).count();
        if instructions > room && unquoted > 0 {
            // Each message gets an even part of the room, in characters at the
            // counter's own rate.
            let chars: usize = self
                .instructions
                .iter()
                .filter(|s| !quoted(s))
                .map(|s| s.chars().count())
                .sum();
            let rate = chars as f64 / instructions.max(1) as f64;
            let each = ((room as f64 * rate) as usize / unquoted).max(INSTRUCTION_FLOOR);
            for text in self.instructions.iter_mut().filter(|s| !quoted(s)) {
                *text = shorten(text, each);
            }
            instructions = instruction_cost(&self.instructions);
        }
        let mut identifiers = identifiers;
        let mut dropped = 0;
        self.identifiers.retain(|id| {
            if named(id) || fixed + instructions + identifiers + outcomes <= limit {
                return true;
            }
            identifiers -= cost(id);
            dropped += 1;
            false
        });
        self.identifiers_left_out += dropped;
        // The costs above are per item; the rendering decides, in the same order.
        while tokens.count_text(&self.render(above)) > limit {
            if self.outcomes.pop().is_some() {
                self.outcomes_left_out += 1;
                continue;
            }
            let unnamed: Vec<usize> = (0..self.identifiers.len())
                .filter(|&i| !named(&self.identifiers[i]))
                .collect();
            if !unnamed.is_empty() {
                for &i in unnamed.iter().take(unnamed.len().div_ceil(8)).rev() {
                    self.identifiers.remove(i);
                    self.identifiers_left_out += 1;
                }
            } else if let Some(i) = self.instructions.iter().position(|s| !quoted(s)) {
                self.instructions.remove(i);
            } else {
                break;
            }
        }
    }

    /// The ledger as the handoff's last section. Items `above` (the strategy's text)
    /// already quotes verbatim are not repeated.
    pub fn render(&self, above: &str) -> String {
        let mut out = format!("{HEADING}\n{INTRO}\n");
        let above_lower = above.to_lowercase();
        let instructions: Vec<&String> = self
            .instructions
            .iter()
            .filter(|text| !above.contains(text.as_str()))
            .collect();
        if !self.instructions.is_empty() {
            out.push_str("\n### The user's messages, oldest first\n");
            let quoted = self.instructions.len() - instructions.len();
            for text in instructions {
                out.push_str("- ");
                out.push_str(&text.replace('\n', "\n  "));
                out.push('\n');
            }
            if quoted > 0 {
                out.push_str(&format!("({quoted} more quoted verbatim above)\n"));
            }
        }
        let identifiers: Vec<String> = self
            .identifiers
            .iter()
            .filter(|id| !above_lower.contains(id.as_str()))
            .map(|id| format!("`{id}`"))
            .collect();
        if !identifiers.is_empty() || self.identifiers_left_out > 0 {
            out.push_str("\n### Identifiers the tools named\n");
            out.push_str(&identifiers.join(", "));
            out.push('\n');
            if self.identifiers_left_out > 0 {
                out.push_str(&format!(
                    "({} older identifiers left out for space)\n",
                    self.identifiers_left_out
                ));
            }
        }
        if !self.outcomes.is_empty() || self.outcomes_left_out > 0 {
            out.push_str("\n### Tool calls and outcomes, newest first\n");
            for line in &self.outcomes {
                out.push_str("- ");
                out.push_str(line);
                out.push('\n');
            }
            if self.outcomes_left_out > 0 {
                out.push_str(&format!(
                    "({} older tool calls left out for space)\n",
                    self.outcomes_left_out
                ));
            }
        }
        out
    }
}

/// `text` without the ledger a previous compaction appended: what the strategy wrote.
pub fn strip(text: &str) -> &str {
    match text.rfind(&format!("\n\n{HEADING}\n")) {
        Some(at) => &text[..at],
        None if text.starts_with(HEADING) => "",
        None => text,
    }
}

/// `text` cut to `chars` characters, head and tail, the omitted count marked.
fn shorten(text: &str, chars: usize) -> String {
    let head = chars * 2 / 3;
    cap_head_tail(text, head, chars - head)
}

/// One line per kept piece of `text`, shortened.
fn one_line(text: &str) -> String {
    let line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let head = OUTCOME_PART_CHARS * 2 / 3;
    cap_head_tail(&line, head, OUTCOME_PART_CHARS - head).replace('\n', " ")
}

/// `name(arguments) → first line … last line` of the result.
fn outcome_line(name: &str, arguments: &str, result: Option<&str>) -> String {
    let call = format!("{name}({})", one_line(arguments));
    let Some(result) = result else {
        return format!("{call} → no result in the span");
    };
    let lines: Vec<&str> = result
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    match lines.as_slice() {
        [] => format!("{call} → (empty result)"),
        [only] => format!("{call} → {}", one_line(only)),
        [first, .., last] => format!(
            "{call} → {} … {} ({} lines)",
            one_line(first),
            one_line(last),
            lines.len()
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Chars;
    impl TokenCounter for Chars {
        fn count_text(&self, text: &str) -> u64 {
            text.chars().count() as u64 / 4 + 1
        }
        fn count_message(&self, message: &Value) -> u64 {
            self.count_text(&message.to_string())
        }
    }

    fn call(id: &str, path: &str, result: &str) -> Unit {
        Unit {
            messages: vec![
                json!({"role": "assistant", "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\":\"{path}\"}}")}}]}),
                json!({"role": "tool", "tool_call_id": id, "content": result}),
            ],
        }
    }

    fn user(text: &str) -> Unit {
        Unit {
            messages: vec![json!({"role": "user", "content": text})],
        }
    }

    fn heavy_span() -> Vec<Unit> {
        let mut history = vec![user(
            "Keep every answer under 100 words and never touch vendor/.",
        )];
        for i in 0..40 {
            history.push(call(
                &format!("call_{i}"),
                &format!("src/mod{i}.rs"),
                &format!(
                    "fn f{i}() {{}}\n{}\nTOTAL-{i:03} lines",
                    "body line\n".repeat(50)
                ),
            ));
        }
        history.push(user("Now rename ORDER-7781 to ORDER-7782."));
        history
    }

    #[test]
    fn a_tool_heavy_span_keeps_every_instruction_and_identifier_and_drops_old_outcomes() {
        let history = heavy_span();
        let mut ledger = Ledger::build(None, &history);
        assert_eq!(ledger.outcomes.len(), 40);
        ledger.fit(900, &Chars, "");
        let text = ledger.render("");
        assert!(
            Chars.count_text(&text) <= 900,
            "{}",
            Chars.count_text(&text)
        );
        assert!(text.contains("Keep every answer under 100 words and never touch vendor/."));
        assert!(text.contains("Now rename ORDER-7781 to ORDER-7782."));
        for i in 0..40 {
            assert!(text.contains(&format!("`src/mod{i}.rs`")), "src/mod{i}.rs");
            assert!(text.contains(&format!("`total-{i:03}`")), "TOTAL-{i:03}");
        }
        assert!(
            ledger.outcomes_left_out > 0,
            "the share forces outcomes out"
        );
        assert!(ledger.outcomes[0].contains("src/mod39.rs"), "newest first");
        let kept = ledger.outcomes.len();
        assert!(
            ledger.outcomes.iter().all(|l| {
                let n: usize = l
                    .split("mod")
                    .nth(1)
                    .and_then(|r| r.split('.').next())
                    .and_then(|n| n.parse().ok())
                    .unwrap_or(0);
                n >= 40 - kept
            }),
            "the oldest outcomes went first: {:?}",
            ledger.outcomes
        );
        assert!(text.contains(&format!(
            "({} older tool calls left out for space)",
            ledger.outcomes_left_out
        )));
    }

    #[test]
    fn a_tight_share_shortens_messages_then_drops_the_oldest_identifiers() {
        let mut history = heavy_span();
        history.insert(
            0,
            user(&format!("{} END-OF-BRIEF", "Long brief. ".repeat(800))),
        );
        let mut ledger = Ledger::build(None, &history);
        ledger.fit(400, &Chars, "");
        let text = ledger.render("");
        assert!(
            Chars.count_text(&text) <= 400,
            "{}",
            Chars.count_text(&text)
        );
        assert!(ledger.outcomes.is_empty());
        assert!(text.contains("characters omitted by handoff"));
        assert!(
            text.contains("END-OF-BRIEF"),
            "the tail of a shortened message stays"
        );
        assert!(ledger.identifiers_left_out > 0);
        assert!(text.contains("`total-039`"), "the newest identifiers stay");
    }

    #[test]
    fn a_second_compaction_carries_the_first_ledger_forward() {
        let first = Ledger::build(
            None,
            &[user("Use port 8443."), call("a", "old.txt", "OLD-001")],
        );
        let second = Ledger::build(
            Some(&first),
            &[user("Now the new one."), call("b", "new.txt", "NEW-002")],
        );
        assert_eq!(second.instructions, ["Use port 8443.", "Now the new one."]);
        assert!(second.outcomes[0].contains("new.txt") && second.outcomes[1].contains("old.txt"));
        assert!(second.identifiers.contains(&"old-001".to_owned()));
        assert!(second.identifiers.contains(&"new-002".to_owned()));
    }

    #[test]
    fn what_the_strategy_quoted_is_not_repeated_and_strip_finds_the_strategys_text() {
        let ledger = Ledger::build(
            None,
            &[user("Use port 8443."), call("a", "old.txt", "OLD-001")],
        );
        let above = "# Summary\nThe user said: Use port 8443. Read old.txt.";
        let text = format!("{above}\n\n{}", ledger.render(above));
        assert!(text.contains("(1 more quoted verbatim above)"));
        assert!(!text.contains("`old.txt`"));
        assert!(text.contains("`old-001`"));
        assert_eq!(strip(&text), above);
        assert_eq!(strip(above), above);
    }
}
