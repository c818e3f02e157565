//! The observer of a streamed reply: copies frames to a side parser, spots where the
//! reply's final event ends, and logs what was assembled when the body ends.

use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures_util::{stream, FutureExt, StreamExt};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use super::final_event::FinalEvent;
use super::ReplyTarget;
use crate::base::outcome::Outcome;
use crate::dialect::StreamReply;
use crate::relay::{EndWork, Flow, Observer};

/// Frames buffered for the parser before capture gives up on this reply.
const FRAME_QUEUE: usize = 4096;

/// Observes one streamed chat-completions response and logs its reply.
pub(crate) struct ReplyCapture {
    target: Option<ReplyTarget>,
    frames: Option<mpsc::Sender<Bytes>>,
    parsed: Option<JoinHandle<Box<dyn StreamReply>>>,
    end: FinalEvent,
    lost: bool,
}

impl ReplyCapture {
    /// Starts the side parser; the reply will be logged into `target`.
    pub(crate) fn start(target: ReplyTarget) -> Self {
        let (sender, receiver) = mpsc::channel::<Bytes>(FRAME_QUEUE);
        let dialect = target.dialect.get();
        let assembler = dialect.stream_reply();
        Self {
            end: FinalEvent::new(dialect.stream_end()),
            target: Some(target),
            frames: Some(sender),
            parsed: Some(tokio::spawn(assemble_stream(receiver, assembler))),
            lost: false,
        }
    }
}

impl Observer for ReplyCapture {
    fn on_data(&mut self, data: &Bytes) -> Flow {
        let end = self.end.feed(data);
        // What follows the final event is not part of the reply: the parser never sees it.
        let reply = match end {
            Some(at) if at < data.len() => data.slice(..at),
            _ => data.clone(),
        };
        // Bytes clones share the buffer; a full queue loses the capture, never the frame.
        if let Some(sender) = &self.frames {
            if sender.try_send(reply).is_err() {
                self.lost = true;
                self.frames = None;
            }
        }
        end.map_or(Flow::Pass, Flow::Last)
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
