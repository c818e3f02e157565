//! Reading a request body whole, within `limits.max_body_bytes` and
//! `limits.body_timeout`: what a tracked request and a checked pass-through need.

use std::time::Duration;

use bytes::Bytes;
use http::header;
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::base::chunks::Chunks;
use crate::config::LimitsConfig;
use crate::error::ApiError;

/// Reads a body within `limits.max_body_bytes` and `limits.body_timeout`.
///
/// An excess, declared or actual, is a 413 sent at once, while the rest of the upload
/// is read and dropped on the side (bounded, like nginx's lingering close): a client
/// that sends its whole body before reading then reads the 413, not a broken pipe.
pub async fn read_body(
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
    let mut chunks = Chunks::reading();
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
                chunks.push(data);
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
        Ok(Ok(true)) => Ok(chunks),
    }
}

/// How long the rest of a refused upload is read, at most, and how long it may stall.
const DRAIN_TIME: Duration = Duration::from_secs(30);
const DRAIN_STALL: Duration = Duration::from_secs(5);

/// Reads and drops the rest of `body` in the background, up to eight times `limit`
/// (64 MiB at least), 30 s, or a 5 s stall; then the connection closes.
fn drain(mut body: Incoming, limit: usize) {
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
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let service = service_fn(|request: Request<Incoming>| async move {
                let (parts, body) = request.into_parts();
                let read = read_body(body, &LimitsConfig::default(), &parts.headers).await;
                let bytes = read.map_or_else(
                    |err| Bytes::from(format!("error: {}", err.message)),
                    |chunks| chunks.contiguous().clone(),
                );
                Ok::<_, Infallible>(Response::new(Full::new(bytes)))
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
        answer.split_off(at + 4)
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
        assert_eq!(read_back(&[b"{}"], true).await, b"{}");
    }
}
