//! A streamed upload, charged to its proxy key's `tpm` as it arrives (phase 1,
//! **intake**, of a body that is not read whole).

use std::pin::Pin;
use std::sync::Arc;
use std::task::{ready, Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;

use crate::auth::{Admission, RateLimiter};
use crate::body::BoxError;

pin_project_lite::pin_project! {
    /// A streamed upload, charged to its key's `tpm` as it arrives: past its
    /// reservation each frame takes what it holds, and a frame the key cannot cover
    /// cuts the upload. What the reservation held beyond the body is given back.
    pub(super) struct ChargedUpload {
        #[pin]
        inner: Incoming,
        admission: Admission,
        limiter: Arc<RateLimiter>,
        read: usize,
        // Tokens taken so far, the reservation included.
        taken: u64,
        settled: bool,
    }

    impl PinnedDrop for ChargedUpload {
        fn drop(this: Pin<&mut Self>) {
            let this = this.project();
            if !*this.settled {
                let used = *this.read as u64 / 4;
                this.admission.refund(this.limiter, this.taken.saturating_sub(used));
            }
        }
    }
}

impl ChargedUpload {
    pub(super) fn new(inner: Incoming, admission: Admission, limiter: Arc<RateLimiter>) -> Self {
        let taken = admission.reserved_tokens;
        Self {
            inner,
            admission,
            limiter,
            read: 0,
            taken,
            settled: false,
        }
    }
}

impl Body for ChargedUpload {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.project();
        let polled = ready!(this.inner.poll_frame(cx));
        match &polled {
            Some(Ok(frame)) => {
                *this.read += frame.data_ref().map_or(0, Bytes::len);
                let used = *this.read as u64 / 4;
                if used > *this.taken {
                    if let Err(err) = this
                        .admission
                        .take_streamed(this.limiter, used - *this.taken)
                    {
                        *this.settled = true;
                        return Poll::Ready(Some(Err(err.into())));
                    }
                    *this.taken = used;
                }
            }
            None => {
                let used = *this.read as u64 / 4;
                this.admission
                    .refund(this.limiter, this.taken.saturating_sub(used));
                *this.settled = true;
            }
            Some(Err(_)) => {}
        }
        Poll::Ready(polled.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
