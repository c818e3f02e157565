//! What a tracker does because it may not be alone: the in-process lock that makes a
//! conversation's compactions single flight, and, with a shared store, catching up
//! with what other replicas wrote and the lease that makes compactions single flight
//! across them.

use std::sync::Arc;

use tokio::sync::Mutex;

use super::{ConversationId, ConversationState, Tracker};
use crate::store::{Lease, StoreError};

impl Tracker {
    /// Waits for, and holds, the conversation's compaction lock in this process.
    pub(crate) async fn single_flight(
        &self,
        id: &ConversationId,
    ) -> tokio::sync::OwnedMutexGuard<()> {
        let lock = {
            let mut flights = self
                .flights
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            // Only conversations with a run or a waiter keep an entry.
            flights.retain(|_, lock| lock.strong_count() > 0);
            match flights.get(id).and_then(std::sync::Weak::upgrade) {
                Some(lock) => lock,
                None => {
                    let lock = Arc::new(Mutex::new(()));
                    flights.insert(id.clone(), Arc::downgrade(&lock));
                    lock
                }
            }
        };
        lock.lock_owned().await
    }

    /// True while a compaction of the conversation runs: in this process (its lock is
    /// held), or, with a shared store, on any replica (its lease is live). A store that
    /// cannot say counts as not running: the caller then compacts, single flight.
    pub(crate) async fn compaction_running(&self, id: &ConversationId) -> bool {
        let local = {
            let flights = self
                .flights
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            flights
                .get(id)
                .and_then(std::sync::Weak::upgrade)
                .is_some_and(|lock| lock.try_lock().is_err())
        };
        if local || !self.store.shared() {
            return local;
        }
        self.store.leased(id).await.unwrap_or_else(|err| {
            tracing::warn!(conversation = %id, error = %err, "cannot read the compaction lease");
            false
        })
    }

    /// Folds in what other replicas wrote to a shared store since this one last read
    /// the conversation; nothing to do (and no I/O) for a store with one writer.
    pub(super) async fn catch_up(
        &self,
        id: &ConversationId,
        state: &mut ConversationState,
    ) -> Result<(), StoreError> {
        if self.store.shared() {
            let log = self.store.read_after(id, state.seen).await?;
            state.absorb(&log);
        }
        Ok(())
    }

    /// Brings the conversation's cached state up to date with the store: compactions
    /// another replica committed become visible.
    pub(crate) async fn refresh(&self, id: &ConversationId) -> Result<(), StoreError> {
        if !self.store.shared() {
            return Ok(());
        }
        let entry = self.entry(id).await?;
        let mut state = entry.lock().await;
        self.catch_up(id, &mut state).await
    }

    /// Claims the conversation's compaction across replicas; `None` while another
    /// replica's live claim holds it.
    pub async fn acquire(&self, id: &ConversationId) -> Result<Option<Lease>, StoreError> {
        self.store.acquire(id, self.lease_ttl).await
    }

    /// Keeps `lease` alive while a compaction runs; false once it was lost.
    pub async fn renew(&self, id: &ConversationId, lease: &Lease) -> Result<bool, StoreError> {
        self.store.renew(id, lease, self.lease_ttl).await
    }

    /// Gives `lease` up.
    pub async fn release(&self, id: &ConversationId, lease: &Lease) {
        if let Err(err) = self.store.release(id, lease).await {
            // It expires by itself; another replica merely waits longer.
            tracing::warn!(conversation = %id, error = %err, "cannot release a compaction lease");
        }
    }

    /// How long a lease lasts without renewal.
    pub fn lease_ttl(&self) -> std::time::Duration {
        self.lease_ttl
    }
}
