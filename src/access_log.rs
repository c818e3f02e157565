//! One log line per request: method, target, status, total and upstream time, the
//! body bytes sent, and how the body ended.
//!
//! [`RequestLog::respond`] wraps every response body, so the line is written when the
//! body really ends (or is dropped): streams report their real duration, and the
//! outcome and byte count are what the client was sent. Targets are masked; headers
//! are never logged.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Method, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};

use crate::base::id::ConversationId;
pub use crate::base::outcome::Outcome;
use crate::base::tenant::TenantId;
use crate::body::{BoxError, ProxyBody};
use crate::metrics::Metrics;

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
    conversation: Option<ConversationId>,
    tenant: Option<TenantId>,
    head_at: Option<Duration>,
    metrics: Option<Arc<Metrics>>,
    /// The request's span, when it is traced: ended with the line.
    span: Option<crate::otel::RequestSpan>,
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
            tenant: None,
            head_at: None,
            metrics: None,
            span: None,
        }
    }

    /// Ends `span` with this request: its status, and how its body ended.
    pub(crate) fn trace(&mut self, span: crate::otel::RequestSpan) {
        self.span = Some(span);
    }

    /// Reports this request's overhead to `metrics` when it ends.
    pub(crate) fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// When the request began.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Hands the log to `response`'s body, which writes it when the body ends.
    pub(crate) fn respond(mut self, response: Response<ProxyBody>) -> Response<Logged> {
        self.status = Some(response.status());
        self.head_at = Some(self.started.elapsed());
        let (parts, inner) = response.into_parts();
        if inner.is_end_stream() {
            // hyper never polls a body that is empty from the start.
            self.outcome = Outcome::Complete;
        }
        Response::from_parts(parts, Logged { inner, log: self })
    }

    /// Records the time from sending upstream to the response head.
    pub(crate) fn set_upstream_time(&mut self, elapsed: Duration) {
        self.upstream_time = Some(elapsed);
    }

    /// Records the tenant the request was admitted as.
    pub fn set_tenant(&mut self, tenant: &TenantId) {
        if let Some(span) = &self.span {
            span.set(opentelemetry::KeyValue::new(
                crate::telemetry::spans::attr::TENANT,
                tenant.as_str().to_owned(),
            ));
        }
        self.tenant = Some(tenant.clone());
    }

    /// Records the conversation this request belongs to.
    pub fn set_conversation(&mut self, id: &ConversationId) {
        if let Some(span) = &self.span {
            use crate::telemetry::spans::attr;
            span.set(opentelemetry::KeyValue::new(
                attr::CONVERSATION,
                id.as_str().to_owned(),
            ));
            span.set(opentelemetry::KeyValue::new(
                attr::HANDOFF_CONVERSATION,
                id.as_str().to_owned(),
            ));
        }
        self.conversation = Some(id.clone());
    }

    /// Total time so far.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

/// A response body that counts what it sends and writes the access line when it ends.
pub struct Logged {
    inner: ProxyBody,
    log: RequestLog,
}

impl Body for Logged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.log.bytes += data.len() as u64;
                }
                // hyper stops polling a body once it reports its end.
                if this.inner.is_end_stream() {
                    this.log.outcome = Outcome::Complete;
                }
            }
            Poll::Ready(Some(Err(err))) => {
                this.log.outcome = outcome_of(err.as_ref());
            }
            Poll::Ready(None) => this.log.outcome = Outcome::Complete,
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The outcome a body error stands for: the relay's errors know; any other is ours.
fn outcome_of(err: &(dyn std::error::Error + Send + Sync + 'static)) -> Outcome {
    err.downcast_ref::<crate::relay::RelayError>()
        .map_or(Outcome::Error, crate::relay::RelayError::outcome)
}

impl Drop for RequestLog {
    fn drop(&mut self) {
        if let (Some(metrics), Some(head), Some(upstream)) =
            (&self.metrics, self.head_at, self.upstream_time)
        {
            metrics.observe_overhead(head.saturating_sub(upstream));
        }
        if let Some(span) = self.span.take() {
            span.end(self.status, self.outcome, self.started.elapsed());
        }
        tracing::info!(
            target: crate::telemetry::ACCESS_TARGET,
            method = %self.method,
            path = %self.target,
            status = self.status.map(|s| s.as_u16()),
            total_ms = %Millis(self.started.elapsed()),
            upstream_ms = self.upstream_time.map(Millis).map(tracing::field::display),
            bytes = self.bytes,
            outcome = self.outcome.as_str(),
            tenant = self.tenant.as_ref().map(TenantId::as_str),
            conversation = self.conversation.as_ref().map(ConversationId::as_str),
            "request"
        );
    }
}

/// A duration in milliseconds to two decimals, from integers: no float formatting,
/// nor a `String`, on every request.
struct Millis(Duration);

impl std::fmt::Display for Millis {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hundredths = (self.0.as_nanos() + 5_000) / 10_000;
        let fraction = hundredths % 100;
        f.write_str(itoa::Buffer::new().format(hundredths / 100))?;
        f.write_str(if fraction < 10 { ".0" } else { "." })?;
        f.write_str(itoa::Buffer::new().format(fraction))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn millis_are_rounded_to_hundredths() {
        let shown = |nanos: u64| Millis(Duration::from_nanos(nanos)).to_string();
        assert_eq!(shown(0), "0.00");
        assert_eq!(shown(4_999), "0.00");
        assert_eq!(shown(5_000), "0.01");
        assert_eq!(shown(231_400), "0.23");
        assert_eq!(shown(1_995_000), "2.00");
        assert_eq!(shown(12_345_678_000), "12345.68");
    }
}
