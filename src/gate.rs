//! The cap on tracked requests in flight (`limits.max_concurrent_chat`): each holds a
//! whole body and its parsed form, so their number bounds memory. A request past the
//! cap waits in a short queue, for a second at most, then gets 503 with `Retry-After`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;

/// How long a queued request waits for a slot.
const QUEUE_WAIT: Duration = Duration::from_secs(1);

/// Slots for tracked requests, and the queue in front of them.
pub(crate) struct ChatGate {
    slots: Arc<Semaphore>,
    max: usize,
    waiting: AtomicUsize,
    queue: usize,
}

/// The answer past the cap.
fn busy(max: usize) -> ApiError {
    let mut err = ApiError::unavailable(format!(
        "handoff is handling its maximum of {max} requests (limits.max_concurrent_chat); retry shortly"
    ));
    err.retry_after = Some(1);
    err
}

impl ChatGate {
    /// `max` slots and a queue of `queue`.
    pub(crate) fn new(max: usize, queue: usize) -> Self {
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
            waiting: AtomicUsize::new(0),
            queue,
        }
    }

    /// A slot, held until dropped; 503 when none frees up in time.
    pub(crate) async fn enter(&self) -> Result<OwnedSemaphorePermit, ApiError> {
        let max = self.max;
        if let Ok(permit) = Arc::clone(&self.slots).try_acquire_owned() {
            return Ok(permit);
        }
        if self.waiting.fetch_add(1, Ordering::AcqRel) >= self.queue {
            self.waiting.fetch_sub(1, Ordering::AcqRel);
            return Err(busy(max));
        }
        let waited =
            tokio::time::timeout(QUEUE_WAIT, Arc::clone(&self.slots).acquire_owned()).await;
        self.waiting.fetch_sub(1, Ordering::AcqRel);
        match waited {
            Ok(Ok(permit)) => Ok(permit),
            _ => Err(busy(max)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn past_the_cap_and_the_queue_requests_are_refused_with_retry_after() {
        let gate = ChatGate::new(1, 0);
        let held = gate.enter().await.unwrap();
        let refused = gate.enter().await.unwrap_err();
        assert_eq!(refused.status, http::StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(refused.retry_after, Some(1));
        drop(held);
        assert!(gate.enter().await.is_ok(), "a freed slot is reused");
    }

    #[tokio::test]
    async fn a_queued_request_gets_the_next_free_slot() {
        let gate = Arc::new(ChatGate::new(1, 1));
        let held = gate.enter().await.unwrap();
        let waiter = {
            let gate = Arc::clone(&gate);
            tokio::spawn(async move { gate.enter().await.is_ok() })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        drop(held);
        assert!(waiter.await.unwrap());
    }
}
