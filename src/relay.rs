//! The response body handed to the client: upstream frames pass through as they
//! arrive, never merged, and held back at one point only, the very end.
//!
//! An observer (reply capture) watches a copy of each frame and may say where in a
//! frame the reply ends, e.g. after the blank line that closes `data: [DONE]`. That
//! frame, cut at that point, or the end of the body when no frame said so, is released only once the observer's end work (logging the reply)
//! has finished: a client that closes as soon as it has read the end can no longer
//! win a race against the log. That work runs in place, in the body's own poll, and is
//! spawned only if the body is dropped before it ends ([`Finish`]), so a client that
//! leaves never cancels it. A frame that stops coming for `read_timeout`, a broken upstream stream,
//! or a reply that could not be logged ends the client's body with an error, so the
//! client sees a cut and never a clean end.

use std::future::Future;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use tokio::time::{Instant, Sleep};

use crate::base::outcome::Outcome;
use crate::body::BoxError;
use crate::finish::Finish;

/// What an observer makes of one frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Flow {
    /// An ordinary frame: pass it on.
    Pass,
    /// The frame in which the reply ends, `.0` bytes in: those bytes are the client's
    /// last, held until the observer's end work is done; the rest is drained.
    Last(usize),
}

/// What an observer's end work yields: `Err` cuts the client's body before its end.
pub(crate) type EndWork = BoxFuture<'static, Result<(), RelayError>>;

/// Watches the frames of one response as they go by.
pub(crate) trait Observer: Send {
    /// Sees a copy of one data frame; must return quickly.
    fn on_data(&mut self, data: &Bytes) -> Flow;
    /// Called once with how the body ended. The returned work runs to its end whatever
    /// the client does; for a complete body the client sees the end
    /// only after it finished. It must be bounded in time.
    fn on_end(&mut self, outcome: Outcome) -> Option<EndWork>;
}

/// Why the relay ended the client's body with an error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RelayError {
    /// The upstream broke the stream.
    #[error("upstream cut the stream after {bytes} bytes: {source}")]
    UpstreamCut {
        /// Body bytes relayed before the cut.
        bytes: u64,
        /// What hyper saw.
        source: hyper::Error,
    },
    /// The upstream stopped sending for longer than `upstream.read_timeout`.
    #[error("upstream sent nothing for {idle:?} after {bytes} bytes; stream cut")]
    Idle {
        /// The timeout that passed.
        idle: Duration,
        /// Body bytes relayed before it.
        bytes: u64,
    },
    /// The reply could not be logged and `store.required` is set.
    #[error("the reply could not be logged, so the stream is cut before its end: {0}")]
    Unlogged(String),
}

impl RelayError {
    /// How a body that ended with this error ended.
    pub(crate) fn outcome(&self) -> Outcome {
        match self {
            RelayError::UpstreamCut { .. } => Outcome::UpstreamCut,
            RelayError::Idle { .. } => Outcome::Timeout,
            RelayError::Unlogged(_) => Outcome::Error,
        }
    }
}

/// The observer, settled exactly once, whether the body ends or is dropped.
struct Settle {
    observer: Option<Box<dyn Observer>>,
}

impl Settle {
    fn end(&mut self, outcome: Outcome) -> Option<EndWork> {
        self.observer.take()?.on_end(outcome)
    }

    /// Ends the observer with `outcome` without waiting for its work.
    fn end_detached(&mut self, outcome: Outcome) {
        if let Some(work) = self.end(outcome) {
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(work);
            }
        }
    }
}

impl Drop for Settle {
    fn drop(&mut self) {
        // Dropped before the end: the client disconnected (or the server is stopping).
        self.end_detached(Outcome::ClientGone);
    }
}

pin_project_lite::pin_project! {
    /// The upstream body, relayed frame by frame.
    pub(crate) struct RelayBody {
        // `None` once the client's body is over: after the end, or after the frame that
        // ended the reply, when what is left is drained on the side.
        inner: Option<Incoming>,
        #[pin]
        idle: Sleep,
        idle_timeout: Duration,
        bytes: u64,
        settle: Settle,
        // The observer's end work; `held` (if any) waits for it.
        finishing: Option<Finish<Result<(), RelayError>>>,
        held: Option<Frame<Bytes>>,
        // Bytes already read from `inner` (a peek at the stream's opening), sent first.
        prefix: Option<Bytes>,
    }
}

/// How long the rest of an upstream body after the end of a reply is read, so that
/// the upstream connection can be reused.
const DRAIN: Duration = Duration::from_secs(5);

/// Reads what the upstream still sends after the reply ended, without holding up the
/// client; a body read to its end leaves the upstream connection reusable.
async fn drain(mut rest: Incoming) {
    use http_body_util::BodyExt;
    let _ = tokio::time::timeout(DRAIN, async {
        while let Some(Ok(_)) = rest.frame().await {}
    })
    .await;
}

impl RelayBody {
    /// Relays `prefix` (bytes already read from `inner`), then the rest of `inner`.
    pub(crate) fn after(
        prefix: Bytes,
        inner: Incoming,
        idle_timeout: Duration,
        observer: Option<Box<dyn Observer>>,
    ) -> Self {
        let mut settle = Settle { observer };
        let mut finishing = None;
        let prefix = (!prefix.is_empty()).then_some(prefix);
        let inner = if inner.is_end_stream() && prefix.is_none() {
            // hyper never polls a body that is empty from the start.
            finishing = settle.end(Outcome::Complete).map(Finish::new);
            None
        } else {
            Some(inner)
        };
        Self {
            inner,
            idle: tokio::time::sleep(idle_timeout),
            idle_timeout,
            bytes: 0,
            settle,
            finishing,
            held: None,
            prefix,
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
        loop {
            if let Some(pending) = this.finishing.as_mut() {
                let finished = ready!(Pin::new(pending).poll(cx));
                *this.finishing = None;
                match finished {
                    Ok(Ok(())) => {}
                    Ok(Err(err)) => {
                        *this.held = None;
                        *this.inner = None;
                        return Poll::Ready(Some(Err(Box::new(err))));
                    }
                    // The observer's work panicked: a capture failure never breaks the stream.
                    Err(err) => tracing::error!(error = %err, "reply capture failed"),
                }
                if let Some(frame) = this.held.take() {
                    return Poll::Ready(Some(Ok(frame)));
                }
            }
            let polled = match this.prefix.take() {
                Some(bytes) => Poll::Ready(Some(Ok(Frame::data(bytes)))),
                None => match this.inner.as_mut() {
                    Some(inner) => Pin::new(inner).poll_frame(cx),
                    None => return Poll::Ready(None),
                },
            };
            match polled {
                Poll::Ready(Some(Ok(frame))) => {
                    this.idle
                        .as_mut()
                        .reset(Instant::now() + *this.idle_timeout);
                    let flow = match (frame.data_ref(), this.settle.observer.as_mut()) {
                        (Some(data), Some(observer)) => observer.on_data(data),
                        _ => Flow::Pass,
                    };
                    // Bytes after the reply's end are not the client's: drained with the rest.
                    let frame = match flow {
                        Flow::Last(at) => match frame.into_data() {
                            Ok(data) if at < data.len() => Frame::data(data.slice(..at)),
                            Ok(data) => Frame::data(data),
                            Err(frame) => frame,
                        },
                        Flow::Pass => frame,
                    };
                    if let Some(data) = frame.data_ref() {
                        *this.bytes += data.len() as u64;
                    }
                    // A sized body is over with its last byte: hyper will not poll for the
                    // end, so the last frame waits for the observer here too.
                    let ended = this.inner.as_ref().is_none_or(Incoming::is_end_stream);
                    if matches!(flow, Flow::Last(_)) || ended {
                        // The reply is over: the client's body ends with this frame, and
                        // whatever the upstream still sends is drained on the side.
                        if let Some(rest) = this.inner.take().filter(|_| !ended) {
                            tokio::spawn(drain(rest));
                        }
                        if let Some(work) = this.settle.end(Outcome::Complete) {
                            *this.held = Some(frame);
                            *this.finishing = Some(Finish::new(work));
                            continue;
                        }
                    }
                    return Poll::Ready(Some(Ok(frame)));
                }
                Poll::Ready(Some(Err(source))) => {
                    *this.inner = None;
                    let err = RelayError::UpstreamCut {
                        bytes: *this.bytes,
                        source,
                    };
                    tracing::warn!(error = %err, "cutting the client's stream too");
                    this.settle.end_detached(Outcome::UpstreamCut);
                    return Poll::Ready(Some(Err(Box::new(err))));
                }
                Poll::Ready(None) => {
                    *this.inner = None;
                    match this.settle.end(Outcome::Complete) {
                        Some(work) => *this.finishing = Some(Finish::new(work)),
                        None => return Poll::Ready(None),
                    }
                }
                Poll::Pending => {
                    ready!(this.idle.as_mut().poll(cx));
                    *this.inner = None;
                    let err = RelayError::Idle {
                        idle: *this.idle_timeout,
                        bytes: *this.bytes,
                    };
                    tracing::warn!(error = %err, "upstream went silent");
                    this.settle.end_detached(Outcome::Timeout);
                    return Poll::Ready(Some(Err(Box::new(err))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Only once settled: hyper stops polling at end-of-stream, and the observer's
        // end (logging the reply) must still gate it.
        self.inner.is_none() && self.finishing.is_none() && self.held.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner
            .as_ref()
            .map_or_else(|| SizeHint::with_exact(0), Body::size_hint)
    }
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
