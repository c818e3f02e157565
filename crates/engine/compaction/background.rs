//! The compactions running on their own tasks (preparations, and the runs
//! `compaction.max_wait` detaches), one per conversation under a global cap, and each
//! conversation's last stand-in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::Adopted;
use crate::conversation::ConversationId;

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
