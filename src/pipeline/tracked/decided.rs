//! What the log records of each phase's decision: the budget, the count and the view
//! sent ([`DecisionLine`]), built here from what the phases learned and logged with
//! the reply, or alone when the request ends without one.

use super::Exchange;
use crate::base::line::DecisionLine;
use crate::compaction::decision;
use crate::conversation::Tracked;
use crate::error::ApiError;
use crate::projection::ModelView;

impl Exchange<'_> {
    /// The decision to send `view` (local count `local`) after `retries` refused views,
    /// `while_preparing` or not; `None` when the request has no budget, or wrote no
    /// request line (a retry).
    pub(super) fn decision(
        &self,
        tracked: &Tracked,
        sent: (&ModelView<'_>, Option<u64>),
        retries: u32,
        while_preparing: Option<crate::compaction::budget::Margin>,
    ) -> Option<DecisionLine> {
        let budget = self.budget.as_ref().filter(|_| tracked.logged)?;
        let mut decision = decision::sent(
            budget,
            tracked,
            &self.chat.model,
            sent,
            retries,
            while_preparing,
        );
        if let Ok(noted) = self.view_notes.lock() {
            decision.redacted.clone_from(&noted);
        }
        decision.from_record = self.from_record.map(str::to_owned);
        // Over the trigger because the client asked the provider to compact instead.
        if self.chat.provider_compacts
            && decision.over.as_deref() == Some(decision::OVER_NEWEST_UNIT)
        {
            decision.over = Some(decision::OVER_PROVIDER_COMPACTS.to_owned());
        }
        let saved = sent.0.compaction.as_ref().map(|adopted| {
            adopted
                .record
                .tokens_before
                .saturating_sub(adopted.record.tokens_after)
        });
        crate::otel::decision(&decision, saved);
        Some(decision)
    }

    /// Logs that handoff answered `error` itself instead of sending a view estimated at
    /// `before`.
    pub(super) async fn note_refusal(&self, error: &ApiError, before: Option<u64>) {
        let Ok(tracked) = self.tracked() else {
            return;
        };
        let Some(budget) = self.budget.as_ref().filter(|_| tracked.logged) else {
            return;
        };
        let code = error.code.unwrap_or(error.kind);
        let refused = decision::refused(budget, tracked, before, code, &error.message);
        crate::otel::decision(&refused, None);
        self.note(Some(refused)).await;
    }

    /// Logs `decision` on its own, for a request that ends without a reply to log it
    /// with (an upstream error, a refusal).
    pub(super) async fn note(&self, decision: Option<DecisionLine>) {
        if let (Some(decision), Ok(tracked)) = (decision, self.tracked()) {
            self.state
                .tracker
                .record_decision(&tracked.id, decision)
                .await;
        }
    }
}
