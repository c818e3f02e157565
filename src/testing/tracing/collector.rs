//! An OTLP/HTTP collector in the test's runtime: it decodes what handoff exports and
//! keeps every span and metric name, or (`Slow`) takes requests and never answers.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use opentelemetry_proto::tonic::collector::metrics::v1::ExportMetricsServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as Any;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use tokio::net::TcpListener;

/// How the collector answers.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Answers {
    /// 200 at once.
    Promptly,
    /// Never.
    Never,
}

/// What reached the collector.
#[derive(Default)]
pub(crate) struct Received {
    /// Every span, in arrival order.
    pub spans: Vec<Span>,
    /// Every metric name.
    pub metrics: Vec<String>,
    /// The raw export bodies, for greps.
    pub raw: Vec<Bytes>,
}

/// A running collector.
pub(crate) struct Collector {
    addr: SocketAddr,
    received: Arc<Mutex<Received>>,
    /// How many exports have arrived, answered or not.
    arrivals: tokio::sync::watch::Receiver<usize>,
}

impl Collector {
    /// Starts one.
    pub(crate) async fn start(answers: Answers) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let received = Arc::new(Mutex::new(Received::default()));
        let shared = Arc::clone(&received);
        let (arrived, arrivals) = tokio::sync::watch::channel(0);
        let arrived = Arc::new(arrived);
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let shared = Arc::clone(&shared);
                let arrived = Arc::clone(&arrived);
                tokio::spawn(async move {
                    let service =
                        service_fn(move |request: http::Request<hyper::body::Incoming>| {
                            let shared = Arc::clone(&shared);
                            arrived.send_modify(|count| *count += 1);
                            async move {
                                if answers == Answers::Never {
                                    std::future::pending::<()>().await;
                                }
                                let path = request.uri().path().to_owned();
                                let body = request.into_body().collect().await.unwrap().to_bytes();
                                let mut received = shared.lock().unwrap();
                                received.raw.push(body.clone());
                                if path == "/v1/traces" {
                                    let export = ExportTraceServiceRequest::decode(body).unwrap();
                                    for resource in export.resource_spans {
                                        for scope in resource.scope_spans {
                                            received.spans.extend(scope.spans);
                                        }
                                    }
                                } else if path == "/v1/metrics" {
                                    let export = ExportMetricsServiceRequest::decode(body).unwrap();
                                    for resource in export.resource_metrics {
                                        for scope in resource.scope_metrics {
                                            received
                                                .metrics
                                                .extend(scope.metrics.into_iter().map(|m| m.name));
                                        }
                                    }
                                }
                                Ok::<_, Infallible>(
                                    http::Response::builder()
                                        .header("content-type", "application/x-protobuf")
                                        .body(Full::new(Bytes::new()))
                                        .unwrap(),
                                )
                            }
                        });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Self {
            addr,
            received,
            arrivals,
        }
    }

    /// Waits until `count` exports have arrived.
    pub(crate) async fn arrived(&self, count: usize) {
        let mut arrivals = self.arrivals.clone();
        arrivals.wait_for(|n| *n >= count).await.unwrap();
    }

    /// Its base URL.
    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// What it received so far.
    pub(crate) fn with<T>(&self, read: impl FnOnce(&Received) -> T) -> T {
        read(&self.received.lock().unwrap())
    }
}

/// A span's attribute, as text (strings, integers and booleans; arrays joined by `,`).
pub(crate) fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(text(value))
}

fn text(value: &Any) -> String {
    match value {
        Any::StringValue(s) => s.clone(),
        Any::IntValue(i) => i.to_string(),
        Any::BoolValue(b) => b.to_string(),
        Any::DoubleValue(d) => d.to_string(),
        Any::ArrayValue(array) => array
            .values
            .iter()
            .filter_map(|v| v.value.as_ref().map(text))
            .collect::<Vec<_>>()
            .join(","),
        _ => String::new(),
    }
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
