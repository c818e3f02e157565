//! The tool section of an extract handoff: one line per distinct call target with the
//! edges of its results, the salient ones (results a later message names again) kept
//! before the merely recent, and a repeated result said once.

use std::collections::{HashMap, HashSet};

use handoff_plugin_api::{content_text, identifiers, tool_calls as calls_of};
use serde_json::Value;

use crate::{cap, digest, named};

/// Characters of a tool call's arguments shown.
const ARGUMENTS_SHOWN: usize = 200;

/// Lines kept from the start and from the end of a tool result.
const RESULT_HEAD_LINES: usize = 1;
const RESULT_TAIL_LINES: usize = 1;

/// Characters kept of one kept line of a tool result.
const RESULT_LINE_CHARS: usize = 200;

/// Characters kept of a long JSON result's digest.
const DIGEST_CHARS: usize = 300;

/// Tokens kept for the note that names what left-out tool calls named.
const NOTE_TOKENS: u64 = 96;

/// Share of the section, in percent, that salient results may claim before recency
/// decides: the newest calls still keep theirs.
const SALIENT_SHARE: u64 = 50;

/// Results shorter than this are repeated rather than referred to.
const SAME_RESULT_CHARS: usize = 80;

/// The section's heading.
pub(crate) const HEADING: &str = "Tool calls and results (first and last lines, oldest first)";

/// One call target (a tool and its arguments, with its outcome) and its result: its
/// line, the kept lines of its result, and how many calls it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ToolEntry {
    /// `- name(arguments) -> outcome`, without the count of calls.
    pub call: String,
    /// The kept lines of its result, each `  | …` and newline-terminated (none for a
    /// call without a result).
    pub results: Vec<String>,
    /// Calls this entry stands for.
    pub calls: usize,
    /// True when a later message names an identifier of its results.
    pub salient: bool,
}

impl ToolEntry {
    /// The entry's call line as the handoff writes it.
    fn call_line(&self) -> String {
        match self.calls {
            0 | 1 => format!("{}\n", self.call),
            n => format!("{} ({n} calls)\n", self.call),
        }
    }

    /// The entry as a previous handoff wrote it: its call line and its result lines.
    pub(crate) fn read(call_line: &str, result: &str) -> ToolEntry {
        let line = call_line.trim_end();
        let (call, calls) = line
            .strip_suffix(" calls)")
            .and_then(|rest| rest.rsplit_once(" ("))
            .and_then(|(call, n)| Some((call, n.parse::<usize>().ok()?)))
            .unwrap_or((line, 1));
        ToolEntry {
            call: call.to_owned(),
            results: (!result.is_empty())
                .then(|| result.to_owned())
                .into_iter()
                .collect(),
            calls,
            salient: false,
        }
    }
}

/// Where each identifier is last named by the conversation's own words (user and
/// assistant text, and tool calls' arguments), by message index; the recent messages,
/// which come after all of `messages`, name at `usize::MAX`.
pub(crate) struct Mentions(HashMap<String, usize>);

impl Mentions {
    /// The mentions of `messages` and of the `recent` ones after them.
    pub(crate) fn of(messages: &[&Value], recent: &[Value]) -> Mentions {
        let mut last = HashMap::new();
        for (index, message) in messages.iter().enumerate() {
            if message["role"] == "tool" {
                continue;
            }
            for id in spoken(message) {
                last.insert(id, index);
            }
        }
        for message in recent {
            for id in spoken(message) {
                last.insert(id, usize::MAX);
            }
            // A recent tool result naming an older one's id carries it on.
            if message["role"] == "tool" {
                for id in identifiers(&content_text(message)) {
                    last.insert(id, usize::MAX);
                }
            }
        }
        Mentions(last)
    }

    /// True when a message after `index` names an identifier of `text`.
    fn after(&self, index: usize, text: &str) -> bool {
        identifiers(text)
            .iter()
            .any(|id| self.0.get(id).is_some_and(|at| *at > index))
    }
}

/// The identifiers a message states itself: its text and its calls' arguments.
fn spoken(message: &Value) -> Vec<String> {
    let mut ids = identifiers(&content_text(message));
    for (_, _, arguments) in calls_of(message) {
        ids.extend(identifiers(arguments));
    }
    ids
}

/// The previous handoff's entries, then every tool call of `messages`, a repeated call
/// with the same result merged at its newest, salience marked by `mentions`.
pub(crate) fn entries(
    previous: Vec<ToolEntry>,
    messages: &[&Value],
    mentions: &Mentions,
) -> Vec<ToolEntry> {
    let mut all: Vec<ToolEntry> = previous
        .into_iter()
        .map(|mut entry| {
            // Anything the new span says comes after a previous handoff's item.
            entry.salient = entry.results.iter().any(|r| mentions.after(0, r));
            entry
        })
        .collect();
    for (index, message) in messages.iter().enumerate() {
        for (id, name, arguments) in calls_of(message) {
            let found = messages[index + 1..]
                .iter()
                .enumerate()
                .find(|(_, m)| m["role"] == "tool" && m["tool_call_id"] == id)
                .map(|(at, m)| (index + 1 + at, content_text(m)));
            let outcome = match &found {
                None => "no result",
                Some((_, text)) if looks_like_error(text) => "error",
                Some(_) => "ok",
            };
            let salient = found
                .as_ref()
                .is_some_and(|(at, text)| mentions.after(*at, text));
            all.push(ToolEntry {
                call: format!("- {name}({}) -> {outcome}", cap(arguments, ARGUMENTS_SHOWN)),
                results: found
                    .map(|(_, text)| result_edges(&text))
                    .filter(|edges| !edges.is_empty())
                    .into_iter()
                    .collect(),
                calls: 1,
                salient,
            });
        }
    }
    merge_targets(all)
}

/// One entry per call target and result, at its newest call: a call repeated with the
/// same result (a status polled, a lock set twice) is one line with its count; a call
/// whose result changed stays a line of its own, each result a fact.
fn merge_targets(all: Vec<ToolEntry>) -> Vec<ToolEntry> {
    let key = |entry: &ToolEntry| (entry.call.clone(), entry.results.clone());
    let mut newest: HashMap<(String, Vec<String>), usize> = HashMap::new();
    for (at, entry) in all.iter().enumerate() {
        newest.insert(key(entry), at);
    }
    let mut merged: Vec<Option<ToolEntry>> = vec![None; all.len()];
    for entry in all.iter() {
        let Some(&at) = newest.get(&key(entry)) else {
            continue;
        };
        let into = merged[at].get_or_insert_with(|| ToolEntry {
            calls: 0,
            salient: false,
            ..entry.clone()
        });
        into.calls += entry.calls.max(1);
        into.salient |= entry.salient;
    }
    merged.into_iter().flatten().collect()
}

/// The tool section within `budget` tokens, counted by `count`: salient results first
/// (up to [`SALIENT_SHARE`]), then the newest calls, each with its results' edges while
/// they fit, then the bare call line, then nothing; with counts of what was left out
/// (`calls_left_before`: calls the previous handoff had already left out, and what
/// they named).
pub(crate) fn section(
    entries: &[ToolEntry],
    count: &dyn Fn(&str) -> u64,
    (calls_left_before, named_before): (usize, &[String]),
    budget: u64,
) -> String {
    if entries.is_empty() && calls_left_before == 0 {
        return String::new();
    }
    let rendered: Vec<(String, String)> = rendered_results(entries);
    let costs: Vec<(u64, u64)> = rendered
        .iter()
        .map(|(call, results)| (count(call), count(results)))
        .collect();
    let whole: u64 = costs.iter().map(|(call, results)| call + results).sum();
    // A note names what the calls left out named: room for it when some will be.
    let budget = if whole > budget {
        budget.saturating_sub(NOTE_TOKENS.min(budget / 8))
    } else {
        budget
    };
    // Salient results are paid for first, newest first, within their share.
    let mut spent = 0;
    let mut whole_kept: HashSet<usize> = HashSet::new();
    for (at, (entry, (call, results))) in entries.iter().zip(&costs).enumerate().rev() {
        if entry.salient && spent + call + results <= budget * SALIENT_SHARE / 100 {
            spent += call + results;
            whole_kept.insert(at);
        }
    }
    let mut kept: Vec<String> = Vec::new();
    let (mut results_left_out, mut calls_left_out) = (0, calls_left_before);
    let mut named_out: Vec<String> = Vec::new();
    for (at, ((call_line, results), (call, result_cost))) in
        rendered.iter().zip(&costs).enumerate().rev()
    {
        if whole_kept.contains(&at) {
            kept.push(format!("{call_line}{results}"));
        } else if spent + call + result_cost <= budget {
            spent += call + result_cost;
            kept.push(format!("{call_line}{results}"));
        } else if spent + call <= budget {
            spent += call;
            results_left_out += usize::from(!results.is_empty());
            kept.push(call_line.clone());
        } else {
            calls_left_out += entries[at].calls.max(1);
            named_out.extend(identifiers(call_line));
        }
    }
    kept.reverse();
    // Newest first: the calls left out most recently, then what earlier notes named.
    named_out.extend(named_before.iter().cloned());
    let mut out = format!("\n## {HEADING}\n");
    if calls_left_out > 0 {
        let names = if named_out.is_empty() {
            String::new()
        } else {
            format!("; they named: {}", named(&named_out))
        };
        out.push_str(&format!(
            "[{calls_left_out} earlier tool call(s) left out for space; the originals are kept in handoff's log{names}]\n"
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

/// Each entry's call line and result lines as written: a result a newer entry also
/// returned is referred to, not repeated.
fn rendered_results(entries: &[ToolEntry]) -> Vec<(String, String)> {
    let mut seen: HashSet<&str> = HashSet::new();
    let mut out: Vec<(String, String)> = entries
        .iter()
        .rev()
        .map(|entry| {
            let results: String = entry
                .results
                .iter()
                .map(|result| {
                    if result.chars().count() >= SAME_RESULT_CHARS && !seen.insert(result) {
                        "  | (the same result as a later call)\n".to_owned()
                    } else {
                        result.clone()
                    }
                })
                .collect();
            (entry.call_line(), results)
        })
        .collect();
    out.reverse();
    out
}

/// The first and last lines of a tool result, each capped, with what was left out
/// marked; a long JSON result as one line of its fields instead.
fn result_edges(text: &str) -> String {
    let quote = |line: &str| format!("  | {}\n", cap(line, RESULT_LINE_CHARS));
    if text.chars().count() > RESULT_LINE_CHARS {
        if let Some(fields) = digest::digest(text) {
            return format!("  | {}\n", cap(&fields, DIGEST_CHARS));
        }
    }
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
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

fn looks_like_error(text: &str) -> bool {
    let lower = text.trim_start().to_ascii_lowercase();
    lower.starts_with("error")
        || lower.starts_with("{\"error\"")
        || serde_json::from_str::<Value>(text)
            .is_ok_and(|v| v.get("error").is_some_and(|e| !e.is_null()))
}

/// Tokens of `entries` whole, as [`section`] would write them.
pub(crate) fn whole_tokens(entries: &[ToolEntry], count: &dyn Fn(&str) -> u64) -> u64 {
    rendered_results(entries)
        .iter()
        .map(|(call, results)| count(call) + count(results))
        .sum()
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn count(text: &str) -> u64 {
        (text.len() as u64).div_ceil(4)
    }

    fn call(id: &str, name: &str, arguments: &str, result: &str) -> [Value; 2] {
        [
            json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}]}),
            json!({"role": "tool", "tool_call_id": id, "content": result}),
        ]
    }

    fn entries_of(messages: &[Value], recent: &[Value]) -> Vec<ToolEntry> {
        let refs: Vec<&Value> = messages.iter().collect();
        entries(Vec::new(), &refs, &Mentions::of(&refs, recent))
    }

    #[test]
    fn a_call_repeated_with_the_same_result_is_one_line_and_a_changed_result_stays() {
        let messages: Vec<Value> = [
            call("a", "lock", "{}", "locked"),
            call("b", "status", "{}", "fuel 15.5"),
            call("c", "lock", "{}", "locked"),
            call("d", "status", "{}", "fuel 50.0"),
            call("e", "lock", "{}", "locked"),
        ]
        .concat();
        let entries = entries_of(&messages, &[]);
        let text = section(&entries, &count, (0, &[]), 10_000);
        assert_eq!(text.matches("- lock({}) -> ok").count(), 1, "{text}");
        assert!(
            text.contains("- lock({}) -> ok (3 calls)\n  | locked\n"),
            "{text}"
        );
        assert!(
            text.contains("fuel 15.5") && text.contains("fuel 50.0"),
            "{text}"
        );
        // At its newest call: after the second status.
        assert!(text.find("fuel 50.0") < text.find("(3 calls)"), "{text}");
        // The count survives a compaction: the line reads back.
        let read = ToolEntry::read("- lock({}) -> ok (3 calls)\n", "  | locked\n");
        assert_eq!((read.call.as_str(), read.calls), ("- lock({}) -> ok", 3));
    }

    #[test]
    fn a_result_a_later_message_names_keeps_its_lines_before_newer_ones() {
        let long = |tag: &str| format!("{tag} {}", "z".repeat(300));
        let mut messages: Vec<Value> = call("z", "zipcode", "{}", "zip 83214").to_vec();
        for n in 0..8 {
            messages.extend(call(
                &format!("n{n}"),
                "noise",
                &format!("{{\"n\": {n}}}"),
                &long("noise"),
            ));
        }
        // The zip code comes back in a call's arguments after the noise.
        let recent = [json!({"role": "assistant", "content": "distance from 83214"})];
        let entries = entries_of(&messages, &recent);
        assert!(entries[0].salient);
        assert!(!entries[1].salient);
        let text = section(&entries, &count, (0, &[]), 160);
        assert!(text.contains("zip 83214"), "{text}");
        // Without the mention, recency alone leaves it out.
        let text = section(&entries_of(&messages, &[]), &count, (0, &[]), 160);
        assert!(!text.contains("zip 83214"), "{text}");
    }

    #[test]
    fn a_long_result_another_call_returned_too_is_referred_to_not_repeated() {
        let booking = format!(
            "{{\"booking_id\": \"3426812\", \"history\": \"{}\"}}",
            "h".repeat(400)
        );
        let messages: Vec<Value> = [
            call("a", "book", "{\"to\": \"LAX\"}", &booking),
            call("b", "book", "{\"to\": \"HND\"}", &booking),
        ]
        .concat();
        let text = section(&entries_of(&messages, &[]), &count, (0, &[]), 10_000);
        assert_eq!(text.matches("3426812").count(), 1, "{text}");
        assert!(text.contains("(the same result as a later call)"), "{text}");
    }

    #[test]
    fn a_long_json_result_keeps_its_short_fields_between_long_ones() {
        let cities: Vec<String> = (0..300).map(|i| format!("City {i}")).collect();
        let result = json!({"cities": cities, "distance": 750.0, "status": "ok"}).to_string();
        let text = result_edges(&result);
        assert!(text.contains("\"distance\": 750.0"), "{text}");
        assert!(text.contains("\"status\": \"ok\""), "{text}");
        assert!(text.contains("[300 items:"), "{text}");
        let plain = format!("HEAD\n{}\nTAIL", "middle\n".repeat(40));
        assert_eq!(
            result_edges(&plain),
            "  | HEAD\n  | [... 40 lines omitted by handoff ...]\n  | TAIL\n"
        );
    }
}
