//! A streamed body whose bytes are rewritten on their way to the client, after the
//! reply capture saw them as the upstream sent them: handoff asked for something the
//! client did not (usage), and takes it out again.

use std::pin::Pin;
use std::task::{ready, Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

/// Rewrites the data of one streamed body.
pub trait Rewrite: Send {
    /// The client's bytes for the next upstream bytes; may hold some back.
    fn data(&mut self, data: Bytes) -> Bytes;
    /// What is still held when the body ends.
    fn end(&mut self) -> Bytes;
}

/// Whole lines out of a body's data, whatever its frames cut: a line rewrite reads a
/// stream's events one line at a time.
#[derive(Debug, Default)]
pub struct Lines {
    /// The start of a line whose end has not arrived.
    partial: BytesMut,
}

impl Lines {
    /// Calls `each` with every line `data` completes (its line break included) and
    /// what the rewrite writes so far; keeps the start of an unfinished one.
    pub fn feed(&mut self, data: &[u8], mut each: impl FnMut(&[u8], &mut BytesMut)) -> Bytes {
        let mut out = BytesMut::with_capacity(data.len() + self.partial.len());
        let mut rest = data;
        while let Some(at) = rest.iter().position(|b| *b == b'\n') {
            let (line, tail) = rest.split_at(at + 1);
            rest = tail;
            if self.partial.is_empty() {
                each(line, &mut out);
            } else {
                self.partial.extend_from_slice(line);
                let whole = std::mem::take(&mut self.partial);
                each(&whole, &mut out);
            }
        }
        self.partial.extend_from_slice(rest);
        out.freeze()
    }

    /// The unfinished line the body ended with.
    pub fn rest(&mut self) -> BytesMut {
        std::mem::take(&mut self.partial)
    }
}

/// `line` without its line break.
pub fn trim_break(line: &[u8]) -> &[u8] {
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// Two rewrites, one after the other.
pub struct Both(pub Box<dyn Rewrite>, pub Box<dyn Rewrite>);

impl Rewrite for Both {
    fn data(&mut self, data: Bytes) -> Bytes {
        let first = self.0.data(data);
        self.1.data(first)
    }

    fn end(&mut self) -> Bytes {
        let rest = self.0.end();
        let mut out = self.1.data(rest).to_vec();
        out.extend_from_slice(&self.1.end());
        Bytes::from(out)
    }
}

pin_project_lite::pin_project! {
    /// `inner` with its data rewritten.
    pub struct Rewritten<B> {
        #[pin]
        inner: B,
        rewrite: Box<dyn Rewrite>,
        ended: bool,
    }
}

impl<B> Rewritten<B> {
    /// Rewrites `inner` with `rewrite`.
    pub fn new(inner: B, rewrite: Box<dyn Rewrite>) -> Self {
        Self {
            inner,
            rewrite,
            ended: false,
        }
    }
}

impl<B: Body<Data = Bytes>> Body for Rewritten<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let mut this = self.project();
        loop {
            if *this.ended {
                return Poll::Ready(None);
            }
            match ready!(this.inner.as_mut().poll_frame(cx)) {
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(data) => {
                        let out = this.rewrite.data(data);
                        if !out.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(out))));
                        }
                    }
                    Err(frame) => return Poll::Ready(Some(Ok(frame))),
                },
                Some(Err(err)) => return Poll::Ready(Some(Err(err))),
                None => {
                    *this.ended = true;
                    let rest = this.rewrite.end();
                    if !rest.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(rest))));
                    }
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Only once the held bytes are out: the inner end is not the client's.
        self.ended
    }

    fn size_hint(&self) -> SizeHint {
        // The rewrite changes the length.
        SizeHint::default()
    }
}
