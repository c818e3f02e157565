//! The decision a request's log records: the budget the view was measured against,
//! the calibrated count, and the view sent, or why none was. The audit view and
//! `audit show` draw these numbers, and a manual compaction reuses the budget, so
//! neither recomputes what the proxy decided from a rebuilt body.

use super::budget::{Margin, RequestBudget, Scale};
use crate::base::line::DecisionLine;
use crate::conversation::Tracked;
use crate::projection::ModelView;

/// `over` for a view over the trigger that nothing more could be cut from, within the
/// input budget.
pub const OVER_NEWEST_UNIT: &str = "newest_unit";
/// `over` for a view that fits only with its tool bodies shortened.
pub(crate) const OVER_RESCUED: &str = "rescued";
/// `over` for a view over the input budget by an uncalibrated count, sent on that guess.
pub(crate) const OVER_GUESS: &str = "guess";
/// `over` for a view over the trigger, within the input budget, of a request that asks
/// the provider to compact: handoff left the compaction to the provider.
pub const OVER_PROVIDER_COMPACTS: &str = "provider_compacts";
/// `over` for a view over the trigger, within the input budget, sent as it was while
/// the conversation's compaction ran: the request did not wait for it.
pub(crate) const OVER_WHILE_PREPARING: &str = "sent_while_preparing";

/// The budget part of a decision, with no view yet.
fn budgeted(budget: &RequestBudget, tracked: &Tracked) -> DecisionLine {
    DecisionLine {
        head: tracked.head(),
        window: budget.model.context_window,
        reserved: budget
            .model
            .context_window
            .saturating_sub(budget.input_budget),
        input_budget: budget.input_budget,
        trigger: budget.threshold,
        tools: budget.tools_tokens,
        estimate: None,
        local: None,
        compaction: None,
        over: None,
        margin: None,
        retries: 0,
        refused: None,
        detail: None,
        upstream_status: None,
        redacted: Vec::new(),
        from_record: None,
    }
}

/// The decision to send `view`, whose local count is `local`, after `retries`
/// views the upstream refused for their size; `while_preparing`, with the margin it
/// kept, when it was sent over the trigger without waiting for a running compaction.
pub fn sent(
    budget: &RequestBudget,
    tracked: &Tracked,
    model: &str,
    (view, local): (&ModelView<'_>, Option<u64>),
    retries: u32,
    while_preparing: Option<Margin>,
) -> DecisionLine {
    let estimate = local.map(|local| {
        Scale::new(tracked.calibration.as_ref(), model).view(local, view.compact_id())
    });
    let over = estimate
        .filter(|estimate| *estimate > budget.threshold)
        .map(|estimate| {
            if !view.rescued.is_empty() {
                OVER_RESCUED
            } else if while_preparing.is_some() {
                OVER_WHILE_PREPARING
            } else if estimate > budget.input_budget {
                OVER_GUESS
            } else {
                OVER_NEWEST_UNIT
            }
        });
    DecisionLine {
        estimate,
        local,
        compaction: view.compact_id().map(str::to_owned),
        over: over.map(str::to_owned),
        margin: while_preparing.filter(|_| over == Some(OVER_WHILE_PREPARING)),
        retries,
        ..budgeted(budget, tracked)
    }
}

/// The decision to refuse the request, whose view was estimated at `estimate` before
/// any compaction, with the error `code` and its `detail`.
pub fn refused(
    budget: &RequestBudget,
    tracked: &Tracked,
    estimate: Option<u64>,
    code: &str,
    detail: &str,
) -> DecisionLine {
    DecisionLine {
        estimate,
        refused: Some(code.to_owned()),
        detail: Some(detail.to_owned()),
        ..budgeted(budget, tracked)
    }
}
