//! Choosing the cut: the newest units that fit `keep_recent` stay verbatim, the rest is
//! history. The cut always falls on a unit boundary.

use super::unit::UnitSpan;
use crate::dialect::{Message, Role};

/// The first message of the recent part, or `None` when there is nothing to compact
/// (a single unit). `unit_tokens[i]` is the size of `units[i]`.
///
/// The last unit is always kept. The recent part prefers to start at a user message:
/// when the kept units start with an assistant turn, the cut moves forward to the next
/// user message if there is one. A start the dialect refuses (`allowed`) moves the cut
/// to the nearest allowed one: back (keeping more) first, then forward.
pub(crate) fn split_at_unit_boundary(
    messages: &[Message],
    units: &[UnitSpan],
    unit_tokens: &[u64],
    keep_tokens: u64,
    allowed: impl Fn(usize) -> bool,
) -> Option<usize> {
    let last = units.len().checked_sub(1)?;
    if last == 0 {
        return None;
    }
    let mut first_kept = last;
    let mut kept = unit_tokens[last];
    while first_kept > 1 && kept + unit_tokens[first_kept - 1] <= keep_tokens {
        first_kept -= 1;
        kept += unit_tokens[first_kept];
    }
    if messages[units[first_kept].start].role != Role::User {
        if let Some(user) =
            (first_kept + 1..=last).find(|&u| messages[units[u].start].role == Role::User)
        {
            first_kept = user;
        }
    }
    // The nearest allowed start: keeping more first (it still fits the budget's
    // intent), then keeping less; unit 0 is never kept whole, the last always is.
    let chosen = (1..=first_kept)
        .rev()
        .find(|&u| allowed(units[u].start))
        .or_else(|| (first_kept + 1..=last).find(|&u| allowed(units[u].start)))?;
    Some(units[chosen].start)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compaction::unit::split_into_units;
    use crate::dialect::ChatRequest;
    use serde_json::json;

    fn messages(values: serde_json::Value) -> Vec<Message> {
        ChatRequest::parse(json!({"messages": values}).to_string().as_bytes())
            .unwrap()
            .messages
    }

    fn agent_turns(n: usize) -> Vec<Message> {
        let mut values = Vec::new();
        for i in 0..n {
            values.push(json!({"role": "user", "content": format!("q{i}")}));
            values.push(json!({"role": "assistant", "tool_calls": [{"id": format!("c{i}"), "type": "function", "function": {"name": "f", "arguments": "{}"}}]}));
            values.push(json!({"role": "tool", "tool_call_id": format!("c{i}"), "content": "r"}));
            values.push(json!({"role": "assistant", "content": "a"}));
        }
        // Requests end with the user's (or a tool's) turn.
        values.push(json!({"role": "user", "content": "next"}));
        messages(json!(values))
    }

    #[test]
    fn a_cut_never_breaks_a_unit_whatever_the_budget() {
        let m = agent_turns(6);
        let units = split_into_units(&m);
        let starts: Vec<usize> = units.iter().map(|u| u.start).collect();
        let tokens = vec![10; units.len()];
        for keep in 0..300 {
            let cut = split_at_unit_boundary(&m, &units, &tokens, keep, |_| true).unwrap();
            assert!(starts.contains(&cut), "cut {cut} is inside a unit");
            assert!(cut > 0 && cut < m.len());
            assert_eq!(
                m[cut].role,
                Role::User,
                "keep={keep}: recent should start at a user message"
            );
        }
    }

    #[test]
    fn keeps_the_newest_units_within_budget_and_always_the_last() {
        let m = agent_turns(3);
        let units = split_into_units(&m);
        let tokens = vec![10; units.len()];
        // 10 units of 10 tokens: 40 keeps the last turn (3 units) and the final user message.
        let cut = split_at_unit_boundary(&m, &units, &tokens, 40, |_| true).unwrap();
        assert_eq!(cut, 8, "q2 onward fits in 40 tokens");
        // 30 would start at q2's tool call: the cut moves forward to the next user message.
        let cut = split_at_unit_boundary(&m, &units, &tokens, 30, |_| true).unwrap();
        assert_eq!(cut, 12);
        let cut = split_at_unit_boundary(&m, &units, &tokens, 0, |_| true).unwrap();
        assert_eq!(
            cut,
            units.last().unwrap().start,
            "the last unit is always kept"
        );
        assert_eq!(
            split_at_unit_boundary(&m[..1], &units[..1], &tokens[..1], 0, |_| true),
            None
        );
    }

    #[test]
    fn a_refused_start_moves_the_cut_back() {
        let m = agent_turns(3);
        let units = split_into_units(&m);
        let tokens = vec![10; units.len()];
        let free = split_at_unit_boundary(&m, &units, &tokens, 0, |_| true).unwrap();
        let moved = split_at_unit_boundary(&m, &units, &tokens, 0, |at| at < free).unwrap();
        assert!(moved < free && moved > 0, "{moved} vs {free}");
        // Nothing allowed before: the cut moves forward instead, keeping less.
        let keep_all = split_at_unit_boundary(&m, &units, &tokens, 1000, |_| true).unwrap();
        let forward =
            split_at_unit_boundary(&m, &units, &tokens, 1000, |at| at > keep_all).unwrap();
        assert!(forward > keep_all, "{forward} vs {keep_all}");
        assert_eq!(
            split_at_unit_boundary(&m, &units, &tokens, 0, |_| false),
            None
        );
    }
}
