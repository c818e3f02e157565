//! The span queue: ended spans wait here, at most `tracing.queue` of them, for the
//! export thread, which sends them to the collector in batches. A request never waits
//! on it: a span that finds the queue full is dropped and counted, and so is a batch
//! the collector refused or did not take within `tracing.export_timeout`.
//!
//! The SDK's batch processor drops on a full queue too, but keeps its count to itself;
//! the operator needs it on `/metrics` (`handoff_otel_spans_dropped_total`). And a
//! request does not wake the export thread: the thread gathers for [`GATHER`], and is
//! woken early only by a full batch or a flush (as the log writer, `telemetry::batch`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::{OTelSdkError, OTelSdkResult};
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use tokio::sync::Notify;

use crate::metrics::{Metrics, SPANS_DROPPED, SPANS_EXPORTED};

/// Spans sent in one export at most.
const BATCH: usize = 512;
/// How long the export thread gathers spans before it sends them.
const GATHER: Duration = Duration::from_millis(500);

/// What waits for the export thread.
#[derive(Debug, Default)]
struct Pending {
    spans: Vec<SpanData>,
    /// Flushes asked for: each answered once what was queued before it is exported.
    flushes: Vec<std::sync::mpsc::SyncSender<()>>,
    /// The processor is gone: export what is left, and stop.
    closed: bool,
}

#[derive(Debug, Default)]
struct Shared {
    pending: Mutex<Pending>,
    wake: Notify,
}

/// The processor the tracer provider ends spans into.
#[derive(Debug)]
pub(crate) struct Queue {
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    capacity: usize,
    timeout: Duration,
}

impl Queue {
    /// A queue of `capacity` spans, exported by `exporter` on a thread of its own
    /// with its own runtime: no worker ever runs an export. `on_thread` runs on that
    /// runtime first (the metrics reader starts its task there).
    pub(crate) fn start<E: SpanExporter + 'static>(
        exporter: E,
        capacity: usize,
        timeout: Duration,
        metrics: Arc<Metrics>,
        on_thread: impl FnOnce() + Send + 'static,
    ) -> std::io::Result<Self> {
        let shared = Arc::new(Shared::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let exporting = Export {
            exporter,
            shared: Arc::clone(&shared),
            timeout,
            metrics: Arc::clone(&metrics),
        };
        std::thread::Builder::new()
            .name("handoff-otel".to_owned())
            .spawn(move || {
                runtime.block_on(async move {
                    on_thread();
                    exporting.run().await;
                });
            })?;
        Ok(Self {
            shared,
            metrics,
            capacity,
            timeout,
        })
    }

    /// Waits, at most `within`, for what is queued now to be exported.
    fn flush_within(&self, within: Duration) -> OTelSdkResult {
        let (done, exported) = std::sync::mpsc::sync_channel(1);
        self.shared
            .pending
            .lock()
            .map_err(|_| OTelSdkError::InternalFailure("the span queue is poisoned".into()))?
            .flushes
            .push(done);
        self.shared.wake.notify_one();
        // Blocking: the SDK's flush and shutdown are synchronous, and are called off
        // the request path (shutdown, tests), never on the export thread.
        exported
            .recv_timeout(within)
            .map_err(|_| OTelSdkError::Timeout(within))
    }

    fn close(&self) {
        if let Ok(mut pending) = self.shared.pending.lock() {
            pending.closed = true;
        }
        self.shared.wake.notify_one();
    }
}

impl SpanProcessor for Queue {
    fn on_start(&self, _span: &mut Span, _cx: &Context) {}

    fn on_end(&self, span: SpanData) {
        let Ok(mut pending) = self.shared.pending.lock() else {
            return;
        };
        if pending.closed {
            return;
        }
        if pending.spans.len() >= self.capacity {
            drop(pending);
            self.metrics
                .add(SPANS_DROPPED, &[("reason", "queue_full")], 1.0);
            return;
        }
        pending.spans.push(span);
        let full = pending.spans.len() == self.capacity.min(BATCH);
        drop(pending);
        if full {
            self.shared.wake.notify_one();
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.flush_within(self.timeout + GATHER)
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let flushed = self.flush_within(timeout);
        self.close();
        flushed
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        self.close();
    }
}

/// The export thread's side.
struct Export<E> {
    exporter: E,
    shared: Arc<Shared>,
    timeout: Duration,
    metrics: Arc<Metrics>,
}

impl<E: SpanExporter> Export<E> {
    /// Gathers and exports until the queue is closed.
    async fn run(self) {
        loop {
            tokio::select! {
                () = self.shared.wake.notified() => {}
                () = tokio::time::sleep(GATHER) => {}
            }
            let (spans, flushes, closed) = match self.shared.pending.lock() {
                Ok(mut pending) => (
                    std::mem::take(&mut pending.spans),
                    std::mem::take(&mut pending.flushes),
                    pending.closed,
                ),
                Err(_) => return,
            };
            let mut spans = spans.into_iter().peekable();
            while spans.peek().is_some() {
                self.export(spans.by_ref().take(BATCH).collect()).await;
            }
            for done in flushes {
                let _ = done.try_send(());
            }
            if closed {
                return;
            }
        }
    }

    /// Exports `batch`, counting it as exported or dropped.
    async fn export(&self, batch: Vec<SpanData>) {
        let count = batch.len() as f64;
        match tokio::time::timeout(self.timeout, self.exporter.export(batch)).await {
            Ok(Ok(())) => self.metrics.add(SPANS_EXPORTED, &[], count),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, spans = count, "span export failed; the spans are dropped");
                self.metrics
                    .add(SPANS_DROPPED, &[("reason", "export_failed")], count);
            }
            Err(_) => {
                tracing::warn!(timeout = ?self.timeout, spans = count, "span export timed out; the spans are dropped");
                self.metrics
                    .add(SPANS_DROPPED, &[("reason", "export_timeout")], count);
            }
        }
    }
}
