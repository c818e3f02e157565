//! A compaction's CPU work, run on the blocking pool. A 200k-token history takes tens
//! of milliseconds to build a ledger for, fit it and extract a handoff from; on a
//! worker thread that would hold every other connection the thread serves (all of
//! them, with `workers = N`).

/// Runs `work` on the blocking pool; `None` (logged) if it panicked, so the caller
/// goes on without its result.
pub(super) async fn run<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let scope = crate::cache_scope::current();
    match tokio::task::spawn_blocking(move || crate::cache_scope::within_sync(scope, work)).await {
        Ok(value) => Some(value),
        Err(err) => {
            tracing::error!(error = %err, "a compaction's work on the blocking pool failed");
            None
        }
    }
}
