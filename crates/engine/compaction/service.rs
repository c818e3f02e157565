//! The entry points of compaction, as methods of [`Compactor`]: `fit` (the proactive
//! path every request takes), `compact` (one run: cut, chain, commit, re-project), and
//! the runs on their own tasks (`spawn`, `detach`).
//!
//! Runs are single flight per conversation (the tracker's flight lock, and the store's
//! lease across replicas): a request
//! that waited re-projects first and finds the committed handoff. The loop guard works
//! on progress, not on a count: a run that leaves the view over the trigger is retried
//! once with only the last unit kept, and after that the answer is a 400 with numbers.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::context::FutureExt as _;

use super::background::Ticket;
use super::budget::{RequestBudget, Scale};
use super::job::{CompactError, Compactor, FitError, Fitted, Job};
use super::max_wait::{self, stand_in_chain, Waited};
use super::model_client::Tally;
use super::prepare::{
    settled_view, Preparation, PREPARED, PREPARED_ADOPTED, PREPARED_WAITED, PREPARED_WASTED,
    SENT_WHILE_PREPARING,
};
use super::run::run_once;
use super::spend::Priced;
use super::unit::split_into_units;
use super::Adopted;
use crate::base::line::{AdoptLine, Entry, Line, RescueLine};
use crate::base::record::Reason;
use crate::config::Tokenizer;
use crate::conversation::{Tracked, Tracker};
use crate::dialect::ChatRequest;
use crate::metrics::{SUMMARY_COST_USD, UNPRICED_SUMMARY_CALLS, VIEWS_RESCUED};
use crate::projection::{project_view, ModelView};
use crate::store::{Lease, StoreError};
use crate::tokens::Tokens;

/// How often a request waiting for another replica's compaction looks again.
const LEASE_POLL: std::time::Duration = std::time::Duration::from_millis(200);

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
            if let Some(fitted) = max_wait::on_stand_in(self, (request, tracked), budget, &scale) {
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
                super::traced::prepared(true);
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
        max_wait::within_max_wait(self, &waiting, view, estimate, arrived, max_wait).await
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
        super::traced::prepared(false);
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
        let Some(span) = super::traced::open(job) else {
            return self.compact_untraced(job).await;
        };
        let cx = span.context().clone();
        let result = self.compact_untraced(job).with_context(cx).await;
        super::traced::close(&span, &result);
        result
    }

    /// [`Self::compact`], in whatever span is current.
    async fn compact_untraced<'a>(&self, job: &Job<'a>) -> Result<ModelView<'a>, CompactError> {
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
            if let Some(view) = job.already_done(&self.tokens).await? {
                return Ok(view);
            }
            if started.elapsed() > patience {
                return Err(CompactError::Busy(patience.as_secs()));
            }
            if !waiting {
                crate::telemetry::spans::note(|| {
                    vec![opentelemetry::KeyValue::new(
                        "handoff.compaction.waited_for_lease",
                        true,
                    )]
                });
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
                match job.already_done(&self.tokens).await? {
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
        let mut estimate = job.count(&self.tokens, &view);
        if job.done_by(&view, estimate) {
            return Ok(view);
        }
        let mut keep_only_last = false;
        let mut rescued = false;
        // The first record committed under the lease names the orphan it took over.
        let mut orphan = lease.orphan.clone();
        loop {
            let covered_before = view.live_start;
            let run = run_once(self, job, &view, estimate, keep_only_last);
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
                    estimate = job.count(&self.tokens, &view);
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
            estimate = job.count(&self.tokens, &view);
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
                    estimate = job.count(&self.tokens, &view);
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
        super::traced::committed(record);
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

    /// Runs `preparation` on its own task, holding `ticket` until it ends.
    pub fn spawn(&self, preparation: Preparation, ticket: Ticket) {
        let compactor = self.clone();
        let metrics = Arc::clone(&self.metrics);
        let prepared = preparation.reason == Reason::Prepared;
        if prepared {
            metrics.add(PREPARED, &[("outcome", "started")], 1.0);
        }
        // Its spans hang from the request that started it, which may end first.
        let cx = opentelemetry::Context::current();
        crate::cache_scope::spawn(async move {
            let _ticket = ticket;
            let outcome = compactor.run_detached(&preparation).with_context(cx).await;
            if prepared {
                metrics.add(PREPARED, &[("outcome", outcome)], 1.0);
            }
        });
    }

    /// Runs `p`'s compaction; what became of it, for the `prepared` counter.
    async fn run_detached(&self, p: &Preparation) -> &'static str {
        let mut job = Job::new(
            &p.tracker,
            &p.request,
            &p.tracked,
            &p.config.compaction,
            &p.budget,
            Arc::clone(&p.client),
            Arc::clone(&p.chain),
        );
        job.reason = p.reason;
        job.detached = true;
        job.keep_less = p.keep_less;
        job.continuer = p.continuer.clone();
        job.prices = Some(&p.config.prices);
        job.cut_from = p.cut_from;
        job.seen_compact_id = p.seen_compact_id.clone();
        match self.compact(&job).await {
            Ok(view) => {
                let made = view.compaction.as_ref().is_some_and(|a| match p.reason {
                    Reason::Prepared => a.record.reason == Reason::Prepared && a.is_waiting(),
                    _ => Some(&a.record.id) != p.seen_compact_id.as_ref(),
                });
                if made && p.reason != Reason::Prepared {
                    tracing::info!(conversation = %p.tracked.id, "the detached compaction committed");
                    "committed"
                } else if made {
                    tracing::info!(conversation = %p.tracked.id, "compaction prepared in the background");
                    "committed"
                } else {
                    "stale"
                }
            }
            Err(err) => {
                tracing::warn!(conversation = %p.tracked.id, error = %err, "background preparation failed; the request that crosses the trigger compacts inline");
                "failed"
            }
        }
    }

    /// Starts `detached` (this request's compaction, owned) on its own task unless the
    /// conversation has one running here already; false when neither runs it.
    pub(super) fn detach(
        &self,
        id: &crate::conversation::ConversationId,
        detached: Option<Preparation>,
    ) -> bool {
        if self.background.is_running(id) {
            return true;
        }
        let Some(run) = detached else {
            return false;
        };
        match self.background.start_detached(id) {
            Ok(ticket) => {
                self.spawn(run, ticket);
                true
            }
            // Started by another request between the look and now: that one is waited for.
            Err(_) => self.background.is_running(id),
        }
    }
}
