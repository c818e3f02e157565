//! The ledger: the exact facts of every compacted span, appended by handoff to each
//! handoff whatever strategy wrote it, so no model can lose them. A model's text
//! carries the narrative; the ledger carries the user's instructions verbatim, the
//! identifiers the tool calls and results named, and each call's outcome.
//!
//! It is deterministic and bounded: it gets `compaction.ledger_share` of the handoff
//! budget and is built before the strategy runs, which gets what the ledger leaves.
//! Over its share it drops the oldest tool outcomes first, then the oldest
//! identifiers, and user text last: the share grows, as far as the view's room under
//! the trigger allows, before a user message is shortened (head and tail, marked),
//! and it says how much it left out. The record keeps it structured, so the next compaction carries
//! it forward without parsing text.

use handoff_plugin_api::{
    cap_head_tail, content_text, identifiers, tool_calls, TokenCounter, Unit,
};
use serde_json::Value;

pub(super) use crate::base::ledger::Ledger;

/// The ledger's heading; it opens the last section of every handoff that has one.
pub(super) const HEADING: &str = "## Ledger (exact, kept by handoff)";

/// What the ledger's heading is followed by.
const INTRO: &str = "Facts of the compacted messages, copied by handoff, not written by a model.";

/// The ledger's three lists' headings.
const INSTRUCTIONS: &str = "### The user's messages, oldest first";
const IDENTIFIERS: &str = "### Identifiers the tools named";
const OUTCOMES: &str = "### Tool calls and outcomes, newest first";

/// Characters of one user message kept before the share forces fewer.
const INSTRUCTION_CHARS: usize = 2000;
/// Fewest characters a user message is shortened to.
const INSTRUCTION_FLOOR: usize = 240;
/// Characters of a call's arguments, and of each kept line of its result.
const OUTCOME_PART_CHARS: usize = 160;
/// Longest identifier kept.
const IDENTIFIER_CHARS: usize = 120;

/// What compaction does with a [`Ledger`]: build it from compacted units, fit it to its
/// share, render it. The ledger itself is vocabulary (`handoff_base`); its making is
/// compaction's, so these live here, as a trait.
pub(crate) trait LedgerWork {
    /// The ledger of `history` after `previous`'s, whole.
    fn build(previous: Option<&Ledger>, history: &[Unit]) -> Ledger
    where
        Self: Sized;

    /// Tokens the ledger takes after `above` with every user message it does not quote
    /// whole, and nothing else: what it needs before any user text is cut.
    fn instructions_tokens(&self, tokens: &dyn TokenCounter, above: &str) -> u64;

    /// True when there is nothing to list.
    fn is_empty(&self) -> bool;

    /// Cuts the ledger to `limit` tokens of its rendering after `above` (the text it
    /// is appended to; what that quotes costs nothing): the oldest outcomes first, then
    /// the oldest identifiers, and the user's messages shortened only when they alone
    /// are over the limit.
    ///
    /// The plan is made from each item's own count, and outcomes and identifiers are
    /// counted newest first only while they could still fit: a long span's ledger is
    /// many times its share, and its older items go whatever they cost. The rendering
    /// then settles how many go, in a few counts of the kept ledger. (Counting every
    /// item, and the whole ledger again after each drop, was most of a 200k-token
    /// compaction.)
    fn fit(&mut self, limit: u64, tokens: &dyn TokenCounter, above: &str);

    /// The ledger as the handoff's last section. Items `above` (the strategy's text)
    /// already quotes verbatim are not repeated.
    fn render(&self, above: &str) -> String;
}

impl LedgerWork for Ledger {
    fn build(previous: Option<&Ledger>, history: &[Unit]) -> Ledger {
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

    fn instructions_tokens(&self, tokens: &dyn TokenCounter, above: &str) -> u64 {
        let only = Ledger {
            instructions: self.instructions.clone(),
            ..Ledger::default()
        };
        tokens.count_text(&only.render(above))
    }

    fn is_empty(&self) -> bool {
        self.instructions.is_empty() && self.identifiers.is_empty() && self.outcomes.is_empty()
    }

    fn fit(&mut self, limit: u64, tokens: &dyn TokenCounter, above: &str) {
        let above_lower = above.to_lowercase();
        let quoted: Vec<bool> = (self.instructions.iter())
            .map(|text| !above.is_empty() && above.contains(text.as_str()))
            .collect();
        let named: Vec<bool> = (self.identifiers.iter())
            .map(|id| !above.is_empty() && above_lower.contains(id.as_str()))
            .collect();
        let fixed = tokens.count_text(&format!("{HEADING}\n{INTRO}\n"))
            + tokens.count_text(&format!("\n{INSTRUCTIONS}\n"))
            + tokens.count_text(&format!("\n{IDENTIFIERS}\n"))
            + tokens.count_text(&format!("\n{OUTCOMES}\n"))
            + 16;
        let instruction_costs = |texts: &[String]| -> u64 {
            (texts.iter().zip(&quoted))
                .filter(|(_, quoted)| !**quoted)
                .map(|(text, _)| tokens.count_text(&bullet(text)))
                .sum()
        };
        let mut instructions = instruction_costs(&self.instructions);
        let (mut identifier_costs, identifiers) = newest_within(
            self.identifiers.iter().zip(&named).rev(),
            |(id, named)| (!**named).then(|| tokens.count_text(&identifier_item(id))),
            limit.saturating_sub(fixed),
        );
        identifier_costs.reverse();
        let (outcome_costs, _) = newest_within(
            self.outcomes.iter(),
            |line| Some(tokens.count_text(&bullet(line))),
            limit.saturating_sub(fixed + instructions + identifiers),
        );
        let outcome_costs: Vec<u64> = outcome_costs.into_iter().map_while(|c| c).collect();
        let outcomes: u64 = outcome_costs.iter().sum();
        // User text goes last: shortened only when it alone is over the limit.
        let room = limit.saturating_sub(fixed);
        let unquoted = quoted.iter().filter(|quoted| !**quoted).count();
        if instructions > room && unquoted > 0 {
            // Each message gets an even part of the room, in characters at the
            // counter's own rate.
            let chars: usize = (self.instructions.iter().zip(&quoted))
                .filter(|(_, quoted)| !**quoted)
                .map(|(text, _)| text.chars().count())
                .sum();
            let rate = chars as f64 / instructions.max(1) as f64;
            let each = ((room as f64 * rate) as usize / unquoted).max(INSTRUCTION_FLOOR);
            for (text, _) in (self.instructions.iter_mut().zip(&quoted)).filter(|(_, q)| !**q) {
                *text = shorten(text, each);
            }
            instructions = instruction_costs(&self.instructions);
        }
        // The newest identifiers that fit the room left stay; the older ones go.
        let mut room = limit.saturating_sub(fixed + instructions + outcomes);
        let mut identifiers_dropped = 0;
        for (cost, named) in identifier_costs.iter().zip(&named).rev() {
            match cost {
                _ if *named => {}
                Some(cost) if *cost <= room && identifiers_dropped == 0 => room -= cost,
                _ => identifiers_dropped += 1,
            }
        }
        let order = DropOrder {
            outcomes: self.outcomes.len(),
            identifiers: (0..named.len()).filter(|&i| !named[i]).collect(),
            instructions: (0..quoted.len()).filter(|&i| !quoted[i]).collect(),
        };
        let planned = self.outcomes.len() - outcome_costs.len() + identifiers_dropped;
        let (sum, priced) = (outcome_costs.iter())
            .chain(identifier_costs.iter().flatten())
            .fold((0, 0), |(sum, n), cost| (sum + cost, n + 1));
        let per_item = (sum / priced.max(1)).max(1);
        let count =
            |dropped: usize| tokens.count_text(&without(self, &order, dropped).render(above));
        let dropped = settle(planned, order.len(), per_item, limit, count);
        *self = without(self, &order, dropped);
    }

    fn render(&self, above: &str) -> String {
        let mut out = format!("{HEADING}\n{INTRO}\n");
        let above_lower = above.to_lowercase();
        let instructions: Vec<&String> = self
            .instructions
            .iter()
            .filter(|text| !above.contains(text.as_str()))
            .collect();
        if !self.instructions.is_empty() {
            out.push_str(&format!("\n{INSTRUCTIONS}\n"));
            let quoted = self.instructions.len() - instructions.len();
            for text in instructions {
                out.push_str(&bullet(text));
            }
            if quoted > 0 {
                out.push_str(&format!("({quoted} more quoted verbatim above)\n"));
            }
        }
        let identifiers: String = self
            .identifiers
            .iter()
            .filter(|id| !above_lower.contains(id.as_str()))
            .map(|id| identifier_item(id))
            .collect();
        if !identifiers.is_empty() || self.identifiers_left_out > 0 {
            out.push_str(&format!("\n{IDENTIFIERS}\n"));
            out.push_str(identifiers.strip_suffix(", ").unwrap_or(&identifiers));
            out.push('\n');
            if self.identifiers_left_out > 0 {
                out.push_str(&format!(
                    "({} older identifiers left out for space)\n",
                    self.identifiers_left_out
                ));
            }
        }
        if !self.outcomes.is_empty() || self.outcomes_left_out > 0 {
            out.push_str(&format!("\n{OUTCOMES}\n"));
            for line in &self.outcomes {
                out.push_str(&bullet(line));
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

/// The ledger without the first `dropped` items of `order`, the left-out counts
/// raised for them.
fn without(ledger: &Ledger, order: &DropOrder, dropped: usize) -> Ledger {
    let outcomes = dropped.min(order.outcomes);
    let identifiers = (dropped - outcomes).min(order.identifiers.len());
    let instructions = dropped - outcomes - identifiers;
    let gone = |indices: &[usize], n: usize| -> std::collections::HashSet<usize> {
        indices[..n.min(indices.len())].iter().copied().collect()
    };
    let (gone_ids, gone_instructions) = (
        gone(&order.identifiers, identifiers),
        gone(&order.instructions, instructions),
    );
    let keep = |gone: &std::collections::HashSet<usize>, items: &[String]| -> Vec<String> {
        (items.iter().enumerate())
            .filter(|(i, _)| !gone.contains(i))
            .map(|(_, item)| item.clone())
            .collect()
    };
    Ledger {
        instructions: keep(&gone_instructions, &ledger.instructions),
        identifiers: keep(&gone_ids, &ledger.identifiers),
        outcomes: ledger.outcomes[..ledger.outcomes.len() - outcomes].to_vec(),
        outcomes_left_out: ledger.outcomes_left_out + outcomes as u64,
        identifiers_left_out: ledger.identifiers_left_out + identifiers as u64,
    }
}

/// The items a fitted ledger drops, in the order they go: the oldest outcomes first
/// (`outcomes` of them, from the end), then the identifiers the text above does not
/// name, then the user's messages it does not quote, each oldest first (by index).
struct DropOrder {
    outcomes: usize,
    identifiers: Vec<usize>,
    instructions: Vec<usize>,
}

impl DropOrder {
    fn len(&self) -> usize {
        self.outcomes + self.identifiers.len() + self.instructions.len()
    }
}

/// How many of `all` items to drop for `count(dropped)` to be within `limit`: the
/// fewest, to within `limit / 200` tokens, or `all` when nothing fits. `count` falls
/// as more are dropped, near linearly, so each guess goes where the last two counts'
/// line crosses the limit (`per_item` tokens an item before there are two), kept
/// inside what is known to fit and what is known not to. A plan that is off by
/// hundreds of items settles in three or four counts.
fn settle(
    planned: usize,
    all: usize,
    per_item: u64,
    limit: u64,
    count: impl Fn(usize) -> u64,
) -> usize {
    let tolerance = (limit / 200).max(1);
    // The most dropped known not to fit, and the fewest known to fit.
    let mut over: Option<usize> = None;
    let mut fits: Option<usize> = None;
    let mut last: Option<(usize, u64)> = None;
    let mut at = planned.min(all);
    for _ in 0..24 {
        let tokens = count(at);
        if tokens <= limit {
            fits = Some(at);
            if limit - tokens <= tolerance || at == 0 {
                return at;
            }
        } else {
            over = Some(at);
            if at == all {
                return all;
            }
        }
        let slope = match last {
            Some((k, c)) if k != at => (c as f64 - tokens as f64) / (at as f64 - k as f64),
            _ => per_item as f64,
        }
        .max(0.5);
        last = Some((at, tokens));
        let low = over.map_or(0, |o| o + 1);
        let high = fits.map_or(all, |f| f.saturating_sub(1));
        if low > high {
            break;
        }
        let guess = at as f64 + (tokens as f64 - limit as f64) / slope;
        at = (guess.ceil().max(0.0) as usize).clamp(low, high);
    }
    fits.unwrap_or(all)
}

/// The costs of `items`, newest first, counted by `cost` (`None`: free) while their
/// sum stays within `cap`, and that sum. The first item past `cap` and every older one
/// get `None` and are not counted; the sum is then `cap + 1`, a floor of the true one.
fn newest_within<T>(
    items: impl ExactSizeIterator<Item = T>,
    cost: impl Fn(&T) -> Option<u64>,
    cap: u64,
) -> (Vec<Option<u64>>, u64) {
    let mut costs = Vec::with_capacity(items.len());
    let mut sum = 0;
    for item in items {
        if sum > cap {
            costs.push(None);
            continue;
        }
        let priced = cost(&item);
        match priced {
            Some(c) if sum + c > cap => {
                sum = cap + 1;
                costs.push(None);
            }
            _ => {
                sum += priced.unwrap_or(0);
                costs.push(priced);
            }
        }
    }
    (costs, sum)
}

/// A list item of the rendering: `- text`, its later lines indented under it.
fn bullet(text: &str) -> String {
    format!("- {}\n", text.replace('\n', "\n  "))
}

/// An identifier as the rendering lists it, its separator included.
fn identifier_item(id: &str) -> String {
    format!("`{id}`, ")
}

/// `text` without the ledger a previous compaction appended: what the strategy wrote.
pub(super) fn strip(text: &str) -> &str {
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
    use std::sync::atomic::Ordering;

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
    fn a_tight_share_drops_identifiers_before_it_shortens_user_text() {
        let mut ledger = Ledger::build(None, &heavy_span());
        let whole = ledger.instructions_tokens(&Chars, "");
        ledger.fit(whole + 10, &Chars, "");
        let text = ledger.render("");
        assert!(!text.contains("characters omitted by handoff"), "{text}");
        assert!(ledger.outcomes.is_empty());
        assert!(ledger.identifiers.len() <= 1, "{text}");
        assert!(ledger.identifiers_left_out > 0);
    }

    #[test]
    fn user_text_alone_over_the_share_is_shortened_and_nothing_else_stays() {
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
        assert!(
            ledger.identifiers_left_out > 0,
            "identifiers go first: {text}"
        );
    }

    /// Words and punctuation marks: a counter for which a joined text costs more than
    /// its parts counted bare, as with a real tokenizer's separators.
    struct Pieces {
        /// How many times a rendering was counted.
        wholes: std::sync::atomic::AtomicUsize,
    }
    impl TokenCounter for Pieces {
        fn count_text(&self, text: &str) -> u64 {
            if text.starts_with(HEADING) {
                self.wholes.fetch_add(1, Ordering::Relaxed);
            }
            let words = text
                .split(|c: char| !c.is_alphanumeric())
                .filter(|w| !w.is_empty())
                .count();
            let marks = text
                .chars()
                .filter(|c| !c.is_alphanumeric() && !c.is_whitespace())
                .count();
            (words + marks) as u64
        }
        fn count_message(&self, message: &Value) -> u64 {
            self.count_text(&message.to_string())
        }
    }

    #[test]
    fn a_long_span_is_fitted_tightly_in_a_few_counts() {
        let history: Vec<Unit> = (0..400)
            .map(|i| {
                call(
                    &format!("call_{i}"),
                    &format!("src/area{}/mod{i}.rs", i % 7),
                    &format!("ERR-{i:04} at line {i}\nok\nDONE-{i:04}"),
                )
            })
            .collect();
        let whole = Ledger::build(None, &history);
        let counter = Pieces {
            wholes: Default::default(),
        };
        let full = counter.count_text(&whole.render(""));
        for limit in [full * 3 / 4, full / 2, full / 5] {
            counter.wholes.store(0, Ordering::Relaxed);
            let mut ledger = whole.clone();
            ledger.fit(limit, &counter, "");
            let counted = counter.wholes.load(Ordering::Relaxed);
            let text = ledger.render("");
            assert!(
                counter.count_text(&text) <= limit,
                "{} > {limit}",
                counter.count_text(&text)
            );
            assert!(
                counted <= 8,
                "the ledger was counted {counted} times to fit {limit} of {full}"
            );
            assert!(ledger.outcomes_left_out > 0);
            assert!(
                counter.count_text(&text) * 100 >= limit * 97,
                "fitting {limit} left only {}: it dropped too much",
                counter.count_text(&text)
            );
        }
    }

    #[test]
    fn settling_finds_the_fewest_drops_that_fit_in_a_few_counts() {
        let calls = std::cell::Cell::new(0);
        let linear = |dropped: usize| {
            calls.set(calls.get() + 1);
            1000u64.saturating_sub(7 * dropped as u64)
        };
        // 1000 − 7k ≤ 500 first at k = 72, whatever the plan and the first slope.
        for (planned, per_item) in [(0, 1), (10, 3), (72, 7), (100, 20), (140, 1)] {
            calls.set(0);
            assert_eq!(
                settle(planned, 140, per_item, 500, linear),
                72,
                "from {planned}"
            );
            assert!(calls.get() <= 6, "{} counts from {planned}", calls.get());
        }
        assert_eq!(settle(5, 9, 3, 500, |_| 1000), 9, "nothing fits: all go");
        assert_eq!(settle(5, 9, 3, 500, |_| 100), 0, "everything fits: none go");
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
