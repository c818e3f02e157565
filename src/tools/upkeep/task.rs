//! The serving process's upkeep loop: at start it deletes what a crash left in the
//! store's scratch space; then every `store.upkeep_interval` it prunes by the retention
//! policy and compresses the conversations idle for `store.compress_after`, both
//! paced. With a shared store it also follows the tombstones other processes write,
//! so that its caches forget what they erased.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::state::AppState;

/// How often a replica reads the tombstones other processes wrote.
const TOMBSTONE_POLL: Duration = Duration::from_secs(1);

/// The first pass runs this long after start, off the start's own work.
const FIRST_PASS: Duration = Duration::from_secs(5);

/// Starts the loops on the current runtime; they end at shutdown.
pub(crate) fn spawn(state: Arc<AppState>) {
    let upkeep = Arc::clone(&state);
    tokio::spawn(async move {
        let store = Arc::clone(upkeep.tracker.store());
        if let Err(err) = store.sweep(true).await {
            tracing::warn!(error = %err, "cannot clear the store's upkeep folder");
        }
        let mut wait = FIRST_PASS.min(upkeep.snapshot().config.store.upkeep_interval);
        loop {
            tokio::select! {
                () = upkeep.shutdown.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
            pass(&upkeep).await;
            wait = upkeep.snapshot().config.store.upkeep_interval;
        }
    });
    if state.tracker.store().shared() {
        tokio::spawn(follow_tombstones(state));
    }
}

/// One pass: prune, compress, sweep; each logged, none fatal.
async fn pass(state: &AppState) {
    let snap = state.snapshot();
    let store = Arc::clone(state.tracker.store());
    let policy = super::Policy::of(&snap.config);
    if policy.prunes() {
        let options = super::PruneOptions {
            paced: true,
            ..super::PruneOptions::default()
        };
        match super::prune(&store, Some(state), &policy, &options, "retention").await {
            Ok(report) if !report.pruned.is_empty() => tracing::info!(
                conversations = report.pruned.len(),
                bytes = report.bytes,
                held = report.held.len(),
                "pruned conversations past their retention"
            ),
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "retention could not prune"),
        }
    }
    if let Some(after) = snap.config.store.compress_after {
        match super::compress_idle(&store, after, true).await {
            Ok(report) if report.conversations > 0 => {
                state
                    .metrics
                    .add(crate::metrics::COMPRESSED, &[], report.conversations as f64);
                state.metrics.add(
                    crate::metrics::COMPRESSED_SAVED,
                    &[],
                    report.before.saturating_sub(report.after) as f64,
                );
                tracing::info!(
                    conversations = report.conversations,
                    before = report.before,
                    after = report.after,
                    "compressed idle conversations"
                );
            }
            Ok(_) => {}
            Err(err) => tracing::warn!(error = %err, "cannot compress idle conversations"),
        }
    }
    if let Err(err) = store.sweep(false).await {
        tracing::warn!(error = %err, "cannot clear the store's upkeep folder");
    }
}

/// Evicts what other processes erased or pruned, as their tombstones arrive.
async fn follow_tombstones(state: Arc<AppState>) {
    let store = Arc::clone(state.tracker.store());
    // Only what is erased from now on: this process cached nothing before.
    let mut seen = 0;
    while let Ok(older) = store.tombstones_after(seen).await {
        match older.iter().map(|t| t.seq).max() {
            Some(last) => seen = last,
            None => break,
        }
    }
    loop {
        tokio::select! {
            () = state.shutdown.cancelled() => return,
            () = tokio::time::sleep(TOMBSTONE_POLL) => {}
        }
        let tombstones = match store.tombstones_after(seen).await {
            Ok(tombstones) => tombstones,
            Err(err) => {
                tracing::debug!(error = %err, "cannot read tombstones");
                continue;
            }
        };
        let mut gone = HashSet::new();
        for tombstone in &tombstones {
            seen = seen.max(tombstone.seq);
            let Ok(tenant) = crate::tenant::TenantId::parse(&tombstone.tenant) else {
                continue;
            };
            for name in &tombstone.conversations {
                if let Ok(id) = crate::base::id::ConversationId::parse(tenant.clone(), name) {
                    state.tracker.forget_with(&id, async {}).await;
                    gone.insert(id);
                }
            }
        }
        if !gone.is_empty() {
            super::forget(&state, &gone);
        }
    }
}
