//! `compaction.max_wait`: the longest a request waits for a model-written summary.
//!
//! A request that must compact, or must wait for its conversation's running compaction
//! because no view within the input budget exists without it, has that run on a task
//! of its own and waits for it until a deadline: the later of its arrival and the run's
//! start, plus `max_wait`. Past it, the request is sent with a *stand-in*: the chain's
//! deterministic strategies run over the same history, for this request alone, and the
//! record is logged as a `stand_in` line (never committed, so never adopted). The run
//! goes on; its summary commits when it lands, and the requests after adopt it.
//!
//! Only a run this process started on its own task is waited for this way: a waiter on
//! another replica's lease, or on a run a request holds inline (a reactive retry, a
//! manual compaction), waits for it as before.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::budget::{RequestBudget, Scale};
use super::chain::Chain;
use super::job::{CompactError, Compactor, Fitted, Job};
use super::run::run_once;
use super::Adopted;
use crate::base::digest::PrefixDigest;
use crate::base::line::{Entry, Line, StandInLine};
use crate::base::record::Attempt;
use crate::conversation::Tracked;
use crate::dialect::ChatRequest;
use crate::metrics::STAND_INS;
use crate::projection::{project_view, ModelView};

/// How a wait within `compaction.max_wait` ended.
pub(super) enum Waited<'a> {
    /// A committed compaction made a view that fits.
    Done(ModelView<'a>),
    /// The summary ran past the deadline: the view with a stand-in handoff.
    StandIn(ModelView<'a>),
    /// The run ended without a view that fits (it failed, or was stale), or no stand-in
    /// could be made: the caller compacts inline, as without `max_wait`.
    Ended,
}

/// The chain's strategies that call no model, when one that does comes first: what a
/// stand-in is made with. `None` when the chain has no such pair.
pub(super) fn stand_in_chain(chain: &Chain) -> Option<Chain> {
    let first_calls_a_model = chain
        .first()
        .is_some_and(|s| !s.strategy.is_deterministic());
    let deterministic: Chain = chain
        .iter()
        .filter(|s| s.strategy.is_deterministic())
        .cloned()
        .collect();
    (first_calls_a_model && !deterministic.is_empty()).then_some(deterministic)
}

/// The view of `request` on its conversation's last stand-in, when that covers more
/// than the compactions of `pool` (projected, it is the one the view ends on) and
/// makes a valid view: a stand-in is taken by the requests after it as a committed
/// handoff is, and the next one is built on it. A summary that lands covering less
/// does not break the chain: taking it then would need a stand-in built on the
/// summary, which keeps less of what the fallback's chain keeps.
pub(super) fn on_last_stand_in<'a>(
    compactor: &Compactor,
    request: &'a ChatRequest,
    tracked: &'a Tracked,
    pool: &HashMap<PrefixDigest, Arc<Adopted>>,
) -> Option<ModelView<'a>> {
    let last = compactor.background.last_stand_in(&tracked.id)?;
    let mut with_last = pool.clone();
    with_last.insert(last.record.source.prefix_digest, Arc::clone(&last));
    let on_last = project_view(request, tracked, &with_last);
    (on_last.compact_id() == Some(last.record.id.as_str()) && on_last.validate().is_ok())
        .then_some(on_last)
}

/// The request (its view over the trigger) on the conversation's last stand-in, when
/// that keeps it under the trigger: taken turn after turn as the fallback's
/// committed handoff would be, and replaced only when the view on it crosses the
/// trigger, so each stand-in keeps verbatim what the fallback's view would.
pub(super) fn on_stand_in<'a>(
    compactor: &Compactor,
    (request, tracked): (&'a ChatRequest, &'a Tracked),
    budget: &RequestBudget,
    scale: &Scale,
) -> Option<Fitted<'a>> {
    let on = on_last_stand_in(compactor, request, tracked, &tracked.compactions)?;
    let local = on.estimate(&compactor.tokens, budget.tokenizer(), budget.tools_tokens);
    let current = scale.view(local, on.compact_id());
    (current <= budget.threshold).then(|| {
        tracing::info!(conversation = %tracked.id, estimate = current, stand_in = ?on.compact_id(), "the summary still runs; sent on the last stand-in");
        Fitted {
            stood_in: true,
            ..Fitted::as_is(on, local, current)
        }
    })
}

/// Waits for the conversation's run on its own task until `max_wait` past the later
/// of `arrived` and the run's start; then makes the stand-in view for `view`
/// (estimated at `estimate`).
pub(super) async fn within_max_wait<'a>(
    compactor: &Compactor,
    job: &Job<'a>,
    view: &ModelView<'a>,
    estimate: u64,
    arrived: Instant,
    max_wait: Duration,
) -> Result<Waited<'a>, CompactError> {
    let Some(started) = compactor.background.started(job.id) else {
        return done_or_ended(compactor, job).await;
    };
    // A summariser measured slower than max_wait is not waited for at all: the
    // stand-in would come anyway, max_wait later.
    let slower = (compactor.pace.latency(&job.model.summary_model)).is_some_and(|l| l > max_wait);
    let deadline = match slower {
        true => arrived,
        false => arrived.max(started + max_wait),
    };
    loop {
        let ended = compactor.background.ended();
        tokio::pin!(ended);
        ended.as_mut().enable();
        if let Some(view) = job.already_done(&compactor.tokens).await? {
            return Ok(Waited::Done(view));
        }
        if !compactor.background.is_running(job.id) {
            return done_or_ended(compactor, job).await;
        }
        tokio::select! {
            () = &mut ended => {}
            () = tokio::time::sleep_until(deadline) => {
                return stand_in(compactor, job, view, estimate, arrived).await;
            }
            () = compactor.cancel.cancelled() => return Err(CompactError::Cancelled),
        }
    }
}

async fn done_or_ended<'a>(
    compactor: &Compactor,
    job: &Job<'a>,
) -> Result<Waited<'a>, CompactError> {
    Ok(match job.already_done(&compactor.tokens).await? {
        Some(view) => Waited::Done(view),
        None => Waited::Ended,
    })
}

/// The view of `job`'s request with a stand-in handoff: the deterministic strategies
/// over the history the summary is written from, logged before it is sent. A stand-in
/// that cannot be logged, or leaves the view over the input budget, is not used.
async fn stand_in<'a>(
    compactor: &Compactor,
    job: &Job<'a>,
    view: &ModelView<'a>,
    estimate: u64,
    arrived: Instant,
) -> Result<Waited<'a>, CompactError> {
    let Some(chain) = stand_in_chain(&job.chain) else {
        return Ok(Waited::Ended);
    };
    let waited = arrived.elapsed();
    let stand_in_job = job.with_chain(chain);
    // Built on the last stand-in while it covers more than the committed compactions:
    // only what arrived since is compacted, not the whole span again.
    let mut pool = job.tracker.compactions(job.id).await?;
    let on_last = on_last_stand_in(compactor, job.request, job.tracked, &pool);
    let (base, before) = match &on_last {
        Some(on_last) => (on_last, job.count(&compactor.tokens, on_last)),
        None => (view, estimate),
    };
    let mut record = run_once(compactor, &stand_in_job, base, before, false).await?;
    // What the record would have been made with, and why it was not.
    if let Some(first) = job.chain.first() {
        record.chain = job.chain.iter().map(|s| s.name.clone()).collect();
        record.attempts.insert(
            0,
            Attempt {
                strategy: first.name.clone(),
                outcome: "pending".to_owned(),
                reason: Some("max_wait".to_owned()),
                error: Some(format!(
                    "still running after compaction.max_wait ({} ms); it is adopted when it lands",
                    job.config.max_wait.as_millis()
                )),
                usage: None,
                calls: None,
                model: None,
                duration_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
            },
        );
    }
    let adopted = Arc::new(Adopted::new(record.clone()).map_err(crate::store::StoreError::from)?);
    pool.insert(adopted.record.source.prefix_digest, Arc::clone(&adopted));
    let stood_in = project_view(job.request, job.tracked, &pool);
    stood_in.validate()?;
    let after = job.scale.view(
        stood_in.estimate(&compactor.tokens, job.tokenizer, job.tools_tokens),
        stood_in.compact_id(),
    );
    if after > job.hard_limit() {
        tracing::warn!(conversation = %job.id, estimate = after, limit = job.hard_limit(), "the stand-in leaves the view over the input budget; waiting for the summary");
        return Ok(Waited::Ended);
    }
    let line = Line::now(Entry::StandIn(StandInLine {
        head: job.tracked.head(),
        waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
        record: Box::new(record),
    }));
    if let Err(err) = job.tracker.store().append(job.id, vec![line]).await {
        // A view the log cannot explain is not sent.
        tracing::warn!(conversation = %job.id, error = %err, "cannot log the stand-in; waiting for the summary");
        return Ok(Waited::Ended);
    }
    compactor.background.keep_stand_in(job.id, adopted);
    compactor.metrics.add(STAND_INS, &[], 1.0);
    super::traced::stand_in(waited);
    tracing::info!(conversation = %job.id, waited_ms = waited.as_millis() as u64, estimate = after, "the summary ran past compaction.max_wait; sent with a stand-in");
    Ok(Waited::StandIn(stood_in))
}
