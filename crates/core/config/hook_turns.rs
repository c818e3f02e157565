//! The turns of a hook that serves a few calls at once (an `exec` hook's one process):
//! its calls wait here, outside its time limit, so `timeout` measures the hook's own
//! work. Each tenant waits in a queue of its own, at most `queue` calls long and at
//! most `queue_wait`, and the queues are served in turn: one tenant's load delays
//! another's call by about one call per busy tenant, never by its whole backlog.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::oneshot;

/// A hook's turns.
#[derive(Debug)]
pub struct HookTurns {
    /// Calls served at once.
    capacity: usize,
    /// Calls one tenant may have waiting.
    queue: usize,
    /// The longest a call waits for its turn.
    queue_wait: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    running: usize,
    /// The tenants with calls waiting, in the order they are served, each with its
    /// calls in arrival order.
    waiting: VecDeque<(String, VecDeque<oneshot::Sender<()>>)>,
}

/// Why a call got no turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum NoTurn {
    /// Its tenant has `queue` calls waiting already.
    #[error("its tenant has {0} calls waiting for this hook already")]
    QueueFull(usize),
    /// It waited `queue_wait`.
    #[error("no turn within {0:?}")]
    Waited(Duration),
}

/// A call's turn: the next waiting call gets it when this is dropped.
#[derive(Debug)]
pub struct Turn(Arc<HookTurns>);

impl HookTurns {
    /// Turns for `capacity` calls at once, `queue` waiting calls per tenant, each
    /// waiting at most `queue_wait`.
    pub fn new(capacity: usize, queue: usize, queue_wait: Duration) -> Self {
        Self {
            capacity: capacity.max(1),
            queue,
            queue_wait,
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is consistent between statements: a panic elsewhere leaves it usable.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a turn of `tenant`'s.
    pub async fn take(self: &Arc<Self>, tenant: &str) -> Result<Turn, NoTurn> {
        let mut receiver = {
            let mut state = self.state();
            if state.running < self.capacity && state.waiting.is_empty() {
                state.running += 1;
                return Ok(Turn(Arc::clone(self)));
            }
            let (sender, receiver) = oneshot::channel();
            match state.waiting.iter_mut().find(|(t, _)| t == tenant) {
                Some((_, calls)) if calls.len() >= self.queue => {
                    return Err(NoTurn::QueueFull(self.queue))
                }
                Some((_, calls)) => calls.push_back(sender),
                None if self.queue == 0 => return Err(NoTurn::QueueFull(0)),
                None => state
                    .waiting
                    .push_back((tenant.to_owned(), VecDeque::from([sender]))),
            }
            receiver
        };
        match tokio::time::timeout(self.queue_wait, &mut receiver).await {
            Ok(Ok(())) => Ok(Turn(Arc::clone(self))),
            _ => {
                // A turn handed over as the wait ended is this call's to give back.
                receiver.close();
                if receiver.try_recv().is_ok() {
                    drop(Turn(Arc::clone(self)));
                }
                Err(NoTurn::Waited(self.queue_wait))
            }
        }
    }

    /// Hands a finished call's turn to the next tenant's first waiting call, or frees it.
    fn pass_on(&self) {
        let mut state = self.state();
        while let Some((tenant, mut calls)) = state.waiting.pop_front() {
            let next = calls.pop_front();
            if !calls.is_empty() {
                state.waiting.push_back((tenant, calls));
            }
            // A call that stopped waiting has dropped its receiver: try the next.
            if next.is_some_and(|call| call.send(()).is_ok()) {
                return;
            }
        }
        state.running = state.running.saturating_sub(1);
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.0.pass_on();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn turns(queue: usize) -> Arc<HookTurns> {
        Arc::new(HookTurns::new(1, queue, Duration::from_secs(60)))
    }

    #[tokio::test(start_paused = true)]
    async fn tenants_are_served_in_turn_not_in_arrival_order() {
        let turns = turns(8);
        let first = turns.take("a").await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut calls = Vec::new();
        for tenant in ["a", "a", "a", "b"] {
            let (turns, order) = (Arc::clone(&turns), Arc::clone(&order));
            calls.push(tokio::spawn(async move {
                let _turn = turns.take(tenant).await.unwrap();
                order.lock().unwrap().push(tenant);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        for call in calls {
            call.await.unwrap();
        }
        assert_eq!(*order.lock().unwrap(), ["a", "b", "a", "a"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_tenant_s_queue_is_bounded_and_a_wait_ends() {
        let turns = Arc::new(HookTurns::new(1, 1, Duration::from_millis(50)));
        let held = turns.take("a").await.unwrap();
        let waiting = tokio::spawn({
            let turns = Arc::clone(&turns);
            async move { turns.take("a").await.map(drop) }
        });
        tokio::task::yield_now().await;
        assert_eq!(turns.take("a").await.unwrap_err(), NoTurn::QueueFull(1));
        assert_eq!(
            waiting.await.unwrap().unwrap_err(),
            NoTurn::Waited(Duration::from_millis(50))
        );
        drop(held);
        // The turn that no waiting call took is free again.
        assert!(turns.take("b").await.is_ok());
    }
}
