//! Reading a request body whole, within `limits.max_body_bytes` and
//! `limits.body_timeout`: what a tracked request and a checked pass-through need.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::base::chunks::Chunks;
use crate::config::LimitsConfig;
use crate::error::ApiError;

/// Frames shorter than this are gathered into one before they are kept.
const SMALL_FRAME: usize = 8 << 10;

/// Small frames on their way into a [`Chunks`]: one is kept as it came (a small body
/// is one frame, and is not copied), more are copied together up to [`SMALL_FRAME`].
#[derive(Default)]
struct Gathered {
    one: Option<Bytes>,
    many: BytesMut,
}

impl Gathered {
    /// Takes a frame, keeping in `chunks` what is big enough.
    fn add(&mut self, data: Bytes, chunks: &mut Chunks) {
        if data.len() >= SMALL_FRAME {
            self.flush(chunks);
            chunks.push(data);
            return;
        }
        if self.one.is_none() && self.many.is_empty() {
            self.one = Some(data);
            return;
        }
        if let Some(one) = self.one.take() {
            self.many.extend_from_slice(&one);
        }
        self.many.extend_from_slice(&data);
        if self.many.len() >= SMALL_FRAME {
            chunks.push(self.many.split().freeze());
        }
    }

    /// Keeps what is gathered in `chunks`.
    fn flush(&mut self, chunks: &mut Chunks) {
        if let Some(one) = self.one.take() {
            chunks.push(one);
        }
        if !self.many.is_empty() {
            chunks.push(self.many.split().freeze());
        }
    }
}

/// Reads a body within `limits.max_body_bytes` and `limits.body_timeout`.
///
/// An excess, declared or actual, is a 413 sent at once, while the rest of the upload
/// is read and dropped on the side (bounded, like nginx's lingering close): a client
/// that sends its whole body before reading then reads the 413, not a broken pipe.
pub(crate) async fn read_body(
    mut body: Incoming,
    limits: &LimitsConfig,
    headers: &http::HeaderMap,
) -> Result<Chunks, ApiError> {
    let limit = limits.max_body_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        drain(body, limit);
        return Err(ApiError::body_too_large(limit));
    }
    // The frames are kept as they came, and a long body's blocks digested as they arrive:
    // most of a long body is bytes read before, which a reader then compares by those
    // digests and shares where they lie, instead of reading and copying them again.
    // Small frames are gathered first, so a body sent in tiny chunks is not kept as
    // a frame (and its bookkeeping) per byte.
    let mut chunks = Chunks::reading(declared);
    let mut gathered = Gathered::default();
    let mut total = 0usize;
    let read = tokio::time::timeout(limits.body_timeout, async {
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|err| {
                ApiError::invalid_request(
                    "body_read_failed",
                    format!("could not read the request body: {err}"),
                )
            })?;
            if let Ok(data) = frame.into_data() {
                total += data.len();
                if total > limit {
                    return Ok(false);
                }
                gathered.add(data, &mut chunks);
            }
        }
        Ok(true)
    })
    .await;
    match read {
        Err(_) => Err(ApiError::body_timeout(limits.body_timeout)),
        Ok(Err(err)) => Err(err),
        Ok(Ok(false)) => {
            drain(body, limit);
            Err(ApiError::body_too_large(limit))
        }
        Ok(Ok(true)) => {
            gathered.flush(&mut chunks);
            Ok(chunks)
        }
    }
}

/// How long the rest of a refused upload is read, at most, and how long it may stall.
const DRAIN_TIME: Duration = Duration::from_secs(30);
const DRAIN_STALL: Duration = Duration::from_secs(5);

/// Reads and drops the rest of `body` in the background, up to eight times `limit`
/// (64 MiB at least), 30 s, or a 5 s stall; then the connection closes.
pub(crate) fn drain(mut body: Incoming, limit: usize) {
    let cap = limit.saturating_mul(8).max(64 << 20);
    tokio::spawn(async move {
        let _ = tokio::time::timeout(DRAIN_TIME, async {
            let mut read = 0usize;
            while let Ok(Some(Ok(frame))) = tokio::time::timeout(DRAIN_STALL, body.frame()).await {
                read += frame.data_ref().map_or(0, Bytes::len);
                if read > cap {
                    break;
                }
            }
        })
        .await;
    });
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http::{Request, Response};
    use http_body_util::Full;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// What `read_body` made of a request whose body was written in `pieces`, each
    /// flushed apart so that they arrive as separate frames; `length` sends
    /// Content-Length, else the body is chunked.
    async fn read_back(pieces: &[&[u8]], length: bool) -> Vec<u8> {
        read_frames(pieces, length).await.1
    }

    /// How many frames `read_body` kept of a body written in `pieces`, and the body.
    async fn read_frames(pieces: &[&[u8]], length: bool) -> (usize, Vec<u8>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service_fn(|request: Request<Incoming>| async move {
                let (parts, body) = request.into_parts();
                let read = read_body(body, &LimitsConfig::default(), &parts.headers).await;
                let (frames, bytes) = read.map_or_else(
                    |err| (0, Bytes::from(format!("error: {}", err.message))),
                    |chunks| (chunks.parts().len(), chunks.contiguous().clone()),
                );
                let mut response = Response::new(Full::new(bytes));
                response.headers_mut().insert("x-frames", frames.into());
                Ok::<_, Infallible>(response)
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
        let mut client = tokio::net::TcpStream::connect(address).await.unwrap();
        client.set_nodelay(true).unwrap();
        let total: usize = pieces.iter().map(|piece| piece.len()).sum();
        let framing = if length {
            format!("content-length: {total}")
        } else {
            "transfer-encoding: chunked".to_owned()
        };
        let head = format!("POST / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n{framing}\r\n\r\n");
        client.write_all(head.as_bytes()).await.unwrap();
        for piece in pieces {
            if length {
                client.write_all(piece).await.unwrap();
            } else if !piece.is_empty() {
                // (An empty chunk would end a chunked body.)
                let chunk = [format!("{:x}\r\n", piece.len()).as_bytes(), piece, b"\r\n"].concat();
                client.write_all(&chunk).await.unwrap();
            }
            client.flush().await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        if !length {
            client.write_all(b"0\r\n\r\n").await.unwrap();
        }
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        let at = answer.windows(4).position(|w| w == b"\r\n\r\n").unwrap();
        let head = String::from_utf8_lossy(&answer[..at]).to_lowercase();
        let frames = head
            .lines()
            .find_map(|line| line.strip_prefix("x-frames: "))
            .and_then(|count| count.trim().parse().ok())
            .unwrap_or(usize::MAX);
        (frames, answer.split_off(at + 4))
    }

    #[tokio::test]
    async fn a_body_in_many_frames_is_read_whole_and_in_order() {
        let big: Vec<u8> = (0..200_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let pieces: [&[u8]; 4] = [b"{\"messages\": [", &big, b"", b"]}"];
        let whole = pieces.concat();
        for length in [true, false] {
            assert_eq!(
                read_back(&pieces, length).await,
                whole,
                "content-length: {length}"
            );
        }
        // One frame is passed on as it came.
        assert_eq!(read_frames(&[b"{}"], true).await, (1, b"{}".to_vec()));
    }

    #[tokio::test]
    async fn a_body_in_tiny_chunks_is_kept_in_few_frames() {
        let text: Vec<u8> = (0..40_000u32).map(|i| b'a' + (i % 26) as u8).collect();
        let mut pieces: Vec<&[u8]> = text.chunks(3).take(60).collect();
        pieces.push(&text[180..]);
        let (frames, body) = read_frames(&pieces, false).await;
        assert_eq!(body, text);
        // 180 bytes in 60 chunks, then the rest in frames of hyper's reads.
        assert!(
            frames <= 1 + text.len() / SMALL_FRAME + 1,
            "{frames} frames"
        );
    }
}
