//! `audit verify`: every line parses, every digest matches its message, every parent
//! exists before its child, and no original is logged twice.

use std::collections::HashSet;

use serde_json::Value;

use crate::base::digest::{message_digest, next_prefix};
use crate::base::line::Entry;
use crate::store::{ConversationLog, LineProblem};

/// The problems of one conversation's log, in line order.
pub fn verify_log(log: &ConversationLog) -> Vec<LineProblem> {
    let mut problems = log.problems.clone();
    let mut seen = HashSet::new();
    // Line numbers of good lines are not stored; count them back from the file order.
    let mut numbers = line_numbers(log);
    for line in &log.lines {
        let number = numbers.next().unwrap_or(0);
        let Entry::Message(message) = &line.entry else {
            continue;
        };
        let mut problem = |reason: String| {
            problems.push(LineProblem {
                line: number,
                reason,
            })
        };
        match serde_json::from_str::<Value>(message.message.get()) {
            Ok(value) if message_digest(&value) != message.message_digest => {
                problem("message does not match its message_digest".into())
            }
            Ok(_) => {}
            Err(err) => problem(format!("message is not JSON: {err}")),
        }
        if next_prefix(message.parent.as_ref(), &message.message_digest) != message.digest {
            problem(format!(
                "digest {} does not follow from its parent",
                message.digest.short(12)
            ));
        }
        if let Some(parent) = message.parent {
            if !seen.contains(&parent) {
                problem(format!(
                    "parent {} is not an earlier message",
                    parent.short(12)
                ));
            }
        }
        if !seen.insert(message.digest) {
            problem(format!(
                "message {} is logged twice",
                message.digest.short(12)
            ));
        }
    }
    // Every request can be rebuilt as the client sent it.
    let numbers: Vec<usize> = line_numbers(log).collect();
    let tree = super::Tree::new(log);
    let forms = super::Forms::read(log, &tree);
    for (index, reason) in &forms.problems {
        problems.push(LineProblem {
            line: numbers.get(*index).copied().unwrap_or(0),
            reason: reason.clone(),
        });
    }
    for problem in super::sent_requests(log, &tree, &forms)
        .into_iter()
        .filter_map(Result::err)
    {
        problems.push(LineProblem {
            line: numbers.get(problem.line).copied().unwrap_or(0),
            reason: format!(
                "request {} cannot be rebuilt: {}",
                problem.number, problem.reason
            ),
        });
    }
    problems.sort_by_key(|p| p.line);
    problems
}

/// The replies logged incomplete, as (file line, how they were cut).
pub fn incomplete_replies(log: &ConversationLog) -> Vec<(usize, String)> {
    log.lines
        .iter()
        .zip(line_numbers(log))
        .filter_map(|(line, number)| match &line.entry {
            Entry::Message(message) if message.complete == Some(false) => Some((
                number,
                message
                    .incomplete
                    .clone()
                    .unwrap_or_else(|| "unknown".into()),
            )),
            _ => None,
        })
        .collect()
}

/// The 1-based file line of each good line: as read, or, for a log that does not say
/// (a database's), every number not taken by a problem.
fn line_numbers(log: &ConversationLog) -> Box<dyn Iterator<Item = usize> + '_> {
    if log.file_lines.len() == log.lines.len() {
        return Box::new(log.file_lines.iter().copied());
    }
    let bad: HashSet<usize> = log.problems.iter().map(|p| p.line).collect();
    Box::new(
        (1..)
            .filter(move |n| !bad.contains(n))
            .take(log.lines.len()),
    )
}
