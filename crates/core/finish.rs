//! Work that must run to its end whatever its caller does (logging a reply), without a
//! task of its own in the usual case.
//!
//! Spawning such work costs every request a task: its allocation, a trip through the
//! scheduler and a wake-up of the caller when it is done. [`Finish`] is polled in place
//! by whoever awaits it instead, and only when that caller drops it unfinished (the
//! client left, the connection closed) is the rest spawned, so it still runs to its
//! end. A panic in the work is caught and reported, as a task's would be.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use futures_util::future::{BoxFuture, CatchUnwind, FutureExt};

/// Why a [`Finish`] has no output.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Unfinished {
    /// The work panicked.
    #[error("the work panicked")]
    Panicked,
    /// It was polled again after it had ended.
    #[error("the work was polled after it had ended")]
    Ended,
}

/// Work polled in place, spawned on the current runtime only if dropped unfinished.
pub struct Finish<T: Send + 'static> {
    work: Option<CatchUnwind<AssertUnwindSafe<BoxFuture<'static, T>>>>,
}

impl<T: Send + 'static> Finish<T> {
    /// Wraps `work`; nothing runs until it is polled (or dropped).
    pub fn new(work: BoxFuture<'static, T>) -> Self {
        Self {
            work: Some(AssertUnwindSafe(work).catch_unwind()),
        }
    }
}

impl<T: Send + 'static> Future for Finish<T> {
    type Output = Result<T, Unfinished>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let Some(work) = self.work.as_mut() else {
            return Poll::Ready(Err(Unfinished::Ended));
        };
        let ended = ready!(work.poll_unpin(cx));
        self.work = None;
        Poll::Ready(ended.map_err(|_| Unfinished::Panicked))
    }
}

impl<T: Send + 'static> Drop for Finish<T> {
    fn drop(&mut self) {
        let Some(work) = self.work.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if work.await.is_err() {
                        tracing::error!("work finished on its own task panicked");
                    }
                });
            }
            // Only outside any runtime (a shutdown's last drops): nothing can run it.
            Err(_) => tracing::warn!("work dropped unfinished outside a runtime"),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn work_awaited_runs_in_place_and_yields_its_output() {
        let thread = std::thread::current().id();
        let work = Finish::new(Box::pin(async move { std::thread::current().id() }));
        assert_eq!(work.await, Ok(thread));
    }

    #[tokio::test(flavor = "current_thread", start_paused = true)]
    async fn work_dropped_unfinished_still_runs_to_its_end() {
        let done = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&done);
        let work = Finish::new(Box::pin(async move {
            tokio::time::sleep(Duration::from_secs(1)).await;
            flag.store(true, Ordering::SeqCst);
        }));
        // The caller gives up after one poll, as a body dropped by a leaving client does.
        let mut work = Box::pin(work);
        let pending = std::future::poll_fn(|cx| Poll::Ready(work.as_mut().poll(cx).is_pending()));
        assert!(pending.await);
        drop(work);
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            done.load(Ordering::SeqCst),
            "the abandoned work did not finish"
        );
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_panic_is_reported_not_propagated() {
        let work: Finish<()> = Finish::new(Box::pin(async { panic!("boom") }));
        assert_eq!(work.await, Err(Unfinished::Panicked));
    }

    #[tokio::test(flavor = "current_thread")]
    async fn polling_again_after_the_end_is_an_error_not_a_panic() {
        let mut work = Box::pin(Finish::new(Box::pin(async { 7 })));
        assert_eq!(work.as_mut().await, Ok(7));
        assert_eq!(work.as_mut().await, Err(Unfinished::Ended));
    }
}
