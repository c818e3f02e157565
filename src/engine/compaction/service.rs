//! One compaction run: choose the cut, run the chain, commit the pair, re-project.
//!
//! Runs are single flight per conversation (the tracker's flight lock, and the store's
//! lease across replicas): a request
//! that waited re-projects first and finds the committed handoff. The loop guard works
//! on progress, not on a count: a run that leaves the view over the trigger is retried
//! once with only the last unit kept, and after that the answer is a 400 with numbers.

use std::sync::Arc;
use std::time::Instant;

use handoff_plugin_api::{CancellationToken, ModelClient, ModelInfo};

use super::budget::{Margin, RequestBudget, Scale, ScaledCounter};
use super::chain::Chain;
use super::max_wait::{stand_in_chain, Waited};
use super::model_client::Tally;
use super::prepare::{
    settled_view, Background, Preparation, PREPARED_ADOPTED, PREPARED_WAITED, PREPARED_WASTED,
    SENT_WHILE_PREPARING,
};
use super::spend::Priced;
use super::split::split_at_unit_boundary;
use super::summary_count::SummaryCalibrations;
use super::unit::split_into_units;
use super::Adopted;
use crate::base::line::{AdoptLine, Entry, Line, RescueLine};
use crate::base::record::Reason;
use crate::config::{CompactionConfig, Tokenizer};
use crate::conversation::{ConversationId, Tracked, Tracker};
use crate::dialect::{ChatRequest, DialectError, Message, Role};
use crate::metrics::{Metrics, SUMMARY_COST_USD, UNPRICED_SUMMARY_CALLS, VIEWS_RESCUED};
use crate::projection::{project_view, ModelView, ProjectionError};
use crate::store::{Lease, StoreError};
use crate::tokens::{Tokens, MESSAGE_OVERHEAD, REPLY_PRIMING};

/// How often a request waiting for another replica's compaction looks again.
const LEASE_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// Shares of `keep_recent` tried, largest first, before keeping only the last unit.
const KEEP_STEPS: [f64; 4] = [1.0, 0.5, 0.25, 0.0];

/// Tokens a user message costs in a handoff past its text: its item mark, and a share
/// of its section's heading.
const USER_ITEM_TOKENS: u64 = 4;

/// Why a compaction could not produce a view that fits.
#[derive(Debug, thiserror::Error)]
pub enum CompactError {
    /// Even pinned + tools + the last unit exceed the budget.
    #[error("the request cannot fit the model's window: {detail}")]
    TooLarge {
        /// The numbers.
        detail: String,
    },
    /// The store could not commit.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Shutdown cancelled the run; nothing was committed.
    #[error("compaction cancelled before commit")]
    Cancelled,
    /// The compacted view failed validation and was not sent.
    #[error(transparent)]
    View(#[from] ProjectionError),
    /// Another replica held the conversation's compaction lease for too long.
    #[error(
        "another replica is still compacting this conversation after {0} s; retry the request"
    )]
    Busy(u64),
    /// The history must be compacted but is not one handoff can make a valid view of
    /// (e.g. a tool result that answers no call): what is broken, by position.
    #[error("this request must be compacted to fit, but its history cannot be: {0}")]
    Uncompactable(DialectError),
    /// No strategy produced a handoff (a chain without a deterministic end).
    #[error("no strategy produced a handoff: {0}")]
    NoHandoff(String),
}

/// Everything one compaction needs to know about its request.
pub struct Job<'a> {
    /// The tracker holding the conversation.
    pub tracker: &'a Tracker,
    /// The conversation.
    pub id: &'a ConversationId,
    /// The parsed request.
    pub request: &'a ChatRequest,
    /// Its digests.
    pub tracked: &'a Tracked,
    /// Compaction settings.
    pub config: &'a CompactionConfig,
    /// The request model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The summary model's tokenizer.
    pub summary_tokenizer: Tokenizer,
    /// Whether the model wants the reasoning marker.
    pub reasoning_marker: bool,
    /// Models and windows.
    pub model: ModelInfo,
    /// Window minus reserved output.
    pub input_budget: u64,
    /// The estimate the view must get under.
    pub threshold: u64,
    /// Local counts to the upstream's: every number compared or reported goes through it.
    pub scale: Scale,
    /// Tokens of the `tools` schemas.
    pub tools_tokens: u64,
    /// Why this run.
    pub reason: Reason,
    /// The compaction the caller's view was built on; another one means someone compacted meanwhile.
    pub seen_compact_id: Option<String>,
    /// The client for model calls.
    pub client: Arc<dyn ModelClient>,
    /// The strategies to try, first to last.
    pub chain: Chain,
    /// True for a request that waits for a compaction already running: another's
    /// handoff is enough once its view fits the input budget, over the trigger or not.
    pub waits_for_running: bool,
    /// True for a run on its own task (a preparation, or one `compaction.max_wait`
    /// detached): only a committed record reaches a request, so it makes no view-only
    /// result (a rescue) that the request would make again, and count twice.
    pub detached: bool,
    /// Tokens the recent part is kept smaller by: a preparation's, by what will arrive
    /// before a request adopts it (the view's distance to the trigger), so that the
    /// recent part at adoption is the `keep_recent` an inline run keeps.
    pub keep_less: u64,
    /// How a summary call continues this request's conversation over its cached
    /// prefix; `None` renders the history as text.
    pub continuer: Option<Arc<super::continued::Continuer>>,
    /// The configured `[prices]`: the summary calls are counted at them as they commit.
    pub prices: Option<&'a std::collections::BTreeMap<String, crate::config::Price>>,
    /// The share of the input budget kept verbatim: the model's own `keep_recent`, or
    /// `compaction.keep_recent`.
    pub keep_recent: f64,
    /// The fewest non-pinned originals the cut leaves before it, where a cut allows:
    /// a preparation cuts after what the view held when the upstream first cached it.
    pub cut_from: usize,
    /// The run's summary calls, counted on its lease: set once the lease is held.
    pub tally: Option<Arc<Tally>>,
}

impl Job<'_> {
    /// True when `view` (estimated at `estimate`), projected from the compactions
    /// committed by now, needs no run of this job.
    fn done_by(&self, view: &ModelView<'_>, estimate: u64) -> bool {
        let someone_else = view.compact_id().map(str::to_owned) != self.seen_compact_id;
        let fits = estimate <= self.threshold;
        match self.reason {
            // A request that waited for a running compaction takes its handoff once the
            // view fits the input budget: the next one is prepared, not waited for.
            Reason::Threshold if self.waits_for_running && someone_else => {
                estimate <= self.hard_limit()
            }
            Reason::Threshold => fits,
            Reason::ContextLengthExceeded => fits && someone_else,
            // Another compaction landed meanwhile: this preparation is stale.
            Reason::Prepared => someone_else,
            Reason::Manual => false,
        }
    }

    /// What a view may not exceed to be sent: the input budget (the window less the
    /// reserved output). After the upstream refused a view for its size, the aim
    /// below that refusal is the limit too.
    pub(crate) fn hard_limit(&self) -> u64 {
        match self.reason {
            Reason::ContextLengthExceeded => self.threshold,
            Reason::Threshold | Reason::Manual | Reason::Prepared => {
                self.input_budget.max(self.threshold)
            }
        }
    }

    /// True when the counts are a guess: no calibration for this model yet, or a
    /// tokenizer that only estimates. Then a view handoff thinks is over the limit is
    /// still sent, and the reactive path recovers if the upstream refuses it.
    pub(crate) fn counts_are_guesses(&self) -> bool {
        !self.scale.is_calibrated() || self.tokenizer == Tokenizer::Estimate
    }

    /// The 400 detail when no view fits: which part is too big, and both limits.
    fn too_large(&self, what: String) -> CompactError {
        CompactError::TooLarge {
            detail: format!(
                "{what}; it must fit the input budget of {} ({} window − {} reserved output); handoff compacts at {} (trigger {})",
                self.hard_limit(),
                self.model.context_window,
                self.model.context_window.saturating_sub(self.input_budget),
                self.threshold,
                self.config.trigger
            ),
        }
    }
}

impl<'a> Job<'a> {
    /// A proactive job (reason `threshold`, the budget's threshold) for `request`; a
    /// caller changes `threshold`, `reason` or `seen_compact_id` for another kind of run.
    /// The scale comes from the conversation's calibration in `tracked`.
    pub fn new(
        tracker: &'a Tracker,
        request: &'a ChatRequest,
        tracked: &'a Tracked,
        config: &'a CompactionConfig,
        budget: &RequestBudget,
        client: Arc<dyn ModelClient>,
        chain: Chain,
    ) -> Self {
        Self {
            tracker,
            id: &tracked.id,
            request,
            tracked,
            config,
            tokenizer: budget.tokenizer(),
            summary_tokenizer: budget.summary_tokenizer,
            reasoning_marker: budget.model.reasoning_marker,
            model: budget.info.clone(),
            input_budget: budget.input_budget,
            threshold: budget.threshold,
            scale: Scale::new(tracked.calibration.as_ref(), &request.model),
            tools_tokens: budget.tools_tokens,
            reason: Reason::Threshold,
            seen_compact_id: None,
            waits_for_running: false,
            detached: false,
            keep_less: 0,
            keep_recent: config.keep_recent_for(Some(&budget.model)),
            prices: None,
            continuer: None,
            cut_from: 0,
            tally: None,
            client,
            chain,
        }
    }
}

/// Runs compactions.
#[derive(Clone)]
pub struct Compactor {
    /// Token counting.
    pub tokens: Arc<Tokens>,
    /// Fired at shutdown.
    pub cancel: CancellationToken,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// What each summary model was measured to count.
    pub summary_calibrations: SummaryCalibrations,
    /// The preparations running in the background.
    pub background: Arc<Background>,
    /// Summary calls in flight over all compactions (`compaction.max_summary_concurrency`).
    pub summary_slots: Arc<tokio::sync::Semaphore>,
    /// How conversations grow and summarisers take: `prepare_at = "auto"`.
    pub pace: Arc<super::pace::Pace>,
}

pub(super) struct Plan {
    /// Where the recent part starts in the view's live messages.
    pub(super) cut: usize,
    /// The view's predicted tokens after the run.
    pub(super) predicted: u64,
    /// Local tokens of the view but the pair: pinned, tools, lifted and recent.
    pub(super) rest: u64,
    /// Local tokens every view of the request carries: pinned messages and tools.
    pub(super) fixed: u64,
    /// Local tokens of the user's words the handoff must carry: the compacted span's
    /// user messages and those the previous ledger held, up to [`users_kept_whole`].
    pub(super) users: u64,
}

/// A view that fits, and its local estimate (to calibrate against the usage the
/// upstream reports for it).
pub struct Fitted<'a> {
    /// The view to send.
    pub view: ModelView<'a>,
    /// Its local estimate; `None` when the model has no budget.
    pub estimate: Option<u64>,
    /// The calibrated estimate of the view before any compaction: what
    /// `None` when the model has no budget.
    pub before: Option<u64>,
    /// The calibrated estimate of the view sent: what `compaction.prepare_at` is
    /// judged on; `None` when the model has no budget.
    pub after: Option<u64>,
    /// When the view is over the trigger and was not compacted because the
    /// conversation's compaction was running (here or on another replica) and the view
    /// fits the input budget less this margin (its estimate's error bound): sent
    /// without waiting.
    pub while_preparing: Option<Margin>,
    /// True when the view is over the trigger with no compaction of its own: sent while
    /// one ran, or after waiting for one that left it within the input budget only. The
    /// next compaction is then prepared in the background.
    pub sent_over_trigger: bool,
    /// True when the view stands on a stand-in (`compaction.max_wait`), made now or
    /// taken from an earlier request: its handoff is not committed.
    pub stood_in: bool,
}

impl<'a> Fitted<'a> {
    /// `view` sent as it is, counted `local` (calibrated: `current`).
    pub(super) fn as_is(view: ModelView<'a>, local: u64, current: u64) -> Self {
        Self {
            view,
            estimate: Some(local),
            before: Some(current),
            after: Some(current),
            while_preparing: None,
            sent_over_trigger: false,
            stood_in: false,
        }
    }
}

/// A compaction the proactive path needed that failed, and the calibrated estimate of
/// the view before it: what the request's refusal is logged with.
#[derive(Debug, thiserror::Error)]
#[error("{error}")]
pub struct FitError {
    /// Why no view fits.
    pub error: CompactError,
    /// The calibrated estimate of the view that needed the compaction.
    pub before: Option<u64>,
}

/// `view`, or the request as it is when a handoff built the view invalid: never send
/// that; the client's own request is the client's to send, and the provider's to judge.
fn valid_or_plain<'a>(
    request: &'a ChatRequest,
    tracked: &'a Tracked,
    view: ModelView<'a>,
) -> ModelView<'a> {
    if view.compaction.is_none() {
        return view;
    }
    match view.validate() {
        Ok(()) => view,
        Err(err) => {
            tracing::error!(conversation = %tracked.id, error = %err, "projected view is invalid; sending the request uncompacted");
            project_view(request, tracked, &Default::default())
        }
    }
}

/// New message text above which tokenising is moved off the async path.
const BIG_UNCOUNTED: usize = 256 * 1024;

/// Counts the messages of `view` not counted yet, and loads `tokenizer`, on the blocking
/// pool: tokenising hundreds of KB, or loading a tokenizer, takes tens of ms or more,
/// and the worker thread (one of a few, or the only one of a `workers = N` runtime)
/// serves its other connections meanwhile. A failure only leaves the counting to the
/// caller's estimate, in place.
async fn count_on_the_blocking_pool(
    tokens: &Arc<Tokens>,
    view: &ModelView<'_>,
    tokenizer: Tokenizer,
    tracked: &Tracked,
) {
    let work = view.uncounted(tokens, tokenizer);
    let counter = Arc::clone(tokens);
    let scope = crate::cache_scope::current();
    let counted = tokio::task::spawn_blocking(move || {
        counter.load(tokenizer);
        crate::cache_scope::within_sync(scope, || {
            for message in &work {
                message.token_count(&counter, tokenizer);
            }
        });
    })
    .await;
    if let Err(err) = counted {
        tracing::error!(conversation = %tracked.id, error = %err, "counting off the async path failed; counting in place");
    }
}

/// True when `job`'s conversation prepares its compactions: preparation is on and its
/// chain starts with a model.
fn prepares(job: &Job<'_>) -> bool {
    !job.config.prepare_at.is_off()
        && job
            .chain
            .first()
            .is_some_and(|first| !first.strategy.is_deterministic())
}

impl Compactor {
    /// The view's calibrated estimate: the count every decision is made with.
    pub(super) fn count(&self, job: &Job<'_>, view: &ModelView<'_>) -> u64 {
        let local = view.estimate(&self.tokens, job.tokenizer, job.tools_tokens);
        job.scale.view(local, view.compact_id())
    }

    /// The proactive path every caller shares (the proxy, `handoff eval`): the view
    /// from the adopted compactions (a prepared one only once the view without it
    /// crosses the trigger), compacted when its calibrated estimate passes the trigger.
    /// `job` builds the compaction job, from the budget and the view's compaction id,
    /// only when one is needed; `detached` the same job, owned, to run on its own task
    /// under `compaction.max_wait` (`None`: the caller runs compactions inline).
    pub async fn fit<'a>(
        &self,
        tracker: &Tracker,
        (request, tracked): (&'a ChatRequest, &'a Tracked),
        budget: Option<&RequestBudget>,
        job: impl FnOnce(&RequestBudget, Option<&str>) -> Job<'a>,
        detached: impl FnOnce(Option<&str>) -> Option<Preparation>,
    ) -> Result<Fitted<'a>, FitError> {
        let arrived = tokio::time::Instant::now();
        let Some(budget) = budget else {
            let view = project_view(request, tracked, &tracked.compactions);
            return Ok(Fitted {
                view: valid_or_plain(request, tracked, view),
                estimate: None,
                before: None,
                after: None,
                while_preparing: None,
                sent_over_trigger: false,
                stood_in: false,
            });
        };
        let tokens = &self.tokens;
        let scale = Scale::new(tracked.calibration.as_ref(), &request.model);
        let calibrated = |view: &ModelView<'_>| {
            let local = view.estimate(tokens, budget.tokenizer(), budget.tools_tokens);
            scale.view(local, view.compact_id())
        };
        // Settling counts only when a prepared record waits (rare); the view it picks
        // is then counted, off the async path when that is heavy.
        let settled = settled_view(request, tracked, budget.threshold, calibrated);
        let mut view = valid_or_plain(request, tracked, settled);
        let tokenizer = budget.tokenizer();
        // Between compactions every message but the newest was counted on an earlier
        // turn: one pass reads the counts and finds nothing to tokenise.
        let mut local = match view.cached_estimate(tokens, tokenizer, budget.tools_tokens) {
            Ok(local) if tokens.is_loaded(tokenizer) => local,
            cached => {
                let uncounted = cached.err().unwrap_or(0);
                if uncounted > BIG_UNCOUNTED || !tokens.is_loaded(tokenizer) {
                    // The counts land in the messages' facts: the estimate only reads them.
                    count_on_the_blocking_pool(tokens, &view, tokenizer, tracked).await;
                }
                view.estimate(tokens, tokenizer, budget.tools_tokens)
            }
        };
        let current = scale.view(local, view.compact_id());
        tracing::debug!(conversation = %tracked.id, estimate = current, threshold = budget.threshold, "view estimated");
        self.note_adoption(tracker, tracked, &view).await;
        if current > budget.threshold && request.provider_compacts && current <= budget.input_budget
        {
            // The client asked the provider to compact: compacting here too would
            // compact twice. Only a view that would not fit is handoff's to compact.
            tracing::info!(conversation = %tracked.id, estimate = current, threshold = budget.threshold, "over the trigger, and the request asks the provider to compact; sent as it is");
            return Ok(Fitted::as_is(view, local, current));
        }
        if current > budget.threshold {
            if let Some(fitted) = self.on_stand_in((request, tracked), budget, &scale) {
                return Ok(fitted);
            }
            // A compaction already running will serve a later request; this one waits
            // for it only when its view does not fit the input budget without it.
            let mut running = self.background.is_running(&tracked.id)
                || tracker.compaction_running(&tracked.id).await;
            let mut job = job(budget, view.compact_id());
            let mut detached = Some(detached);
            // Sent without waiting only with room for its estimate's error.
            let margin = budget.margin(&scale);
            let sendable = current <= budget.sendable_over_trigger(&margin);
            // Preparing, a view that crosses the trigger with nothing prepared starts
            // its compaction and, when it fits, is sent as it is: the next request
            // adopts the handoff, keeping verbatim what arrived since too. A quick
            // summariser is waited for instead, as inline: the view then keeps no more
            // than keep_recent, and the cache is rewritten as little.
            let waits = self
                .pace
                .worth_waiting_for(&budget.info.summary_model, job.config.max_wait);
            if !running && sendable && !waits && prepares(&job) {
                let mut run = detached.take().and_then(|d| d(view.compact_id()));
                if let Some(run) = run.as_mut() {
                    // Adopted a request later: what that adds stays verbatim too.
                    run.keep_less = self.pace.per_request(&tracked.id).unwrap_or(0);
                }
                running = self.detach(&tracked.id, run);
            }
            if running && sendable {
                tracing::info!(conversation = %tracked.id, estimate = current, threshold = budget.threshold, input_budget = budget.input_budget, margin = margin.tokens, "over the trigger while its compaction runs; the view fits the input budget less its margin, so it is sent without waiting");
                self.metrics.add(SENT_WHILE_PREPARING, &[], 1.0);
                return Ok(Fitted {
                    view,
                    estimate: Some(local),
                    before: Some(current),
                    after: Some(current),
                    while_preparing: Some(margin),
                    sent_over_trigger: true,
                    stood_in: false,
                });
            }
            if running {
                tracing::info!(conversation = %tracked.id, estimate = current, input_budget = budget.input_budget, margin = margin.tokens, "over the input budget less its margin while its compaction runs; waiting for it");
                self.metrics.add(PREPARED_WAITED, &[], 1.0);
            } else {
                tracing::info!(conversation = %tracked.id, estimate = current, threshold = budget.threshold, "over the trigger; compacting");
            }
            job.waits_for_running = running;
            let fail = |error| FitError {
                error,
                before: Some(current),
            };
            // Boxed: a compaction's future is kilobytes, and every request's future would
            // carry (and move) it, though few requests compact.
            let waited = Box::pin(self.within_max_wait_if_set(
                &job,
                &view,
                current,
                (running, arrived),
                move |id| detached.and_then(|d| d(id)),
            ))
            .await
            .map_err(fail)?;
            let mut stand_in = false;
            view = match waited {
                Waited::Done(done) => done,
                Waited::StandIn(done) => {
                    stand_in = true;
                    done
                }
                Waited::Ended => Box::pin(self.compact(&job)).await.map_err(fail)?,
            };
            self.note_adoption(tracker, tracked, &view).await;
            local = view.estimate(tokens, tokenizer, budget.tools_tokens);
            let after = scale.view(local, view.compact_id());
            return Ok(Fitted {
                view,
                estimate: Some(local),
                before: Some(current),
                after: Some(after),
                while_preparing: None,
                sent_over_trigger: (running || stand_in) && after > budget.threshold,
                stood_in: stand_in,
            });
        }
        Ok(Fitted::as_is(view, local, current))
    }

    /// Under `compaction.max_wait` (a chain with a stand-in, and a run this process
    /// holds on its own task: the one running, or `detached` started now), waits for that
    /// run within `max_wait`; otherwise [`Waited::Ended`] at once, and the caller compacts
    /// inline (or waits for the run another holds) as before.
    async fn within_max_wait_if_set<'a>(
        &self,
        job: &Job<'a>,
        view: &ModelView<'a>,
        estimate: u64,
        (running, arrived): (bool, tokio::time::Instant),
        detached: impl FnOnce(Option<&str>) -> Option<Preparation>,
    ) -> Result<Waited<'a>, CompactError> {
        if stand_in_chain(&job.chain).is_none() {
            return Ok(Waited::Ended);
        }
        let ours = if running {
            self.background.is_running(job.id)
        } else {
            self.detach(job.id, detached(view.compact_id()))
        };
        if !ours {
            return Ok(Waited::Ended);
        }
        let max_wait = job.config.max_wait;
        let waiting = Job {
            waits_for_running: true,
            ..job.with_chain(Arc::clone(&job.chain))
        };
        self.within_max_wait(&waiting, view, estimate, arrived, max_wait)
            .await
    }

    /// Logs the first adoption of a prepared compaction by `view`: which one, and how
    /// many messages arrived since it was prepared. A failed write loses only the note.
    async fn note_adoption(&self, tracker: &Tracker, tracked: &Tracked, view: &ModelView<'_>) {
        let Some(adopted) = view.compaction.as_ref().filter(|a| a.take()) else {
            return;
        };
        let prepared_from = adopted.record.prepared.as_ref().map_or(0, |p| p.messages);
        let arrived = tracked.message_digests.len().saturating_sub(prepared_from);
        self.metrics.add(PREPARED_ADOPTED, &[], 1.0);
        tracing::info!(conversation = %tracked.id, compaction = %adopted.record.id, arrived, "adopted the prepared compaction");
        let line = Line::now(Entry::Adopt(AdoptLine {
            compact_id: adopted.record.id.clone(),
            head: tracked.head(),
            arrived,
        }));
        if let Err(err) = tracker.store().append(&tracked.id, vec![line]).await {
            tracing::warn!(conversation = %tracked.id, error = %err, "cannot log the adoption of a prepared compaction");
        }
    }

    /// Compacts until the view fits under `job.threshold`, or says why it cannot.
    ///
    /// Single flight twice over: the entry's lock within this process, and the store's
    /// lease across replicas. A request that waited finds the other's handoff instead
    /// of making its own.
    pub async fn compact<'a>(&self, job: &Job<'a>) -> Result<ModelView<'a>, CompactError> {
        let _single_flight = job.tracker.single_flight(job.id).await;
        let started = Instant::now();
        let patience = job.tracker.lease_ttl()
            + job.config.summary_timeout * u32::try_from(job.chain.len() + 1).unwrap_or(u32::MAX);
        let mut waiting = false;
        let lease = loop {
            if let Some(lease) = job.tracker.acquire(job.id).await? {
                break lease;
            }
            // A preparation never waits for another replica's work.
            if job.reason == Reason::Prepared {
                return Err(CompactError::Busy(0));
            }
            // Another replica is compacting: adopt its handoff once it commits, or take
            // over once its lease expires.
            if let Some(view) = self.already_done(job).await? {
                return Ok(view);
            }
            if started.elapsed() > patience {
                return Err(CompactError::Busy(patience.as_secs()));
            }
            if !waiting {
                tracing::info!(conversation = %job.id, "another replica holds the compaction lease; waiting for its handoff or its expiry");
                waiting = true;
            }
            tokio::select! {
                () = tokio::time::sleep(LEASE_POLL) => {}
                () = self.cancel.cancelled() => return Err(CompactError::Cancelled),
            }
        };
        if let Some(orphan) = &lease.orphan {
            tracing::warn!(conversation = %job.id, holder = %orphan.holder, epoch = orphan.epoch, calls = orphan.calls, "took over an orphaned compaction lease: its run left summary calls no committed compaction records (killed, cut off from the database, or ended without a commit)");
        }
        let store = Arc::clone(job.tracker.store());
        let tally = Arc::new(Tally::new(store, job.id.clone(), lease.clone()));
        let tallied = Job {
            tally: Some(Arc::clone(&tally)),
            ..job.with_chain(Arc::clone(&job.chain))
        };
        let result = self.compact_leased(&tallied, &lease).await;
        job.tracker.release(job.id, &lease).await;
        let unrecorded = tally.take();
        if unrecorded > 0 {
            tracing::warn!(conversation = %job.id, calls = unrecorded, holder = %lease.holder, epoch = lease.epoch, "summary calls made under this lease that no committed compaction records");
        }
        if let Ok(view) = &result {
            self.note_rescue(job, view).await;
        }
        match result {
            Err(CompactError::Store(StoreError::LeaseLost(_))) => {
                // Taken over while the model ran: the other replica's handoff may do.
                tracing::warn!(conversation = %job.id, "compaction lease lost; adopting the other replica's work");
                match self.already_done(job).await? {
                    Some(view) => Ok(view),
                    None => result,
                }
            }
            other => other,
        }
    }

    /// Logs which tool results `view` shortened, if any: the audit shows every view that
    /// was not the originals plus a handoff. A failed write loses only the note.
    async fn note_rescue(&self, job: &Job<'_>, view: &ModelView<'_>) {
        if view.rescued.is_empty() {
            return;
        }
        let line = Line::now(Entry::Rescue(RescueLine {
            head: job.tracked.head(),
            shortened: view.rescued.clone(),
        }));
        if let Err(err) = job.tracker.store().append(job.id, vec![line]).await {
            tracing::warn!(conversation = %job.id, error = %err, "cannot log the rescue note");
        }
    }

    /// The view from the store's latest compactions, if it already needs no run.
    pub(super) async fn already_done<'a>(
        &self,
        job: &Job<'a>,
    ) -> Result<Option<ModelView<'a>>, CompactError> {
        job.tracker.refresh(job.id).await?;
        let adopted = job.tracker.compactions(job.id).await?;
        let view = project_view(job.request, job.tracked, &adopted);
        let estimate = self.count(job, &view);
        Ok(job.done_by(&view, estimate).then_some(view))
    }

    /// Runs `work` while keeping `lease` alive; a lease found lost stops the work, and
    /// nothing of it is committed.
    async fn renewing<T>(
        &self,
        job: &Job<'_>,
        lease: &Lease,
        work: impl std::future::Future<Output = Result<T, CompactError>>,
    ) -> Result<T, CompactError> {
        if !job.tracker.store().shared() {
            return work.await;
        }
        tokio::pin!(work);
        let period = job.tracker.lease_ttl() / 3;
        loop {
            tokio::select! {
                out = &mut work => return out,
                () = tokio::time::sleep(period) => match job.tracker.renew(job.id, lease).await {
                    Ok(true) => {}
                    Ok(false) => return Err(StoreError::LeaseLost(job.id.to_string()).into()),
                    // The database is unreachable: the commit's fence decides.
                    Err(err) => tracing::warn!(conversation = %job.id, error = %err, "cannot renew the compaction lease"),
                },
            }
        }
    }

    /// The compaction loop, under `lease`.
    async fn compact_leased<'a>(
        &self,
        job: &Job<'a>,
        lease: &Lease,
    ) -> Result<ModelView<'a>, CompactError> {
        job.tracker.refresh(job.id).await?;
        let mut adopted = job.tracker.compactions(job.id).await?;
        let mut view = project_view(job.request, job.tracked, &adopted);
        let mut estimate = self.count(job, &view);
        if job.done_by(&view, estimate) {
            return Ok(view);
        }
        let mut keep_only_last = false;
        let mut rescued = false;
        // The first record committed under the lease names the orphan it took over.
        let mut orphan = lease.orphan.clone();
        loop {
            let covered_before = view.live_start;
            let run = self.run_once(job, &view, estimate, keep_only_last);
            let mut record = match self.renewing(job, lease, run).await {
                // Nothing more to cut, but what is there fits: sent as it is.
                Err(CompactError::TooLarge { .. }) if estimate <= job.hard_limit() => {
                    return Ok(view);
                }
                Err(CompactError::TooLarge { .. })
                    if job.config.rescue && !job.detached && !rescued && view.rescue() =>
                {
                    // compaction.rescue: shortened tool bodies may let the last unit fit.
                    rescued = true;
                    estimate = self.count(job, &view);
                    self.metrics.add(VIEWS_RESCUED, &[], 1.0);
                    if estimate <= job.threshold {
                        return Ok(view);
                    }
                    continue;
                }
                Err(err @ CompactError::TooLarge { .. }) => {
                    return self.send_on_a_guess(job, view, estimate, err);
                }
                other => other?,
            };
            record.summary_calls = job.tally.as_ref().map_or(0, |tally| tally.take());
            record.took_over = orphan.take();
            let committed = job.tracker.commit_compaction(job.id, record, lease).await?;
            self.record_metrics(&committed, job);
            // A prepared compaction no request took, now overtaken, is wasted work.
            let overtaken = adopted
                .values()
                .filter(|a| a.record.id != committed.record.id && a.is_waiting() && a.retire())
                .count();
            if overtaken > 0 {
                self.metrics.add(PREPARED_WASTED, &[], overtaken as f64);
            }
            adopted.insert(committed.record.source.prefix_digest, committed);
            view = project_view(job.request, job.tracked, &adopted);
            if rescued {
                view.rescue();
            }
            view.validate()?;
            estimate = self.count(job, &view);
            // A manual or prepared run makes one pass: what it covers is what it was asked.
            if estimate <= job.threshold || matches!(job.reason, Reason::Manual | Reason::Prepared)
            {
                return Ok(view);
            }
            let last_unit = split_into_units(&view.live).len() <= 1;
            if keep_only_last || last_unit || view.live_start <= covered_before {
                // Compacted as far as it goes: over the aim, but what fits is sent.
                if estimate <= job.hard_limit() {
                    tracing::info!(conversation = %job.id, estimate, threshold = job.threshold, limit = job.hard_limit(), "the newest unit keeps the view over the trigger; it fits the input budget and is sent");
                    return Ok(view);
                }
                if job.config.rescue && !job.detached && !rescued && view.rescue() {
                    self.metrics.add(VIEWS_RESCUED, &[], 1.0);
                    estimate = self.count(job, &view);
                    if estimate <= job.hard_limit() {
                        return Ok(view);
                    }
                }
                let err = job.too_large(format!(
                    "after compaction the view is still {estimate} tokens, its newest unit {}",
                    self.last_unit_tokens(job, &view)
                ));
                return self.send_on_a_guess(job, view, estimate, err);
            }
            keep_only_last = true;
        }
    }

    /// The newest unit's tokens in `view`, as the upstream counts.
    fn last_unit_tokens(&self, job: &Job<'_>, view: &ModelView<'_>) -> u64 {
        let units = split_into_units(&view.live);
        let local: u64 = units.last().map_or(0, |u| {
            (u.start..u.end)
                .map(|i| view.live[i].token_count(&self.tokens, job.tokenizer))
                .sum()
        });
        job.scale.tokens(local)
    }

    /// `err` when the counts are trusted; the view as it is when they are a guess within
    /// a factor of two of the limit, so that the upstream, not handoff's estimate,
    /// decides (the reactive path recovers if it refuses).
    fn send_on_a_guess<'a>(
        &self,
        job: &Job<'_>,
        view: ModelView<'a>,
        estimate: u64,
        err: CompactError,
    ) -> Result<ModelView<'a>, CompactError> {
        // Not on a guess that is too far off: no model counts half of what tiktoken does.
        let plausible = estimate / 2 <= job.hard_limit();
        if job.counts_are_guesses() && plausible && job.reason != Reason::ContextLengthExceeded {
            tracing::warn!(conversation = %job.id, estimate, limit = job.hard_limit(), error = %err, "over the input budget by an uncalibrated count; sending and letting the upstream decide");
            return Ok(view);
        }
        Err(err)
    }

    pub(super) fn plan(
        &self,
        job: &Job<'_>,
        view: &ModelView<'_>,
        keep_only_last: bool,
    ) -> Result<Plan, CompactError> {
        // A history whose tool pairs are broken cannot be cut into valid units.
        job.request
            .dialect()
            .check_pairs(&view.live)
            .map_err(CompactError::Uncompactable)?;
        let units = split_into_units(&view.live);
        let unit_tokens: Vec<u64> = units
            .iter()
            .map(|u| {
                (u.start..u.end)
                    .map(|i| view.live[i].token_count(&self.tokens, job.tokenizer))
                    .sum()
            })
            .collect();
        let count = |m: &Message| m.token_count(&self.tokens, job.tokenizer);
        let pinned: u64 = view.pinned.iter().map(|m| count(m.message)).sum::<u64>()
            + view.lifted.iter().map(|m| count(m)).sum::<u64>();
        let scale = |local: u64| job.scale.tokens(local);
        let fixed = pinned + job.tools_tokens + REPLY_PRIMING;
        let last = unit_tokens.last().copied().unwrap_or(0);
        let pair_tokens = handoff_budget(&job.model) + 2 * MESSAGE_OVERHEAD + 64;
        if scale(fixed + last) > job.hard_limit() {
            return Err(job.too_large(format!(
                "pinned messages ({}) + tools ({}) + the newest unit ({}) = {} tokens",
                scale(pinned),
                scale(job.tools_tokens),
                scale(last),
                scale(fixed + last)
            )));
        }
        // The newest unit alone keeps the view over the aim: everything before it goes.
        let keep_only_last = keep_only_last || scale(fixed + pair_tokens + last) > job.threshold;
        // The user's words are never cut to keep a recent part: the pair is planned at
        // least as large as the user text it must carry, and a smaller recent part is
        // kept when that text is large.
        let carried_users: u64 = view
            .compaction
            .as_ref()
            .and_then(|adopted| adopted.record.ledger.as_ref())
            .map_or(0, |ledger| {
                let counter = self.tokens.counter(job.tokenizer);
                (ledger.instructions.iter())
                    .map(|text| counter.count_text(text) + USER_ITEM_TOKENS)
                    .sum()
            });
        let users_before = |cut: usize| -> u64 {
            carried_users
                + (view.live[..cut].iter())
                    .filter(|m| m.role == Role::User && m.is_text_message() && !m.is_tool_answer())
                    .map(|m| count(m) + USER_ITEM_TOKENS)
                    .sum::<u64>()
        };
        let dialect = job.request.dialect();
        let steps: &[f64] = if keep_only_last { &[0.0] } else { &KEEP_STEPS };
        let mut chosen = None;
        // A provider's compaction artefact is the provider's: no history handoff
        // compacts holds one, so it keeps its bytes and its place.
        let boundary = (view.live.iter())
            .position(Message::is_provider_compaction)
            .unwrap_or(view.live.len());
        for step in steps {
            let keep = ((job.keep_recent * step * job.input_budget as f64) as u64)
                .saturating_sub(job.keep_less);
            let allowed =
                |at: usize| at <= boundary && dialect.may_cut_at(job.request, &view.live, at);
            // A cut after `cut_from` where there is one (a preparation's: after what the
            // upstream has cached), any allowed cut otherwise.
            let past_cached = |at: usize| view.live_start + at >= job.cut_from && allowed(at);
            let cut = split_at_unit_boundary(&view.live, &units, &unit_tokens, keep, past_cached)
                .or_else(|| {
                    split_at_unit_boundary(&view.live, &units, &unit_tokens, keep, allowed)
                });
            let Some(cut) = cut else {
                break;
            };
            let recent: u64 = units
                .iter()
                .zip(&unit_tokens)
                .filter(|(u, _)| u.start >= cut)
                .map(|(_, t)| t)
                .sum();
            // Instruction messages of the new history are lifted into the view, not summarised.
            let lifted: u64 = view.live[..cut]
                .iter()
                .filter(|m| m.role.is_instruction())
                .map(count)
                .sum();
            let recent = recent + lifted;
            let users = users_before(cut).min(users_kept_whole(job.input_budget));
            let pair = pair_tokens.max(users + user_slack(&job.model) + 2 * MESSAGE_OVERHEAD + 64);
            let predicted = scale(fixed + pair + recent);
            chosen = Some(Plan {
                cut,
                predicted,
                rest: fixed + recent,
                fixed,
                users,
            });
            if predicted <= job.threshold {
                break;
            }
        }
        chosen.ok_or_else(|| {
            let total = scale(fixed + unit_tokens.iter().sum::<u64>());
            job.too_large(if units.len() <= 1 {
                format!("nothing left to compact: the view is one unit, {total} tokens")
            } else {
                format!(
                    "no cut of the view's {} units can open a valid recent part; it is {total} tokens",
                    units.len()
                )
            })
        })
    }

    /// The counter of what the request's model reads: its tokenizer, its calibration.
    pub(super) fn handoff_counter(
        &self,
        job: &Job<'_>,
    ) -> Arc<dyn handoff_plugin_api::TokenCounter> {
        Arc::new(ScaledCounter {
            inner: self.tokens.counter(job.tokenizer),
            scale: job.scale.clone(),
        })
    }

    /// Counts a committed compaction and its sizes.
    fn record_metrics(&self, committed: &Adopted, job: &Job<'_>) {
        let record = &committed.record;
        if let Some(prices) = job.prices {
            let tenant = job.id.tenant().as_str();
            for priced in super::spend::summary_calls(prices, record) {
                match priced {
                    Priced::Cost { price, usd } => {
                        let labels = [("price", price), ("tenant", tenant)];
                        self.metrics.add(SUMMARY_COST_USD, &labels, usd);
                    }
                    Priced::Unpriced(_) => self.metrics.add(UNPRICED_SUMMARY_CALLS, &[], 1.0),
                }
            }
        }
        self.metrics.add(
            "handoff_compactions_total",
            &[("strategy", &record.strategy), ("outcome", "committed")],
            1.0,
        );
        self.metrics.add(
            "handoff_compaction_tokens_removed_total",
            &[],
            record.tokens_before.saturating_sub(record.tokens_after) as f64,
        );
        tracing::info!(
            compaction = %record.id,
            strategy = %record.strategy,
            reason = ?record.reason,
            tokens_before = record.tokens_before,
            tokens_after = record.tokens_after,
            covered = record.source.end_exclusive,
            attempts = record.attempts.len(),
            "compaction committed"
        );
    }
}

/// Share of the input budget that the user's words may take in a handoff however
/// large the recent part: the plan keeps a smaller recent part for them. Past it (pasted
/// documents, a long session's worth of instructions) they are shortened to fit half
/// the trigger, so that the conversation keeps room to go on.
const USER_TEXT_SHARE: f64 = 0.25;

/// Local tokens of user text a handoff keeps whole however large the recent part.
pub(super) fn users_kept_whole(input_budget: u64) -> u64 {
    (input_budget as f64 * USER_TEXT_SHARE) as u64
}

/// Tokens a handoff carrying all the user's words needs past them: its headings, the
/// floor of tool results, the last assistant message (a third of the handoff budget).
pub(super) fn user_slack(model: &ModelInfo) -> u64 {
    handoff_budget(model) / 3
}

/// The largest handoff: `min(8192, window/10)` of the request model's window. A summary
/// model with a smaller window writes less (its own output budget bounds its reply),
/// but the deterministic fallback, and the ledger, still get the request model's room.
pub(crate) fn handoff_budget(model: &ModelInfo) -> u64 {
    8192.min(model.context_window / 10)
}
