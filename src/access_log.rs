//! One log line per request: method, target, status, total and upstream time, bytes.
//!
//! The line is written when the response body ends (or is dropped), so streamed
//! responses report their real duration. Targets are masked; headers are never logged.

use std::time::{Duration, Instant};

use std::sync::Arc;

use http::{Method, StatusCode};

use crate::metrics::Metrics;

/// How a response body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every byte reached the client.
    Complete,
    /// The upstream closed or broke the stream before its end.
    UpstreamCut,
    /// The upstream went silent for longer than `upstream.read_timeout`.
    UpstreamIdle,
    /// The client went away first.
    ClientGone,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::UpstreamCut => "upstream_cut",
            Outcome::UpstreamIdle => "upstream_idle_timeout",
            Outcome::ClientGone => "client_gone",
        }
    }
}

/// The facts of one request, logged once when dropped.
#[derive(Debug)]
pub struct RequestLog {
    method: Method,
    target: String,
    started: Instant,
    status: Option<StatusCode>,
    upstream_time: Option<Duration>,
    bytes: u64,
    outcome: Outcome,
    conversation: Option<String>,
    head_at: Option<Duration>,
    metrics: Option<Arc<Metrics>>,
}

impl RequestLog {
    /// Starts the clock for a request; `target` must already be masked.
    pub fn start(method: Method, target: String) -> Self {
        Self {
            method,
            target,
            started: Instant::now(),
            status: None,
            upstream_time: None,
            bytes: 0,
            outcome: Outcome::ClientGone,
            conversation: None,
            head_at: None,
            metrics: None,
        }
    }

    /// Reports this request's overhead to `metrics` when it ends.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// When the request began.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Records the status sent to the client.
    pub fn set_status(&mut self, status: StatusCode) {
        self.status = Some(status);
        self.head_at = Some(self.started.elapsed());
    }

    /// Records the time from sending upstream to the response head.
    pub fn set_upstream_time(&mut self, elapsed: Duration) {
        self.upstream_time = Some(elapsed);
    }

    /// Records the conversation this request belongs to.
    pub fn set_conversation(&mut self, id: &str) {
        self.conversation = Some(id.to_owned());
    }

    /// Adds body bytes sent to the client.
    pub fn add_bytes(&mut self, count: usize) {
        self.bytes += count as u64;
    }

    /// Records how the body ended.
    pub fn set_outcome(&mut self, outcome: Outcome) {
        self.outcome = outcome;
    }

    /// Total time so far minus upstream time: what the proxy itself cost.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        if let (Some(metrics), Some(head), Some(upstream)) =
            (&self.metrics, self.head_at, self.upstream_time)
        {
            metrics.observe_overhead(head.saturating_sub(upstream).as_secs_f64());
        }
        let total_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let upstream_ms = self.upstream_time.map(|t| t.as_secs_f64() * 1000.0);
        tracing::info!(
            target: "handoff::access",
            method = %self.method,
            path = %self.target,
            status = self.status.map(|s| s.as_u16()),
            total_ms = format_args!("{total_ms:.2}"),
            upstream_ms = upstream_ms.map(|ms| format!("{ms:.2}")),
            bytes = self.bytes,
            outcome = self.outcome.as_str(),
            conversation = self.conversation.as_deref(),
            "request"
        );
    }
}
