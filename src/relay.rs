//! The response body handed to the client: upstream frames pass through as they
//! arrive, never held back or merged.
//!
//! An observer may watch a copy of each frame (reply capture, metrics); it must
//! never block. A frame that stops coming for `read_timeout`, or a broken upstream
//! stream, ends the client's body with an error, so the client sees a cut and never a
//! clean end.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::task::JoinHandle;
use tokio::time::{Instant, Sleep};

use crate::access_log::{Outcome, RequestLog};
use crate::body::BoxError;

/// Watches the frames of one response as they go by.
pub trait Observer: Send {
    /// Sees the response head before any frame.
    fn on_head(&mut self, _parts: &http::response::Parts) {}
    /// Sees a copy of one data frame; must return quickly.
    fn on_data(&mut self, data: &Bytes);
    /// Called once with how the body ended. A returned future is spawned, and the
    /// client sees the end of a complete body only after it finished; it must be
    /// bounded in time.
    fn on_end(&mut self, outcome: Outcome) -> Option<BoxFuture<'static, ()>>;
}

/// The upstream stopped sending for longer than `upstream.read_timeout`.
#[derive(Debug, thiserror::Error)]
#[error("upstream sent nothing for {0:?} after {1} bytes; stream cut")]
pub struct IdleTimeout(Duration, u64);

/// State that must be settled exactly once, whether the body ends or is dropped.
struct Settle {
    log: RequestLog,
    observer: Option<Box<dyn Observer>>,
    bytes: u64,
    ended: bool,
}

impl Settle {
    fn end(&mut self, outcome: Outcome) -> Option<BoxFuture<'static, ()>> {
        if self.ended {
            return None;
        }
        self.ended = true;
        self.log.set_outcome(outcome);
        self.observer
            .as_mut()
            .and_then(|observer| observer.on_end(outcome))
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        // Dropped before the end: the client disconnected (or the server is stopping).
        if let Some(pending) = self.end(Outcome::ClientGone) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(pending);
            }
        }
    }
}

pin_project_lite::pin_project! {
    /// The upstream body, relayed frame by frame.
    pub struct RelayBody {
        #[pin]
        inner: Incoming,
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        settle: Settle,
        finishing: Option<JoinHandle<()>>,
        held: Option<Frame<Bytes>>,
    }
}

impl RelayBody {
    /// Relays `inner`, logging through `log` and showing frames to `observer`.
    pub fn new(
        inner: Incoming,
        idle_timeout: Duration,
        log: RequestLog,
        observer: Option<Box<dyn Observer>>,
    ) -> Self {
        let mut settle = Settle {
            log,
            observer,
            bytes: 0,
            ended: false,
        };
        // hyper never polls a body that is empty from the start.
        let finishing = if inner.is_end_stream() {
            settle.end(Outcome::Complete)
        } else {
            None
        };
        if let Some(pending) = finishing {
            tokio::spawn(pending);
        }
        Self {
            inner,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            settle,
            finishing: None,
            held: None,
        }
    }
}

impl Body for RelayBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let mut this = self.project();
        if let Some(pending) = this.finishing.as_mut() {
            // A join error means the observer panicked; the body still ends normally.
            let _ = ready!(Pin::new(pending).poll(cx));
            *this.finishing = None;
            return Poll::Ready(this.held.take().map(Ok));
        }
        if this.settle.ended {
            return Poll::Ready(None);
        }
        match this.inner.as_mut().poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                this.idle
                    .as_mut()
                    .reset(Instant::now() + *this.idle_timeout);
                if let Some(data) = frame.data_ref() {
                    this.settle.bytes += data.len() as u64;
                    this.settle.log.add_bytes(data.len());
                    if let Some(observer) = this.settle.observer.as_mut() {
                        observer.on_data(data);
                    }
                }
                // A sized body is over with its last byte: hyper will not poll for the end,
                // so the end is settled here, and the last frame waits for the observer.
                if this.inner.is_end_stream() {
                    if let Some(pending) = this.settle.end(Outcome::Complete) {
                        *this.held = Some(frame);
                        *this.finishing = Some(tokio::spawn(pending));
                        cx.waker().wake_by_ref();
                        return Poll::Pending;
                    }
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                tracing::warn!(
                    bytes = this.settle.bytes,
                    error = %err,
                    "upstream cut the stream; cutting the client's stream too"
                );
                this.settle.end(Outcome::UpstreamCut);
                Poll::Ready(Some(Err(Box::new(err))))
            }
            Poll::Ready(None) => match this.settle.end(Outcome::Complete) {
                None => Poll::Ready(None),
                Some(pending) => {
                    // Spawned, not polled in place: hyper may drop a body at any time, and
                    // a half-run log write would leave the log and the cache disagreeing.
                    *this.finishing = Some(tokio::spawn(pending));
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            },
            Poll::Pending => {
                ready!(this.idle.as_mut().poll(cx));
                let err = IdleTimeout(*this.idle_timeout, this.settle.bytes);
                tracing::warn!(error = %err, "upstream went silent");
                this.settle.end(Outcome::UpstreamIdle);
                Poll::Ready(Some(Err(Box::new(err))))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Only once settled: hyper stops polling at end-of-stream, and the observer's
        // end (logging the reply) must still run.
        self.settle.ended && self.finishing.is_none() && self.held.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
