//! Zero-wait compaction: prepare early, adopt late.
//!
//! A view past `compaction.prepare_at` of the trigger has its compaction prepared in
//! the background, under the same single flight and lease as any other, while the
//! request goes on untouched. The record is committed as always (record, then
//! boundary), marked [`Prepared`](crate::base::record::Prepared). It counts only for a
//! request whose view without it crosses the trigger ([`settled_view`]): until then the
//! client's prefix, and so the provider's prompt cache, stays as it was. The first
//! request that adopts it logs an `adopt` line.
//!
//! The work is bounded: one preparation per conversation, `compaction.max_background`
//! over all of them, and one past that is dropped, never queued.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use handoff_plugin_api::ModelClient;

use super::budget::RequestBudget;
use super::chain::Chain;
use super::Adopted;
use crate::base::digest::PrefixDigest;
use crate::base::record::Reason;
use crate::config::Config;
use crate::conversation::{Tracked, Tracker};
use crate::dialect::ChatRequest;
use crate::projection::{project_view, ModelView};

pub use crate::metrics::{
    PREPARED, PREPARED_ADOPTED, PREPARED_WAITED, PREPARED_WASTED, SENT_WHILE_PREPARING,
};

/// The view a request is sent: its adopted compactions, but a prepared one no request
/// took yet only when the view without it is over `threshold` (by `estimate`).
pub(crate) fn settled_view<'a>(
    request: &'a ChatRequest,
    tracked: &'a Tracked,
    threshold: u64,
    estimate: impl Fn(&ModelView<'_>) -> u64,
) -> ModelView<'a> {
    let mut pool: Cow<'_, HashMap<PrefixDigest, Arc<Adopted>>> =
        Cow::Borrowed(&tracked.compactions);
    loop {
        let view = project_view(request, tracked, &pool);
        let Some(waiting) = view.compaction.as_ref().filter(|a| a.is_waiting()) else {
            return view;
        };
        let mut without = pool.clone().into_owned();
        without.remove(&waiting.record.source.prefix_digest);
        let earlier = project_view(request, tracked, &without);
        if estimate(&earlier) > threshold {
            return view;
        }
        pool = Cow::Owned(without);
    }
}

/// True when `request`'s view, with every committed compaction taken, ends on a
/// prepared one no request took yet. That one is adopted when the view reaches the
/// trigger; a preparation now would summarise a prefix the upstream never read (no
/// cache to reuse) and compact twice for once (the first result wasted, or adopted
/// only to be replaced at once).
pub fn waiting_ahead(request: &ChatRequest, tracked: &Tracked) -> bool {
    project_view(request, tracked, &tracked.compactions)
        .compaction
        .is_some_and(|adopted| adopted.is_waiting())
}

/// Share of the room between a compacted view and the trigger that the view must
/// grow through before its next compaction is prepared.
const REGROWTH: f64 = 0.5;

/// When a view's next compaction is prepared: at `mark`, but not before the view has
/// grown [`REGROWTH`] of the way from `settled` (its size when first sent on the
/// compaction in force) to `threshold`, unless a preparation must start sooner to land
/// before the trigger (`latest`, from the conversation's pace). What arrives between a
/// preparation and its adoption stays verbatim, so a view adopted late in a fast
/// conversation restarts high; prepared again at once, each compaction would remove
/// less than the last, and the conversation compact twice as often as inline.
pub fn paced_mark(mark: u64, settled: Option<u64>, threshold: u64, latest: Option<u64>) -> u64 {
    let Some(settled) = settled.filter(|settled| *settled < threshold) else {
        return mark;
    };
    let regrown = settled + ((threshold - settled) as f64 * REGROWTH) as u64;
    mark.max(latest.map_or(regrown, |latest| regrown.min(latest)))
}

/// The compaction a preparation for `request` builds on: the one its view ends on with
/// every committed one taken (prepared ones no request took yet included), or `sent`,
/// the one the view sent ended on, when that landed after `tracked` was read.
pub fn basis(request: &ChatRequest, tracked: &Tracked, sent: Option<&str>) -> Option<String> {
    let known = |id: &str| tracked.compactions.values().any(|a| a.record.id == id);
    match sent {
        Some(sent) if !known(sent) => Some(sent.to_owned()),
        _ => project_view(request, tracked, &tracked.compactions)
            .compact_id()
            .map(str::to_owned),
    }
}

/// Everything a preparation's job borrows, owned, so it can outlive the request.
pub struct Preparation {
    /// The conversations.
    pub tracker: Arc<Tracker>,
    /// The config the request was served with.
    pub config: Arc<Config>,
    /// The request the preparation is made from.
    pub request: ChatRequest,
    /// Its tracking.
    pub tracked: Tracked,
    /// Its budget.
    pub budget: RequestBudget,
    /// The summary client, with the client's credential.
    pub client: Arc<dyn ModelClient>,
    /// The chain.
    pub chain: Chain,
    /// The compaction the request's view was built on.
    pub seen_compact_id: Option<String>,
    /// `prepared` for a preparation; `threshold` for the compaction of a request that
    /// crossed the trigger, detached so that it outlives `compaction.max_wait`.
    pub reason: Reason,
    /// Tokens the recent part is kept smaller by ([`super::job::Job::keep_less`]).
    pub keep_less: u64,
    /// How its summary call continues the conversation ([`super::job::Job::continuer`]).
    pub continuer: Option<Arc<crate::compaction::continued::Continuer>>,
    /// Where its cut may start ([`super::job::Job::cut_from`]).
    pub cut_from: usize,
}

#[cfg(test)]
mod pacing_tests {
    use super::paced_mark;

    #[test]
    fn the_next_preparation_waits_for_half_the_room_unless_it_must_start_sooner() {
        // Restarted at 6,000 under a trigger of 10,000: not before 8,000.
        assert_eq!(paced_mark(5_000, Some(6_000), 10_000, None), 8_000);
        // The pace needs it at 7,000 to land in time: then.
        assert_eq!(paced_mark(5_000, Some(6_000), 10_000, Some(7_000)), 7_000);
        // Never earlier than the pace's own mark.
        assert_eq!(paced_mark(9_000, Some(6_000), 10_000, Some(7_000)), 9_000);
        // Before any compaction, or restarted over the trigger: the pace's mark.
        assert_eq!(paced_mark(5_000, None, 10_000, None), 5_000);
        assert_eq!(paced_mark(5_000, Some(11_000), 10_000, None), 5_000);
    }
}
