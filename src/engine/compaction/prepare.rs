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
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

use handoff_plugin_api::ModelClient;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::budget::RequestBudget;
use super::chain::Chain;
use super::service::{Compactor, Job};
use super::Adopted;
use crate::base::digest::PrefixDigest;
use crate::base::record::Reason;
use crate::config::Config;
use crate::conversation::{ConversationId, Tracked, Tracker};
use crate::dialect::ChatRequest;
use crate::projection::{project_view, ModelView};

pub use crate::metrics::{
    PREPARED, PREPARED_ADOPTED, PREPARED_WAITED, PREPARED_WASTED, SENT_WHILE_PREPARING,
};

/// Conversations whose last stand-in is kept.
const STAND_INS_KEPT: u64 = 10_000;

/// The compactions running on their own tasks: preparations (at most one per
/// conversation, and a global cap) and the runs `compaction.max_wait` detaches from
/// their request; each with the time it started.
pub struct Background {
    slots: Arc<Semaphore>,
    running: Mutex<HashMap<ConversationId, Instant>>,
    /// Woken whenever a run ends (after its commit): what a waiting request waits on.
    ended: tokio::sync::Notify,
    /// Each conversation's last stand-in (`compaction.max_wait`): the next one builds on
    /// it while it covers more than the committed compactions, so a stand-in covers
    /// only what arrived since the last, as the fallback's committed chain would.
    stand_ins: moka::sync::Cache<ConversationId, Arc<Adopted>>,
}

/// Why a preparation was not started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotStarted {
    /// This conversation's is running.
    Running,
    /// Every slot is taken: dropped, not queued.
    Full,
}

/// A running compaction's hold on its conversation (and a preparation's on its slot);
/// released on drop.
pub struct Ticket {
    background: Arc<Background>,
    id: ConversationId,
    _slot: Option<OwnedSemaphorePermit>,
}

impl Background {
    /// Room for `max` preparations at once.
    pub fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            slots: Arc::new(Semaphore::new(max)),
            running: Mutex::default(),
            ended: tokio::sync::Notify::new(),
            stand_ins: moka::sync::Cache::builder()
                .max_capacity(STAND_INS_KEPT)
                .time_to_idle(std::time::Duration::from_secs(600))
                .build(),
        })
    }

    /// True while `id` has a preparation running.
    pub(crate) fn is_running(&self, id: &ConversationId) -> bool {
        self.started(id).is_some()
    }

    /// `id`'s last stand-in.
    pub(crate) fn last_stand_in(&self, id: &ConversationId) -> Option<Arc<Adopted>> {
        self.stand_ins.get(id)
    }

    /// Keeps `stand_in` as `id`'s last.
    pub(crate) fn keep_stand_in(&self, id: &ConversationId, stand_in: Arc<Adopted>) {
        self.stand_ins.insert(id.clone(), stand_in);
    }

    /// Drops `id`'s last stand-in: its conversation was erased.
    pub fn forget(&self, id: &ConversationId) {
        self.stand_ins.invalidate(id);
    }

    /// Resolves when a run ends; enable it before looking at [`Self::is_running`].
    pub fn ended(&self) -> tokio::sync::futures::Notified<'_> {
        self.ended.notified()
    }

    /// When `id`'s running compaction started, if one runs on its own task here.
    pub fn started(&self, id: &ConversationId) -> Option<Instant> {
        self.running
            .lock()
            .ok()
            .and_then(|running| running.get(id).copied())
    }

    /// Takes a slot for `id`'s preparation.
    pub fn start(self: &Arc<Self>, id: &ConversationId) -> Result<Ticket, NotStarted> {
        self.take(id, true)
    }

    /// Marks the run a request detached (`compaction.max_wait`) as `id`'s: it takes no
    /// slot, as an inline run takes none, but it is the one a later request waits for.
    pub(crate) fn start_detached(
        self: &Arc<Self>,
        id: &ConversationId,
    ) -> Result<Ticket, NotStarted> {
        self.take(id, false)
    }

    fn take(self: &Arc<Self>, id: &ConversationId, slot: bool) -> Result<Ticket, NotStarted> {
        let mut running = self.running.lock().map_err(|_| NotStarted::Full)?;
        if running.contains_key(id) {
            return Err(NotStarted::Running);
        }
        let slot = match slot {
            true => Some(
                Arc::clone(&self.slots)
                    .try_acquire_owned()
                    .map_err(|_| NotStarted::Full)?,
            ),
            false => None,
        };
        running.insert(id.clone(), Instant::now());
        Ok(Ticket {
            background: Arc::clone(self),
            id: id.clone(),
            _slot: slot,
        })
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Ok(mut running) = self.background.running.lock() {
            running.remove(&self.id);
        }
        self.background.ended.notify_waiters();
    }
}

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
    /// The compactor (its counters, cancellation, calibrations).
    pub compactor: Compactor,
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
    /// Tokens the recent part is kept smaller by ([`Job::keep_less`]).
    pub keep_less: u64,
    /// How its summary call continues the conversation ([`Job::continuer`]).
    pub continuer: Option<Arc<crate::compaction::continued::Continuer>>,
    /// Where its cut may start ([`Job::cut_from`]).
    pub cut_from: usize,
}

impl Preparation {
    /// Runs the preparation on its own task, holding `ticket` until it ends.
    pub fn spawn(self, ticket: Ticket) {
        let metrics = Arc::clone(&self.compactor.metrics);
        let prepared = self.reason == Reason::Prepared;
        if prepared {
            metrics.add(PREPARED, &[("outcome", "started")], 1.0);
        }
        crate::cache_scope::spawn(async move {
            let _ticket = ticket;
            let outcome = self.run().await;
            if prepared {
                metrics.add(PREPARED, &[("outcome", outcome)], 1.0);
            }
        });
    }

    async fn run(&self) -> &'static str {
        let mut job = Job::new(
            &self.tracker,
            &self.request,
            &self.tracked,
            &self.config.compaction,
            &self.budget,
            Arc::clone(&self.client),
            Arc::clone(&self.chain),
        );
        job.reason = self.reason;
        job.detached = true;
        job.keep_less = self.keep_less;
        job.continuer = self.continuer.clone();
        job.prices = Some(&self.config.prices);
        job.cut_from = self.cut_from;
        job.seen_compact_id = self.seen_compact_id.clone();
        match self.compactor.compact(&job).await {
            Ok(view) => {
                let made = view.compaction.as_ref().is_some_and(|a| match self.reason {
                    Reason::Prepared => a.record.reason == Reason::Prepared && a.is_waiting(),
                    _ => Some(&a.record.id) != self.seen_compact_id.as_ref(),
                });
                if made && self.reason != Reason::Prepared {
                    tracing::info!(conversation = %self.tracked.id, "the detached compaction committed");
                    "committed"
                } else if made {
                    tracing::info!(conversation = %self.tracked.id, "compaction prepared in the background");
                    "committed"
                } else {
                    "stale"
                }
            }
            Err(err) => {
                tracing::warn!(conversation = %self.tracked.id, error = %err, "background preparation failed; the request that crosses the trigger compacts inline");
                "failed"
            }
        }
    }
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
