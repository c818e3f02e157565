//! The span queue: ended spans wait here, at most `tracing.queue` of them, for the
//! export thread, which sends them to the collector in batches. A request never waits
//! on it: a span that finds the queue full is dropped and counted, and so is a batch
//! the collector refused or did not take within `tracing.export_timeout`.
//!
//! The SDK's batch processor drops on a full queue too, but keeps its count to itself;
//! the operator needs it on `/metrics` (`handoff_otel_spans_dropped_total`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::mpsc;

use crate::metrics::{Metrics, SPANS_DROPPED, SPANS_EXPORTED};

/// Spans sent in one export at most.
const BATCH: usize = 512;
/// How long a span waits for more to join its batch.
const GATHER: Duration = Duration::from_millis(500);

enum Message {
    Span(Box<SpanData>),
    /// Export what is queued, then answer.
    Flush(std::sync::mpsc::SyncSender<()>),
}

/// The processor the tracer provider ends spans into.
#[derive(Debug)]
pub(crate) struct Queue {
    sender: mpsc::Sender<Message>,
    metrics: Arc<Metrics>,
    closed: AtomicBool,
    timeout: Duration,
}

impl Queue {
    /// A queue of `capacity` spans, exported by `exporter` on a thread of its own
    /// (its own runtime: no worker ever runs an export); `None` when the thread could
    /// not start. `on_thread` runs on that thread's runtime first (the metrics reader
    /// starts its task there).
    pub(crate) fn start<E: SpanExporter + 'static>(
        exporter: E,
        capacity: usize,
        timeout: Duration,
        metrics: Arc<Metrics>,
        on_thread: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let (sender, receiver) = mpsc::channel(capacity);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let counted = Arc::clone(&metrics);
        std::thread::Builder::new()
            .name("handoff-otel".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    on_thread();
                    export_loop(exporter, receiver, timeout, counted).await;
                });
            })?;
        Ok(Self {
            sender,
            metrics,
            closed: AtomicBool::new(false),
            timeout,
        })
    }

    /// Waits, at most `within`, for what is queued now to be exported.
    fn flush_within(&self, within: Duration) -> OTelSdkResult {
        let (done, exported) = std::sync::mpsc::sync_channel(1);
        self.sender
            .try_send(Message::Flush(done))
            .map_err(|_| OTelSdkError::InternalFailure("the span queue is full".into()))?;
        // Blocking: the SDK's flush and shutdown are synchronous, and are called off
        // the request path (shutdown, tests), never on the export thread.
        exported
            .recv_timeout(within)
            .map_err(|_| OTelSdkError::Timeout(within))
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        if self.closed.load(Ordering::Relaxed) {
            return;
        }
        if self.sender.try_send(Message::Span(Box::new(span))).is_err() {
            self.metrics
                .add(SPANS_DROPPED, &[("reason", "queue_full")], 1.0);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush_within(self.timeout + GATHER)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let flushed = self.flush_within(timeout);
        self.closed.store(true, Ordering::Relaxed);
        flushed
    }
}

/// Gathers spans into batches and exports them, until every sender is gone.
async fn export_loop<E: SpanExporter>(
    exporter: E,
    mut receiver: mpsc::Receiver<Message>,
    timeout: Duration,
    metrics: Arc<Metrics>,
) {
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let message = if batch.is_empty() {
            receiver.recv().await
        } else {
            match tokio::time::timeout(GATHER, receiver.recv()).await {
                Ok(message) => message,
                Err(_) => {
                    export(&exporter, &mut batch, timeout, &metrics).await;
                    continue;
                }
            }
        };
        match message {
            Some(Message::Span(span)) => {
                batch.push(*span);
                if batch.len() >= BATCH {
                    export(&exporter, &mut batch, timeout, &metrics).await;
                }
            }
            Some(Message::Flush(done)) => {
                export(&exporter, &mut batch, timeout, &metrics).await;
                let _ = done.try_send(());
            }
            None => {
                export(&exporter, &mut batch, timeout, &metrics).await;
                return;
            }
        }
    }
}

/// Exports `batch`, counting it as exported or dropped.
async fn export<E: SpanExporter>(
    exporter: &E,
    batch: &mut Vec<SpanData>,
    timeout: Duration,
    metrics: &Metrics,
) {
    if batch.is_empty() {
        return;
    }
    let spans = std::mem::replace(batch, Vec::with_capacity(BATCH));
    let count = spans.len() as f64;
    match tokio::time::timeout(timeout, exporter.export(spans)).await {
        Ok(Ok(())) => metrics.add(SPANS_EXPORTED, &[], count),
        Ok(Err(err)) => {
            tracing::warn!(error = %err, spans = count, "span export failed; the spans are dropped");
            metrics.add(SPANS_DROPPED, &[("reason", "export_failed")], count);
        }
        Err(_) => {
            tracing::warn!(timeout = ?timeout, spans = count, "span export timed out; the spans are dropped");
            metrics.add(SPANS_DROPPED, &[("reason", "export_timeout")], count);
        }
    }
}
