//! One compaction's job: what it works on ([`Job`]), the parts every job runs with
//! ([`Compactor`]), and how it ends ([`Fitted`], [`FitError`], [`CompactError`]).
//!
//! The files of this folder are functions over these values: [`super::run`] makes one
//! record, [`super::max_wait`] waits for a detached run or stands in for it, and
//! [`super::service`] holds the entry points (fit, compact) that call them.

use std::sync::Arc;

use handoff_plugin_api::{CancellationToken, ModelClient, ModelInfo};

use super::background::Background;
use super::budget::{Margin, RequestBudget, Scale};
use super::chain::Chain;
use super::model_client::Tally;
use super::summary_count::SummaryCalibrations;
use crate::base::record::Reason;
use crate::config::{CompactionConfig, Tokenizer};
use crate::conversation::{ConversationId, Tracked, Tracker};
use crate::dialect::{ChatRequest, DialectError};
use crate::metrics::Metrics;
use crate::projection::{project_view, ModelView, ProjectionError};
use crate::store::StoreError;
use crate::tokens::Tokens;

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
    pub(super) fn done_by(&self, view: &ModelView<'_>, estimate: u64) -> bool {
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
    pub(super) fn too_large(&self, what: String) -> CompactError {
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
    /// The view's calibrated estimate: the count every decision is made with.
    pub(super) fn count(&self, tokens: &Tokens, view: &ModelView<'_>) -> u64 {
        let local = view.estimate(tokens, self.tokenizer, self.tools_tokens);
        self.scale.view(local, view.compact_id())
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

    /// The view from the store's latest compactions, if it already needs no run.
    pub(super) async fn already_done(
        &self,
        tokens: &Tokens,
    ) -> Result<Option<ModelView<'a>>, CompactError> {
        self.tracker.refresh(self.id).await?;
        let adopted = self.tracker.compactions(self.id).await?;
        let view = project_view(self.request, self.tracked, &adopted);
        let estimate = self.count(tokens, &view);
        Ok(self.done_by(&view, estimate).then_some(view))
    }

    /// This job with another chain: what a stand-in runs.
    pub(super) fn with_chain(&self, chain: Chain) -> Self {
        Self {
            tracker: self.tracker,
            id: self.id,
            request: self.request,
            tracked: self.tracked,
            config: self.config,
            tokenizer: self.tokenizer,
            summary_tokenizer: self.summary_tokenizer,
            reasoning_marker: self.reasoning_marker,
            model: self.model.clone(),
            input_budget: self.input_budget,
            threshold: self.threshold,
            scale: self.scale.clone(),
            tools_tokens: self.tools_tokens,
            reason: self.reason,
            seen_compact_id: self.seen_compact_id.clone(),
            client: Arc::clone(&self.client),
            chain,
            waits_for_running: self.waits_for_running,
            detached: self.detached,
            keep_less: self.keep_less,
            continuer: self.continuer.clone(),
            cut_from: self.cut_from,
            keep_recent: self.keep_recent,
            prices: self.prices,
            tally: self.tally.clone(),
        }
    }
}

/// Runs compactions: the parts every job shares (its entry points are in
/// [`super::service`]).
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
    pub(crate) fn as_is(view: ModelView<'a>, local: u64, current: u64) -> Self {
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
