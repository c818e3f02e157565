//! Reply capture: watches the upstream's answer go by and logs it as the next
//! original once it is complete.
//!
//! Frames are never held back. A streamed answer is copied into a bounded channel and
//! parsed on the side with eventsource-stream; the end of the response waits only for
//! the reply to be logged, so a client that sends its next turn at once always finds
//! the reply already in the log.

mod assemble;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures_util::future::BoxFuture;
use futures_util::{stream, FutureExt, StreamExt};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use tokio::sync::mpsc;

pub use assemble::{AssembledChoice, StreamAssembler};

use crate::access_log::Outcome;
use crate::compaction::budget::Calibration;
use crate::conversation::{CapturedReply, ConversationId, Tracker};
use crate::digest::PrefixDigest;
use crate::forward::is_event_stream;
use crate::relay::Observer;

/// Frames buffered for the parser before capture gives up on this reply.
const FRAME_QUEUE: usize = 4096;

/// Largest non-streamed reply that is captured.
const MAX_JSON_REPLY: usize = 64 * 1024 * 1024;

/// How long the end of a response may wait for its reply to be logged.
const LOG_DEADLINE: Duration = Duration::from_secs(5);

/// Where a captured reply belongs.
pub struct ReplyTarget {
    /// The tracker that logs it.
    pub tracker: Arc<Tracker>,
    /// The conversation.
    pub id: ConversationId,
    /// Chain digest of the request's last message.
    pub parent: Option<PrefixDigest>,
    /// The request's model.
    pub model: String,
    /// The local estimate and generation of the view sent, to calibrate against usage.
    pub estimate: Option<(u64, Option<String>)>,
}

enum Mode {
    Undecided,
    Skip,
    Json(Vec<u8>),
    Sse {
        frames: Option<mpsc::Sender<Bytes>>,
        parsed: tokio::task::JoinHandle<StreamAssembler>,
        lost: bool,
    },
}

/// Observes one chat-completions response and logs its reply.
pub struct ReplyCapture {
    target: Option<ReplyTarget>,
    mode: Mode,
}

impl ReplyCapture {
    /// A capture that will log into `target`.
    pub fn new(target: ReplyTarget) -> Self {
        Self {
            target: Some(target),
            mode: Mode::Undecided,
        }
    }
}

impl Observer for ReplyCapture {
    fn on_head(&mut self, parts: &http::response::Parts) {
        self.mode = if !parts.status.is_success() {
            Mode::Skip
        } else if is_event_stream(&parts.headers) {
            let (sender, receiver) = mpsc::channel::<Bytes>(FRAME_QUEUE);
            Mode::Sse {
                frames: Some(sender),
                parsed: tokio::spawn(assemble_stream(receiver)),
                lost: false,
            }
        } else {
            Mode::Json(Vec::new())
        };
    }

    fn on_data(&mut self, data: &Bytes) {
        match &mut self.mode {
            Mode::Json(buffer) => {
                if buffer.len() + data.len() > MAX_JSON_REPLY {
                    tracing::warn!("reply larger than {MAX_JSON_REPLY} bytes; not captured");
                    self.mode = Mode::Skip;
                } else {
                    buffer.extend_from_slice(data);
                }
            }
            Mode::Sse { frames, lost, .. } => {
                // Bytes clones share the buffer; a full queue loses the capture, never the frame.
                if let Some(sender) = frames {
                    if sender.try_send(data.clone()).is_err() {
                        *lost = true;
                        *frames = None;
                    }
                }
            }
            Mode::Undecided | Mode::Skip => {}
        }
    }

    fn on_end(&mut self, outcome: Outcome) -> Option<BoxFuture<'static, ()>> {
        let mode = std::mem::replace(&mut self.mode, Mode::Skip);
        let target = self.target.take()?;
        if outcome != Outcome::Complete {
            if let Mode::Sse { parsed, .. } = mode {
                parsed.abort();
            }
            tracing::info!(conversation = %target.id, outcome = ?outcome, "reply incomplete; not logged");
            return None;
        }
        let logging = async move {
            let (replies, usage) = match mode {
                Mode::Json(buffer) => match replies_from_json(&buffer) {
                    Ok(found) => found,
                    Err(err) => {
                        tracing::warn!(conversation = %target.id, error = %err, "reply is not a chat completion; not logged");
                        return;
                    }
                },
                Mode::Sse {
                    frames,
                    parsed,
                    lost,
                } => {
                    drop(frames);
                    if lost {
                        parsed.abort();
                        tracing::warn!(conversation = %target.id, "reply capture fell behind the stream; not logged");
                        return;
                    }
                    let Ok(assembler) = parsed.await else { return };
                    replies_from_stream(assembler)
                }
                Mode::Undecided | Mode::Skip => return,
            };
            if replies.is_empty() {
                return;
            }
            let calibration = target.estimate.as_ref().and_then(|(local, generation)| {
                let server = usage.as_ref()?.get("prompt_tokens")?.as_u64()?;
                Some(Calibration {
                    model: target.model.clone(),
                    generation: generation.clone(),
                    local: *local,
                    server,
                })
            });
            if let Err(err) = target
                .tracker
                .record_replies(
                    &target.id,
                    target.parent,
                    &target.model,
                    usage,
                    calibration,
                    replies,
                )
                .await
            {
                tracing::error!(conversation = %target.id, error = %err, "cannot log the reply");
            }
        };
        Some(
            async move {
                if tokio::time::timeout(LOG_DEADLINE, logging).await.is_err() {
                    tracing::error!(
                        "logging the reply took longer than {LOG_DEADLINE:?}; response released"
                    );
                }
            }
            .boxed(),
        )
    }
}

async fn assemble_stream(receiver: mpsc::Receiver<Bytes>) -> StreamAssembler {
    let frames = stream::unfold(receiver, |mut receiver| async move {
        receiver
            .recv()
            .await
            .map(|bytes| (Ok::<_, std::convert::Infallible>(bytes), receiver))
    });
    let mut events = std::pin::pin!(frames.eventsource());
    let mut assembler = StreamAssembler::default();
    while let Some(event) = events.next().await {
        match event {
            Ok(event) => assembler.push(&event.data),
            Err(err) => tracing::debug!(error = %err, "unparseable SSE event"),
        }
    }
    assembler
}

#[derive(Deserialize)]
struct Completion {
    choices: Vec<CompletionChoice>,
    #[serde(default)]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct CompletionChoice {
    #[serde(default)]
    index: u64,
    message: Box<RawValue>,
    #[serde(default)]
    finish_reason: Option<String>,
}

/// The choices of a non-streamed completion, each message exactly as sent.
pub fn replies_from_json(
    body: &[u8],
) -> Result<(Vec<CapturedReply>, Option<Value>), serde_json::Error> {
    let completion: Completion = serde_json::from_slice(body)?;
    let replies = completion
        .choices
        .into_iter()
        .map(|choice| CapturedReply {
            message: choice.message,
            finish_reason: choice.finish_reason,
            choice: choice.index,
        })
        .collect();
    Ok((replies, completion.usage))
}

fn replies_from_stream(assembler: StreamAssembler) -> (Vec<CapturedReply>, Option<Value>) {
    let usage = assembler.usage().cloned();
    let replies = assembler
        .finish()
        .into_iter()
        .filter_map(|choice| {
            let message = serde_json::value::to_raw_value(&choice.message).ok()?;
            Some(CapturedReply {
                message,
                finish_reason: choice.finish_reason,
                choice: choice.index,
            })
        })
        .collect();
    (replies, usage)
}
