//! Recall of the *compacted* facts, by class: of the facts the conversation's last
//! request holds that its final view no longer carries verbatim, the share the
//! handoff kept. Facts are identifiers ([`handoff_plugin_api::identifiers`]: paths,
//! ids, numbers, quoted strings), classed by where they first appear: the user's
//! messages, the tool calls' arguments, the tool results. Facts still in the recent
//! messages say nothing of a strategy, so they are left out.

use std::collections::BTreeSet;

use handoff_plugin_api::{content_text, identifiers, tool_calls};
use serde::Serialize;
use serde_json::Value;

/// How many probe matches of the originals the final view keeps.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Recall {
    /// Distinct matches in the originals.
    pub matches: usize,
    /// Those still in the final view.
    pub kept: usize,
    /// `kept / matches`.
    pub share: f64,
    /// The probe's matches the final view lost, in order (the probe's recall only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<String>,
}

impl Recall {
    /// `kept` of `matches`; a share of 1 when there is nothing to keep.
    pub(crate) fn of(matches: usize, kept: usize) -> Self {
        Self {
            matches,
            kept,
            lost: Vec::new(),
            share: if matches == 0 {
                1.0
            } else {
                kept as f64 / matches as f64
            },
        }
    }
}

/// Recall of the compacted facts of each class.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ClassRecall {
    /// Identifiers in the user's messages: the instructions and constraints.
    pub user: Recall,
    /// Identifiers in tool calls' arguments.
    pub identifiers: Recall,
    /// Identifiers in tool results: the outcomes.
    pub outcomes: Recall,
}

impl ClassRecall {
    /// Adds `other`'s counts to these.
    pub(crate) fn add(&mut self, other: &ClassRecall) {
        for (mine, theirs) in [
            (&mut self.user, &other.user),
            (&mut self.identifiers, &other.identifiers),
            (&mut self.outcomes, &other.outcomes),
        ] {
            *mine = Recall::of(mine.matches + theirs.matches, mine.kept + theirs.kept);
        }
    }
}

/// A compacted fact the final view does not carry, and the compaction that lost it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub(crate) struct LostFact {
    /// The fact, lowercased as it is matched.
    pub fact: String,
    /// `user`, `identifiers` or `outcomes`.
    pub class: &'static str,
    /// The compaction (from 1, in order) whose handoff first went without it, after the
    /// fact was compacted.
    pub compaction: Option<usize>,
    /// True when an earlier handoff carried it: a later compaction dropped it.
    pub dropped: bool,
}

/// The compacted facts of `messages` that neither `verbatim` nor `last` (the final
/// view's handoff) holds, each with the compaction that lost it: `handoffs` are the
/// compactions' texts in order, with the number of live messages each one covers
/// (`end_exclusive`), and `pinned` the leading messages that are never compacted.
pub(crate) fn lost_facts(
    messages: &[Value],
    (verbatim, last): (&str, &str),
    handoffs: &[(usize, String)],
    pinned: usize,
) -> Vec<LostFact> {
    let verbatim = verbatim.to_lowercase();
    let last = last.to_lowercase();
    let handoffs: Vec<(usize, String)> = handoffs
        .iter()
        .map(|(covers, text)| (*covers, text.to_lowercase()))
        .collect();
    // Where each fact first appears, among the live messages.
    let mut first_seen = std::collections::HashMap::new();
    for (index, message) in messages.iter().enumerate().skip(pinned) {
        for fact in classes(std::slice::from_ref(message)).iter().flatten() {
            first_seen.entry(fact.clone()).or_insert(index - pinned);
        }
    }
    let mut lost = Vec::new();
    for (class, facts) in ["user", "identifiers", "outcomes"]
        .into_iter()
        .zip(classes(messages))
    {
        for fact in facts {
            if verbatim.contains(fact.as_str()) || last.contains(fact.as_str()) {
                continue;
            }
            let at = first_seen.get(&fact).copied().unwrap_or(0);
            let mut held = false;
            let mut lost_at = None;
            for (number, (covers, text)) in handoffs.iter().enumerate() {
                if *covers <= at {
                    continue;
                }
                if text.contains(fact.as_str()) {
                    held = true;
                } else {
                    lost_at = Some(number + 1);
                    break;
                }
            }
            lost.push(LostFact {
                fact,
                class,
                compaction: lost_at,
                dropped: held,
            });
        }
    }
    lost
}

/// The facts of `messages` (neutral form) by class, each fact in its first class.
fn classes(messages: &[Value]) -> [BTreeSet<String>; 3] {
    let mut user = BTreeSet::new();
    let mut arguments = BTreeSet::new();
    let mut results = BTreeSet::new();
    for message in messages {
        match message["role"].as_str() {
            Some("user") => user.extend(identifiers(&content_text(message))),
            Some("assistant") => {
                for (_, _, args) in tool_calls(message) {
                    arguments.extend(identifiers(args));
                }
            }
            Some("tool") => results.extend(identifiers(&content_text(message))),
            _ => {}
        }
    }
    arguments.retain(|f| !user.contains(f));
    results.retain(|f| !user.contains(f) && !arguments.contains(f));
    [user, arguments, results]
}

/// The recall of `messages`' facts that are not in `verbatim` (the final view without
/// its handoff) but are in `handoff`.
pub(crate) fn compacted_recall(messages: &[Value], verbatim: &str, handoff: &str) -> ClassRecall {
    let verbatim = verbatim.to_lowercase();
    let handoff = handoff.to_lowercase();
    let [user, identifiers, outcomes] = classes(messages).map(|facts| {
        let compacted: Vec<&String> = facts
            .iter()
            .filter(|f| !verbatim.contains(f.as_str()))
            .collect();
        let kept = compacted
            .iter()
            .filter(|f| handoff.contains(f.as_str()))
            .count();
        Recall::of(compacted.len(), kept)
    });
    ClassRecall {
        user,
        identifiers,
        outcomes,
    }
}

/// Every string of `value`, appended to `out` one per line: a message's text as a
/// reader sees it, without JSON escapes.
pub(crate) fn strings_of(value: &Value, out: &mut String) {
    match value {
        Value::String(text) => {
            out.push_str(text);
            out.push('\n');
        }
        Value::Array(items) => items.iter().for_each(|v| strings_of(v, out)),
        Value::Object(fields) => fields.values().for_each(|v| strings_of(v, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_lost_fact_names_the_compaction_that_lost_it() {
        let messages = [
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "user", "content": "keep ORD-1001 and ORD-2002"}),
            json!({"role": "user", "content": "and INV-3003"}),
            json!({"role": "user", "content": "now"}),
        ];
        let handoffs = [
            (1, "the user named ORD-1001 and ORD-2002".to_owned()),
            (2, "ORD-2002".to_owned()),
        ];
        let lost = lost_facts(&messages, ("now", &handoffs[1].1), &handoffs, 1);
        let named: Vec<(&str, Option<usize>, bool)> = lost
            .iter()
            .map(|l| (l.fact.as_str(), l.compaction, l.dropped))
            .collect();
        assert_eq!(
            named,
            [("inv-3003", Some(2), false), ("ord-1001", Some(2), true)],
            "INV-3003 never made a handoff; ORD-1001 was dropped by the second"
        );
    }

    #[test]
    fn only_compacted_facts_count_each_in_its_first_class() {
        let messages = [
            json!({"role": "user", "content": "Move report_q3.pdf into archive/2026 and keep ORD-1001."}),
            json!({"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "mv", "arguments": "{\"src\":\"report_q3.pdf\",\"dst\":\"archive/2026\"}"}}]}),
            json!({"role": "tool", "tool_call_id": "c1", "content": "moved; receipt RCPT-77 size 48213"}),
            json!({"role": "user", "content": "Now list tmp/new.txt"}),
        ];
        let verbatim = "Now list tmp/new.txt";
        let handoff = "The user moved report_q3.pdf; receipt RCPT-77.";
        let recall = compacted_recall(&messages, verbatim, handoff);
        // report_q3.pdf, archive/2026, ord-1001 (tmp/new.txt is verbatim).
        assert_eq!((recall.user.matches, recall.user.kept), (3, 1));
        assert_eq!(
            recall.identifiers.matches, 0,
            "the arguments repeat the user's"
        );
        assert_eq!((recall.outcomes.matches, recall.outcomes.kept), (2, 1));
    }
}
