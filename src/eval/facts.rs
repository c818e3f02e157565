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

use super::Recall;

/// Recall of the compacted facts of each class.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ClassRecall {
    /// Identifiers in the user's messages: the instructions and constraints.
    pub user: Recall,
    /// Identifiers in tool calls' arguments.
    pub identifiers: Recall,
    /// Identifiers in tool results: the outcomes.
    pub outcomes: Recall,
}

impl ClassRecall {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &ClassRecall) {
        for (mine, theirs) in [
            (&mut self.user, &other.user),
            (&mut self.identifiers, &other.identifiers),
            (&mut self.outcomes, &other.outcomes),
        ] {
            *mine = Recall::of(mine.matches + theirs.matches, mine.kept + theirs.kept);
        }
    }
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
pub fn compacted_recall(messages: &[Value], verbatim: &str, handoff: &str) -> ClassRecall {
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
pub fn strings_of(value: &Value, out: &mut String) {
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
