//! `[tracing]`: OpenTelemetry spans and GenAI metrics over OTLP/HTTP. Off until an
//! endpoint is named, here or in the standard `OTEL_EXPORTER_OTLP_*` variables.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The variables the OpenTelemetry specification defines, as handoff reads them.
pub mod env {
    /// The OTLP base URL every signal's path is appended to.
    pub const ENDPOINT: &str = "OTEL_EXPORTER_OTLP_ENDPOINT";
    /// The traces' own URL, taken as it is.
    pub const TRACES_ENDPOINT: &str = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT";
    /// `true` turns the SDK off whatever else is set.
    pub const SDK_DISABLED: &str = "OTEL_SDK_DISABLED";
    /// The GenAI instrumentations' opt-in to message contents.
    pub const CAPTURE_CONTENT: &str = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT";
    /// The service name, when `tracing.service_name` is unset.
    pub const SERVICE_NAME: &str = "OTEL_SERVICE_NAME";
}

/// OpenTelemetry export.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP base URL (`http://localhost:4318`): spans go to
    /// `{endpoint}/v1/traces`, metrics to `{endpoint}/v1/metrics`. Unset: off, unless
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set.
    pub endpoint: Option<String>,
    /// Headers every export carries (a backend's API key); masked when shown, added to
    /// `OTEL_EXPORTER_OTLP_HEADERS`'.
    pub headers: BTreeMap<String, String>,
    /// The share of new traces sampled, 0 to 1; a client's sampled flag is followed.
    /// Unset: `OTEL_TRACES_SAMPLER`/`OTEL_TRACES_SAMPLER_ARG`, else every trace.
    pub sample_ratio: Option<f64>,
    /// Message contents on the spans (`gen_ai.input.messages`, `gen_ai.output.messages`),
    /// as the view-stage hooks left them. Unset:
    /// `OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`, else never.
    pub capture_content: Option<bool>,
    /// `service.name`; `OTEL_SERVICE_NAME`, else `handoff`, when unset.
    pub service_name: Option<String>,
    /// More resource attributes (`deployment.environment.name = "prod"`), over
    /// `OTEL_RESOURCE_ATTRIBUTES`'.
    pub resource: BTreeMap<String, String>,
    /// Ended spans waiting for export, at most; past it a span is dropped and counted
    /// (`handoff_otel_spans_dropped_total`), never waited for.
    pub queue: usize,
    /// How long one export may take before its spans count as dropped.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
    /// The GenAI client metrics (`gen_ai.client.token.usage`,
    /// `gen_ai.client.operation.duration`) over OTLP too.
    pub metrics: bool,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            endpoint: None,
            headers: BTreeMap::new(),
            sample_ratio: None,
            capture_content: None,
            service_name: None,
            resource: BTreeMap::new(),
            queue: 2048,
            export_timeout: Duration::from_secs(10),
            metrics: true,
        }
    }
}

impl TracingConfig {
    /// True when spans are exported: an endpoint is named here or in the environment,
    /// and `OTEL_SDK_DISABLED` is not `true`.
    pub fn enabled(&self) -> bool {
        let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.trim().is_empty());
        let disabled = std::env::var(env::SDK_DISABLED)
            .is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"));
        !disabled
            && (self
                .endpoint
                .as_deref()
                .is_some_and(|e| !e.trim().is_empty())
                || set(env::ENDPOINT)
                || set(env::TRACES_ENDPOINT))
    }

    /// Whether message contents go on the spans.
    pub fn captures_content(&self) -> bool {
        self.capture_content.unwrap_or_else(|| {
            std::env::var(env::CAPTURE_CONTENT)
                .is_ok_and(|value| value.trim().eq_ignore_ascii_case("true"))
        })
    }

    /// `{endpoint}/{path}` for the configured base, `None` when the environment decides.
    pub fn signal_url(&self, path: &str) -> Option<String> {
        let base = self.endpoint.as_deref()?.trim().trim_end_matches('/');
        (!base.is_empty()).then(|| format!("{base}/{path}"))
    }

    /// Checks what the types cannot.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        if let Some(ratio) = self.sample_ratio {
            if !(0.0..=1.0).contains(&ratio) {
                return Err((
                    "tracing.sample_ratio",
                    format!("must be between 0 and 1, not {ratio}"),
                ));
            }
        }
        if let Some(endpoint) = self.endpoint.as_deref().filter(|e| !e.trim().is_empty()) {
            let scheme_ok = endpoint.starts_with("http://") || endpoint.starts_with("https://");
            if !scheme_ok || endpoint.parse::<http::Uri>().is_err() {
                return Err((
                    "tracing.endpoint",
                    format!("must be an http:// or https:// URL, not {endpoint:?}"),
                ));
            }
        }
        if self.queue == 0 {
            return Err(("tracing.queue", "must be at least 1".to_owned()));
        }
        for name in self.headers.keys() {
            if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                return Err(("tracing.headers", format!("{name:?} is not a header name")));
            }
        }
        Ok(())
    }
}
