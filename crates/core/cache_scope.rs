//! Whose caches a piece of work reads. Every cache keyed by content (parsed messages,
//! memos of recent bodies, token counts, neutral forms, ownership verdicts) mixes the
//! scope of the tenant the work is for into its keys, so a request never finds what
//! another tenant's left, and its timing cannot tell whether another tenant just sent
//! a text. A tenant's scope changes when one of its conversations is erased: nothing
//! it sent before then answers faster after.
//!
//! The scope rides with the request's task ([`within`]); work moved to another task or
//! the blocking pool takes it along ([`spawn`], [`within_sync`]). Work outside any
//! scope (startup, upkeep) reads under scope 0, which no tenant's request has.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Mutex, OnceLock, PoisonError};

use handoff_base::chunks::keyed_hash;

tokio::task_local! {
    static SCOPE: u64;
}

/// The epoch of each tenant that had a conversation erased (others are at 0): kept
/// only for erasures, so the map grows with them, never with traffic.
fn epochs() -> &'static Mutex<HashMap<String, u64>> {
    static EPOCHS: OnceLock<Mutex<HashMap<String, u64>>> = OnceLock::new();
    EPOCHS.get_or_init(Mutex::default)
}

/// The scope of `tenant`'s work now: a keyed hash of the tenant and its epoch, never 0.
pub fn of(tenant: &str) -> u64 {
    let epoch = epochs()
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(tenant)
        .copied()
        .unwrap_or(0);
    let mut bytes = Vec::with_capacity(tenant.len() + 9);
    bytes.extend_from_slice(&epoch.to_le_bytes());
    bytes.push(0);
    bytes.extend_from_slice(tenant.as_bytes());
    (keyed_hash(&bytes) as u64) | 1
}

/// Moves `tenant` to a new scope: what its requests left in the caches is never found
/// again, and ages out.
pub fn forget(tenant: &str) {
    let mut epochs = epochs().lock().unwrap_or_else(PoisonError::into_inner);
    *epochs.entry(tenant.to_owned()).or_insert(0) += 1;
}

/// The scope of the running work; 0 outside any.
pub fn current() -> u64 {
    SCOPE.try_with(|scope| *scope).unwrap_or(0)
}

/// Runs `work` under `scope`.
pub async fn within<F: Future>(scope: u64, work: F) -> F::Output {
    SCOPE.scope(scope, work).await
}

/// Runs `work` (synchronous: on the blocking pool) under `scope`.
pub fn within_sync<R>(scope: u64, work: impl FnOnce() -> R) -> R {
    SCOPE.sync_scope(scope, work)
}

/// Spawns `work` on a task of its own, under the running work's scope.
pub fn spawn<F>(work: F) -> tokio::task::JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    tokio::spawn(within(current(), work))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn each_tenant_has_its_own_scope_and_an_erasure_moves_it() {
        let (a, b) = (of("scope-test-a"), of("scope-test-b"));
        assert_ne!(a, b);
        assert_eq!(of("scope-test-a"), a, "stable between erasures");
        assert_eq!(current(), 0);
        assert_eq!(within(a, async { current() }).await, a);
        assert_eq!(
            within(a, async { spawn(async { current() }).await.ok() }).await,
            Some(a)
        );
        forget("scope-test-a");
        assert_ne!(of("scope-test-a"), a);
        assert_eq!(of("scope-test-b"), b);
    }
}
