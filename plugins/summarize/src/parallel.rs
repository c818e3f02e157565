//! Folding in parallel: the parts of a history too long for one request are summarised
//! at once, each on its own (at most `budgets.parallel_calls` at a time), and their
//! handoffs merged into one by a last call, in rounds when they do not all fit one.
//! A compaction then takes about two calls' time, not one per part. Every reply, the
//! merges' too, is validated like a single summary ([`crate::check`]).

use futures_util::stream::{self, StreamExt};
use handoff_plugin_api::{sum_usage, AttemptError, FailureReason, StrategyInput, Summary};
use serde_json::Value;

use crate::fold::Part;
use crate::Summarize;

/// What a fold's calls have cost so far: their usage and their count.
#[derive(Default)]
struct Spent {
    usages: Vec<Value>,
    calls: u32,
}

impl Spent {
    /// `err` with every call's usage and count so far added.
    fn fail(&self, err: AttemptError) -> AttemptError {
        let mut all: Vec<&Value> = self.usages.iter().collect();
        all.extend(err.usage.as_ref());
        let usage = sum_usage(all);
        AttemptError::new(err.reason, err.message)
            .with_usage(usage)
            .with_calls(self.calls)
    }
}

/// How many handoffs of `output` tokens one merge call holds beside `fixed` tokens of
/// prompt and frame and a previous handoff of `previous`, within `allowance`.
pub(crate) fn per_merge(allowance: u64, fixed: u64, previous: u64, output: u64) -> usize {
    let room = allowance.saturating_sub(fixed + previous);
    usize::try_from(room / output.max(1)).unwrap_or(usize::MAX)
}

/// Merge calls that fold `parts` handoffs into one, `per` to a call.
pub(crate) fn merge_calls(parts: usize, per: usize) -> usize {
    let (mut left, mut calls) = (parts, 0);
    while left > 1 && per >= 2 {
        let round = left.div_ceil(per);
        calls += round;
        left = round;
    }
    calls
}

/// Summarises `parts` at once and merges their handoffs, within `per` handoffs to a
/// merge call; the previous handoff goes into the first merge.
pub(crate) async fn fold(
    summarize: &Summarize,
    input: &StrategyInput,
    parts: Vec<Part>,
    per: usize,
) -> Result<Summary, AttemptError> {
    let count = parts.len();
    let total = count + merge_calls(count, per);
    let limit = usize::try_from(input.budgets.parallel_calls.max(1)).unwrap_or(1);
    let mut spent = Spent::default();
    let asks: Vec<String> = parts
        .iter()
        .enumerate()
        .map(|(index, part)| {
            crate::render::render_parallel_part(&part.history, part.recent.as_deref(), index, count)
        })
        .collect();
    let mut handoffs = calls(summarize, input, asks, limit, &mut spent, total).await?;
    let mut first_round = true;
    while handoffs.len() > 1 {
        if input.cancel.is_cancelled() {
            return Err(spent.fail(AttemptError::new(
                FailureReason::Cancelled,
                "compaction cancelled between summary calls",
            )));
        }
        let previous = first_round
            .then_some(input.previous_handoff.as_deref())
            .flatten();
        let asks: Vec<String> = handoffs
            .chunks(per.max(2))
            .enumerate()
            .map(|(batch, chunk)| {
                crate::render::render_merge(
                    previous.filter(|_| batch == 0),
                    chunk,
                    handoffs.len(),
                    batch * per.max(2),
                )
            })
            .collect();
        handoffs = calls(summarize, input, asks, limit, &mut spent, total).await?;
        first_round = false;
    }
    Ok(Summary {
        text: handoffs.pop().unwrap_or_default(),
        usage: sum_usage(&spent.usages),
        calls: Some(spent.calls),
    })
}

/// Makes one call per ask, at most `limit` at once, and returns their validated
/// handoffs in order; the first failure fails them all, with every call's usage.
async fn calls(
    summarize: &Summarize,
    input: &StrategyInput,
    asks: Vec<String>,
    limit: usize,
    spent: &mut Spent,
    total: usize,
) -> Result<Vec<String>, AttemptError> {
    let first = spent.calls as usize;
    let replies: Vec<Result<Summary, AttemptError>> = stream::iter(asks)
        .map(|user| async move { summarize.one_call(input, &user).await })
        .buffered(limit)
        .collect()
        .await;
    let mut handoffs = Vec::with_capacity(replies.len());
    let mut failure = None;
    for (at, reply) in replies.into_iter().enumerate() {
        spent.calls += 1;
        match reply {
            Ok(summary) => {
                spent.usages.extend(summary.usage);
                handoffs.push(summary.text);
            }
            Err(err) => {
                let message = format!(
                    "summary call {} of {total}: {}",
                    first + at + 1,
                    err.message
                );
                failure.get_or_insert(AttemptError::new(err.reason, message).with_usage(err.usage));
            }
        }
    }
    match failure {
        Some(err) => Err(spent.fail(err)),
        None => Ok(handoffs),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_go_by_rounds_when_the_handoffs_do_not_fit_one_call() {
        assert_eq!(merge_calls(1, 8), 0);
        assert_eq!(merge_calls(3, 8), 1);
        assert_eq!(merge_calls(8, 8), 1);
        assert_eq!(merge_calls(9, 8), 3, "two batches, then their merge");
        assert_eq!(merge_calls(20, 4), 5 + 2 + 1);
        assert_eq!(per_merge(14_000, 1_000, 1_000, 1_600), 7);
    }
}
