//! OpenTelemetry export (`[tracing]`): the tracer and meter providers, their OTLP/HTTP
//! exporters over hyper, and the request span every proxied request opens.
//!
//! The layers make their spans through [`crate::telemetry::spans`], from the
//! [`Tracing`] the request carries in its context; this module is where that comes
//! from. Spans leave through the [`queue`], on a thread of their own.

mod attributes;
mod queue;
mod request;

use std::sync::Arc;
use std::time::Duration;

use opentelemetry::global::BoxedTracer;
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry::KeyValue;
use opentelemetry_http::hyper::HyperClient;
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use opentelemetry_sdk::Resource;

pub(crate) use attributes::{decision, input, reply, request_model, response_model};
pub(crate) use request::RequestSpan;

use crate::config::{otel_env, TracingConfig};
use crate::metrics::Metrics;
use crate::telemetry::spans::{GenAiMetrics, Tracing};

/// How often the GenAI metrics are exported.
const METRICS_INTERVAL: Duration = Duration::from_secs(10);

/// Bucket bounds the GenAI conventions advise for `gen_ai.client.token.usage`.
const TOKEN_BUCKETS: [f64; 14] = [
    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0, 4194304.0,
    16777216.0, 67108864.0,
];
/// … and for `gen_ai.client.operation.duration`, in seconds.
const DURATION_BUCKETS: [f64; 14] = [
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

/// Why tracing could not start.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OtelError {
    /// The exporter refused its settings.
    #[error("tracing: cannot build the OTLP exporter: {0}")]
    Exporter(String),
    /// The export thread did not start.
    #[error("tracing: cannot start the export thread: {0}")]
    Thread(#[from] std::io::Error),
}

/// The running export: what requests trace with, and what is flushed at exit.
pub(crate) struct Telemetry {
    tracing: Tracing,
    propagator: TraceContextPropagator,
    tracer: SdkTracerProvider,
    meters: Option<SdkMeterProvider>,
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}

impl Telemetry {
    /// Starts the export `config` asks for; `None` when tracing is off.
    pub(crate) fn start(
        config: &TracingConfig,
        metrics: Arc<Metrics>,
    ) -> Result<Option<Self>, OtelError> {
        if !config.enabled() {
            return Ok(None);
        }
        let resource = resource(config);
        // The queue's own limit decides when an export has taken too long (and counts
        // it): the client's and the exporter's wait longer.
        let client = http_client(config.export_timeout * 2);
        let headers: std::collections::HashMap<String, String> = config
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let mut spans = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_http_client(client.clone())
            .with_headers(headers.clone())
            .with_timeout(config.export_timeout * 2);
        if let Some(url) = config.signal_url("v1/traces") {
            spans = spans.with_endpoint(url);
        }
        let mut exporter = spans
            .build()
            .map_err(|err| OtelError::Exporter(err.to_string()))?;
        opentelemetry_sdk::trace::SpanExporter::set_resource(&mut exporter, &resource);
        let meter_exporter = if config.metrics {
            let mut builder = opentelemetry_otlp::MetricExporter::builder()
                .with_http()
                .with_http_client(client)
                .with_headers(headers)
                .with_timeout(config.export_timeout);
            if let Some(url) = config.signal_url("v1/metrics") {
                builder = builder.with_endpoint(url);
            }
            Some(
                builder
                    .build()
                    .map_err(|err| OtelError::Exporter(err.to_string()))?,
            )
        } else {
            None
        };
        // The metrics reader's task runs on the export thread's runtime: the provider
        // is built there, where registering the reader spawns it.
        let (meters_sender, meters_receiver) = std::sync::mpsc::sync_channel(1);
        let meter_resource = resource.clone();
        let on_thread = move || {
            let meters = meter_exporter.map(|exporter| {
                let reader = opentelemetry_sdk::metrics::periodic_reader_with_async_runtime::PeriodicReader::builder(
                    exporter,
                    opentelemetry_sdk::runtime::Tokio,
                )
                .with_interval(METRICS_INTERVAL)
                .build();
                SdkMeterProvider::builder()
                    .with_resource(meter_resource)
                    .with_reader(reader)
                    .build()
            });
            let _ = meters_sender.send(meters);
        };
        let queue = queue::Queue::start(
            exporter,
            config.queue,
            config.export_timeout,
            metrics,
            on_thread,
        )?;
        let mut provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_span_processor(queue);
        if let Some(ratio) = config.sample_ratio {
            provider = provider.with_sampler(Sampler::ParentBased(Box::new(
                Sampler::TraceIdRatioBased(ratio),
            )));
        }
        let tracer_provider = provider.build();
        let meters = meters_receiver
            .recv_timeout(Duration::from_secs(5))
            .ok()
            .flatten();
        let gen_ai = meters.as_ref().map(|provider| {
            let meter = provider.meter("handoff");
            GenAiMetrics {
                tokens: meter
                    .u64_histogram("gen_ai.client.token.usage")
                    .with_unit("{token}")
                    .with_description("Number of input and output tokens used.")
                    .with_boundaries(TOKEN_BUCKETS.to_vec())
                    .build(),
                duration: meter
                    .f64_histogram("gen_ai.client.operation.duration")
                    .with_unit("s")
                    .with_description("GenAI operation duration.")
                    .with_boundaries(DURATION_BUCKETS.to_vec())
                    .build(),
            }
        });
        let tracer = BoxedTracer::new(Box::new(tracer_provider.tracer("handoff")));
        tracing::info!(
            sampled = config.sample_ratio.unwrap_or(1.0),
            content = config.captures_content(),
            "OpenTelemetry export on"
        );
        Ok(Some(Self {
            tracing: Tracing::new(
                tracer,
                Box::new(TraceContextPropagator::new()),
                config.captures_content(),
                gen_ai,
            ),
            propagator: TraceContextPropagator::new(),
            tracer: tracer_provider,
            meters,
        }))
    }

    /// Exports what is still queued, within `grace`; called once, at exit.
    pub(crate) fn shutdown(&self, grace: Duration) {
        if let Err(err) = self.tracer.shutdown_with_timeout(grace) {
            tracing::warn!(error = %err, "spans still queued at exit were not exported");
        }
        if let Some(meters) = &self.meters {
            if let Err(err) = meters.shutdown_with_timeout(grace) {
                tracing::warn!(error = %err, "the last GenAI metrics were not exported");
            }
        }
    }

    /// Exports every span and metric recorded so far.
    #[cfg(test)]
    pub(crate) fn flush(&self) {
        let _ = self.tracer.force_flush();
        if let Some(meters) = &self.meters {
            let _ = meters.force_flush();
        }
    }
}

/// The resource: `service.name` and the config's attributes over the environment's.
fn resource(config: &TracingConfig) -> Resource {
    let mut builder = Resource::builder();
    let from_env = std::env::var(otel_env::SERVICE_NAME).is_ok_and(|n| !n.trim().is_empty());
    match &config.service_name {
        Some(name) => builder = builder.with_service_name(name.clone()),
        None if !from_env => builder = builder.with_service_name("handoff"),
        None => {}
    }
    builder
        .with_attribute(KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .with_attributes(
            config
                .resource
                .iter()
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .build()
}

/// hyper with rustls and the web's roots: a collector may be on `https`.
fn http_client(
    timeout: Duration,
) -> HyperClient<hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>> {
    let connector = hyper_rustls::HttpsConnectorBuilder::new()
        .with_webpki_roots()
        .https_or_http()
        .enable_http1()
        .build();
    HyperClient::new(connector, timeout, None)
}
