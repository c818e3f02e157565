//! The observer of a streamed reply: copies frames to a side parser, spots the
//! frame that ends the reply, and logs what was assembled when the body ends.

use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures_util::{stream, FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::ReplyTarget;
use crate::base::outcome::Outcome;
use crate::dialect::{StreamEnd, StreamReply};
use crate::relay::{EndWork, Flow, Observer};

/// Frames buffered for the parser before capture gives up on this reply.
const FRAME_QUEUE: usize = 4096;

/// Observes one streamed chat-completions response and logs its reply.
pub struct ReplyCapture {
    target: Option<ReplyTarget>,
    frames: Option<mpsc::Sender<Bytes>>,
    parsed: Option<JoinHandle<Box<dyn StreamReply>>>,
    end: StreamEnd,
    lost: bool,
    // The end of the previous frame, so a `data: [DONE]` split across frames is seen.
    carry: Vec<u8>,
}

impl ReplyCapture {
    /// Starts the side parser; the reply will be logged into `target`.
    pub fn start(target: ReplyTarget) -> Self {
        let (sender, receiver) = mpsc::channel::<Bytes>(FRAME_QUEUE);
        let dialect = target.dialect.get();
        let assembler = dialect.stream_reply();
        Self {
            end: dialect.stream_end(),
            target: Some(target),
            frames: Some(sender),
            parsed: Some(tokio::spawn(assemble_stream(receiver, assembler))),
            lost: false,
            carry: Vec::new(),
        }
    }
}

impl Observer for ReplyCapture {
    fn on_data(&mut self, data: &Bytes) -> Flow {
        // Bytes clones share the buffer; a full queue loses the capture, never the frame.
        if let Some(sender) = &self.frames {
            if sender.try_send(data.clone()).is_err() {
                self.lost = true;
                self.frames = None;
            }
        }
        let flow = if ends_stream(self.end, &self.carry, data) {
            Flow::Last
        } else {
            Flow::Pass
        };
        let keep = data.len().min(CARRY);
        self.carry.clear();
        self.carry.extend_from_slice(&data[data.len() - keep..]);
        flow
    }

    fn on_end(&mut self, outcome: Outcome) -> Option<EndWork> {
        let target = self.target.take()?;
        // Closing the channel lets the parser finish with what it has.
        self.frames = None;
        let parsed = self.parsed.take()?;
        let lost = self.lost;
        Some(
            async move {
                if lost {
                    parsed.abort();
                    return target.unlogged("capture_lag", "reply capture fell behind the stream");
                }
                let assembler = match parsed.await {
                    Ok(assembler) => assembler,
                    Err(err) => return target.unlogged("capture_failed", &err.to_string()),
                };
                target.log(assembler.finish(), outcome).await
            }
            .boxed(),
        )
    }
}

/// Bytes of the previous frame kept to find an end marker split across frames.
const CARRY: usize = 32;

/// True when `data` (after `carry`) holds the dialect's end line (`data: [DONE]`,
/// `event: message_stop`).
///
/// The marker must start a line: inside a JSON chunk a newline is always escaped, so
/// a model that writes "data: [DONE]" in its text never ends the capture early.
fn ends_stream(end: StreamEnd, carry: &[u8], data: &[u8]) -> bool {
    let joined;
    let bytes: &[u8] = if carry.is_empty() {
        data
    } else {
        joined = [carry, data].concat();
        &joined
    };
    end.values.iter().any(|value| {
        let mut from = 0;
        while let Some(at) = find(&bytes[from..], value).map(|i| i + from) {
            let before = &bytes[..at];
            let field = before
                .strip_suffix(b" ")
                .unwrap_or(before)
                .strip_suffix(end.field);
            let after = bytes.get(at + value.len());
            // The value is the whole rest of its line (`response.completed`, not a prefix).
            let whole = after.is_none_or(|b| *b == b'\n' || *b == b'\r');
            if let Some(line_start) = field {
                let at_line_start = line_start.is_empty()
                    || line_start.ends_with(b"\n")
                    || line_start.ends_with(b"\r");
                if at_line_start && whole {
                    return true;
                }
            }
            from = at + value.len();
        }
        false
    })
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}

async fn assemble_stream(
    receiver: mpsc::Receiver<Bytes>,
    mut assembler: Box<dyn StreamReply>,
) -> Box<dyn StreamReply> {
    let frames = stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|bytes| (Ok::<_, std::convert::Infallible>(bytes), receiver))
    });
    let mut events = std::pin::pin!(frames.eventsource());
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => assembler.push(&event.event, &event.data),
            Err(err) => tracing::debug!(error = %err, "unparseable SSE event"),
        }
    }
    assembler
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::DialectKind;

    const OPENAI: StreamEnd = StreamEnd {
        field: b"data:",
        values: &[b"[DONE]"],
    };

    #[test]
    fn message_stop_ends_an_anthropic_stream_even_when_split() {
        let end = DialectKind::Anthropic.get().stream_end();
        assert!(ends_stream(
            end,
            b"",
            b"event: message_stop
data: {}

"
        ));
        assert!(ends_stream(
            end,
            b"\n\nevent: messa",
            b"ge_stop
data: {}

"
        ));
        assert!(!ends_stream(
            end,
            b"",
            b"data: {\"text\":\"event: message_stop\"}

"
        ));
    }

    #[test]
    fn the_done_line_ends_the_stream_even_when_split() {
        assert!(ends_stream(OPENAI, b"", b"data: [DONE]\n\n"));
        assert!(ends_stream(
            OPENAI,
            b"",
            b"data: {\"a\":1}\n\ndata:[DONE]\n\n"
        ));
        assert!(ends_stream(OPENAI, b"{}\n\ndata: [DO", b"NE]\n\n"));
        assert!(ends_stream(OPENAI, b"}\n\n", b"data: [DONE]"));
    }

    #[test]
    fn done_inside_a_chunk_does_not_end_the_stream() {
        let chunk = br#"data: {"choices":[{"delta":{"content":"data: [DONE]"}}]}"#;
        assert!(!ends_stream(OPENAI, b"", chunk));
        assert!(!ends_stream(
            OPENAI,
            b"",
            b"data: {\"content\":\"\\ndata: [DONE]\"}\n\n"
        ));
    }
}
