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
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::access_log::{Outcome, RequestLog};
use crate::body::BoxError;

/// Watches the frames of one response as they go by.
pub trait Observer: Send {
    /// Sees a copy of one data frame; must return quickly.
    fn on_data(&mut self, data: &Bytes);
    /// Called once with how the body ended.
    fn on_end(&mut self, outcome: Outcome);
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
    fn end(&mut self, outcome: Outcome) {
        if self.ended {
            return;
        }
        self.ended = true;
        self.log.set_outcome(outcome);
        if let Some(observer) = self.observer.as_mut() {
            observer.on_end(outcome);
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        // Dropped before the end: the client disconnected (or the server is stopping).
        self.end(Outcome::ClientGone);
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
        if inner.is_end_stream() {
            settle.end(Outcome::Complete);
        }
        Self {
            inner,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            settle,
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
            Poll::Ready(None) => {
                this.settle.end(Outcome::Complete);
                Poll::Ready(None)
            }
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
        self.settle.ended || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
