//! OpenTelemetry on the in-process harness, against an in-process OTLP collector: a
//! compacting request is one trace under the client's span (request → compaction →
//! summary calls), its context reaches the upstream, its attributes carry the GenAI
//! conventions' values and handoff's decision, and nothing of a credential (nor,
//! without the operator's opt-in, of a message) leaves; a collector that is down or
//! never answers leaves the requests as they were, and its spans dropped and counted.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod collector;

use std::sync::Arc;

use mock_upstream::strict::Strict;
use mock_upstream::{AgentStyle, MockUpstream};
use opentelemetry_proto::tonic::trace::v1::span::SpanKind;
use opentelemetry_proto::tonic::trace::v1::Span;
use serde_json::{json, Value};

use collector::{attribute, hex, Answers, Collector};

use crate::testing::Harness;

/// The 16k model, which writes the summaries too.
const MODELS: &str = "[models.\"strict-16k\"]\ncontext_window = 16384\n";
/// The client's span: its trace, and its own id.
const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";
/// A key no export may carry.
const KEY: &str = "sk-trace-secret-0123456789abcdef";

/// The strict provider, answering briefly and summarising at a realistic length.
async fn provider() -> (Arc<Strict>, MockUpstream) {
    let strict = Strict::new(16_384);
    strict.set_style(AgentStyle {
        brief_answers: true,
        ..Default::default()
    });
    strict.set_summary_padding(600);
    let answering = Arc::clone(&strict);
    let mock = MockUpstream::with(move |req| answering.answer(req)).await;
    (strict, mock)
}

/// Posts `messages` in conversation `id` under the client's span, with the key.
async fn post(proxy: &Harness, id: &str, messages: &[Value]) -> crate::testing::Answer {
    let body = json!({"model": "strict-16k", "messages": messages});
    let bearer = format!("Bearer {KEY}");
    let parent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    proxy
        .post(
            "/v1/chat/completions",
            &[
                (crate::base::id::CONVERSATION_HEADER, id),
                ("authorization", &bearer),
                ("traceparent", &parent),
                ("tracestate", "client=1"),
            ],
            body.to_string().as_bytes(),
        )
        .await
}

/// Exports everything ended so far (off the runtime: the SDK's flush blocks).
async fn flush(proxy: &Harness) {
    let state = Arc::clone(&proxy.state);
    tokio::task::spawn_blocking(move || state.telemetry.as_ref().unwrap().flush())
        .await
        .unwrap();
}

fn config(collector: &str, more: &str) -> String {
    format!("{MODELS}[tracing]\nendpoint = {collector:?}\n{more}\n")
}

fn named<'a>(spans: &'a [Span], name: &str) -> Vec<&'a Span> {
    spans.iter().filter(|s| s.name == name).collect()
}

/// The `traceparent` of a request the upstream got, split: trace id, parent id.
fn parent_of(request: &mock_upstream::Recorded) -> (String, String) {
    let value = request.headers["traceparent"].to_str().unwrap().to_owned();
    let parts: Vec<&str> = value.split('-').collect();
    (parts[1].to_owned(), parts[2].to_owned())
}

#[tokio::test(start_paused = true)]
async fn a_compacting_request_is_one_trace_from_the_client_span_to_the_summary_calls() {
    let collector = Collector::start(Answers::Promptly).await;
    let (_strict, mock) = provider().await;
    let proxy = Harness::start(&mock.url(), &config(&collector.url(), "")).await;
    let answer = post(&proxy, "traced", &crate::testing::long_history(30, 1000)).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    flush(&proxy).await;

    let spans = collector.with(|r| r.spans.clone());
    assert!(
        spans.iter().all(|s| hex(&s.trace_id) == TRACE),
        "one trace: {spans:#?}"
    );
    // client → handoff's request span
    let requests: Vec<&Span> = spans
        .iter()
        .filter(|s| hex(&s.parent_span_id) == CLIENT_SPAN)
        .collect();
    assert_eq!(requests.len(), 1, "{spans:#?}");
    let request = requests[0];
    assert_eq!(request.name, "chat strict-16k");
    assert_eq!(request.kind, SpanKind::Client as i32);
    let value = |span: &Span, key: &str| {
        attribute(span, key).unwrap_or_else(|| panic!("no {key} on {span:#?}"))
    };
    assert_eq!(value(request, "gen_ai.operation.name"), "chat");
    assert_eq!(value(request, "gen_ai.provider.name"), "openai");
    assert_eq!(value(request, "gen_ai.request.model"), "strict-16k");
    assert!(!value(request, "gen_ai.response.finish_reasons").is_empty());
    assert!(
        value(request, "gen_ai.usage.input_tokens")
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert!(
        value(request, "gen_ai.usage.output_tokens")
            .parse::<u64>()
            .unwrap()
            > 0
    );
    assert_eq!(value(request, "server.address"), "127.0.0.1");
    assert_eq!(
        value(request, "server.port"),
        mock.url().rsplit(':').next().unwrap()
    );
    assert_eq!(value(request, "http.response.status_code"), "200");
    let conversation = value(request, "gen_ai.conversation.id");
    assert!(conversation.ends_with("traced"), "{conversation}");
    assert_eq!(value(request, "handoff.decision.window"), "16384");
    let compaction_id = value(request, "handoff.compaction.id");
    assert!(
        value(request, "handoff.tokens_saved")
            .parse::<u64>()
            .unwrap()
            > 10_000
    );
    assert!(!value(request, "handoff.tenant").is_empty());
    assert!(attribute(request, "error.type").is_none());

    // → compaction
    let compactions = named(&spans, "handoff.compaction");
    assert_eq!(compactions.len(), 1, "{spans:#?}");
    let compaction = compactions[0];
    assert_eq!(compaction.parent_span_id, request.span_id);
    // Zero-wait runs it on its own task, which this request waited for.
    assert_eq!(value(compaction, "handoff.compaction.mode"), "detached");
    assert_eq!(value(compaction, "handoff.compaction.id"), compaction_id);
    assert_eq!(value(compaction, "handoff.compaction.validated"), "true");
    assert_eq!(
        value(compaction, "handoff.compaction.strategy"),
        "summarize"
    );
    assert!(value(compaction, "handoff.compaction.attempts").starts_with("summarize:"));

    // → the summary calls, GenAI client spans of their own
    let summaries: Vec<&Span> = spans
        .iter()
        .filter(|s| attribute(s, "handoff.summary_call").is_some())
        .collect();
    assert!(!summaries.is_empty(), "{spans:#?}");
    for summary in &summaries {
        assert_eq!(summary.parent_span_id, compaction.span_id);
        assert_eq!(summary.kind, SpanKind::Client as i32);
        assert_eq!(value(summary, "gen_ai.request.model"), "strict-16k");
        assert!(
            value(summary, "gen_ai.usage.input_tokens")
                .parse::<u64>()
                .unwrap()
                > 0
        );
    }

    // The upstream got handoff's spans as parents, and the client's tracestate.
    let sent = mock.requests();
    let summary_ids: Vec<String> = summaries.iter().map(|s| hex(&s.span_id)).collect();
    let mut to_summaries = 0;
    let mut to_request = 0;
    for request_sent in &sent {
        let (trace, parent) = parent_of(request_sent);
        assert_eq!(trace, TRACE);
        assert_eq!(request_sent.headers["tracestate"], "client=1");
        if summary_ids.contains(&parent) {
            to_summaries += 1;
        } else {
            assert_eq!(
                parent,
                hex(&request.span_id),
                "only the view goes under the request span"
            );
            to_request += 1;
        }
    }
    assert_eq!(to_request, 1);
    assert_eq!(to_summaries, summaries.len());

    // Never a credential; no message text without the opt-in.
    collector.with(|r| {
        for raw in &r.raw {
            let text = String::from_utf8_lossy(raw);
            assert!(
                !text.contains(KEY) && !text.contains("trace-secret"),
                "a key left"
            );
            assert!(
                !text.contains("FACT-0"),
                "a message left without the opt-in"
            );
        }
    });
    // The GenAI metrics went too.
    let metrics = collector.with(|r| r.metrics.clone());
    assert!(
        metrics
            .iter()
            .any(|m| m == "gen_ai.client.operation.duration"),
        "{metrics:?}"
    );
    assert!(
        metrics.iter().any(|m| m == "gen_ai.client.token.usage"),
        "{metrics:?}"
    );
    assert!(proxy
        .metrics()
        .await
        .contains("handoff_otel_spans_exported_total"));
}

#[tokio::test(start_paused = true)]
async fn message_contents_go_on_the_span_only_on_opt_in_and_as_the_hooks_left_them() {
    let collector = Collector::start(Answers::Promptly).await;
    let (_strict, mock) = provider().await;
    let hooks = "[middleware]\nchain = [\"mask\"]\n[middleware.hooks.mask]\nkind = \"redact\"\nstages = [\"view\"]\npatterns = { password = \"PASSWORD-[0-9]+\" }\n";
    let proxy = Harness::start(
        &mock.url(),
        &format!(
            "{hooks}{}",
            config(&collector.url(), "capture_content = true")
        ),
    )
    .await;
    let messages = [json!({"role": "user", "content": "FACT-777 and PASSWORD-1234"})];
    let answer = post(&proxy, "content", &messages).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    flush(&proxy).await;
    let spans = collector.with(|r| r.spans.clone());
    let request = spans
        .iter()
        .find(|s| hex(&s.parent_span_id) == CLIENT_SPAN)
        .unwrap();
    let input = attribute(request, "gen_ai.input.messages").unwrap();
    assert!(input.contains("FACT-777"), "{input}");
    assert!(
        !input.contains("PASSWORD-1234"),
        "the view hook's redaction holds: {input}"
    );
    assert!(attribute(request, "gen_ai.output.messages").is_some());
    collector.with(|r| {
        for raw in &r.raw {
            assert!(!String::from_utf8_lossy(raw).contains(KEY), "a key left");
        }
    });
}

/// The count of dropped spans for `reason` on `/metrics`.
async fn dropped(proxy: &Harness, reason: &str) -> f64 {
    let text = proxy.metrics().await;
    let prefix = format!("handoff_otel_spans_dropped_total{{reason=\"{reason}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&prefix))
        .map_or(0.0, |n| n.parse().unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_collector_that_never_answers_changes_no_answer_and_its_spans_are_counted_dropped() {
    let collector = Collector::start(Answers::Never).await;
    let (_strict, mock) = provider().await;
    let proxy = Harness::start(
        &mock.url(),
        &config(
            &collector.url(),
            "queue = 4\nexport_timeout = \"1s\"\nmetrics = false",
        ),
    )
    .await;
    let hello = [json!({"role": "user", "content": "hello"})];
    for n in 0..4 {
        let answer = post(&proxy, &format!("slow-{n}"), &hello).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    // The batch waits for the collector until the export's time limit.
    flush(&proxy).await;
    assert_eq!(dropped(&proxy, "export_timeout").await, 4.0);
    // While an export hangs, the queue holds four; the rest are dropped at once.
    let answer = post(&proxy, "hangs", &hello).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let state = Arc::clone(&proxy.state);
    let hanging = tokio::task::spawn_blocking(move || state.telemetry.as_ref().unwrap().flush());
    // The second export is the one that hangs now.
    collector.arrived(2).await;
    for n in 0..10 {
        let answer = post(&proxy, &format!("full-{n}"), &hello).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    assert_eq!(dropped(&proxy, "queue_full").await, 6.0);
    hanging.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_collector_that_is_down_changes_no_answer_and_its_spans_are_counted_dropped() {
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let (_strict, mock) = provider().await;
    let proxy = Harness::start(&mock.url(), &config(&url, "metrics = false")).await;
    let hello = [json!({"role": "user", "content": "hello"})];
    for n in 0..3 {
        let answer = post(&proxy, &format!("down-{n}"), &hello).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        // The client's own traceparent is not forwarded as it came: handoff's span is the parent.
        let sent = mock.requests();
        let (trace, parent) = parent_of(sent.last().unwrap());
        assert_eq!(trace, TRACE);
        assert_ne!(parent, CLIENT_SPAN);
    }
    flush(&proxy).await;
    assert_eq!(dropped(&proxy, "export_failed").await, 3.0);
}

#[tokio::test(start_paused = true)]
async fn without_tracing_the_clients_trace_context_passes_as_it_came() {
    let (_strict, mock) = provider().await;
    let proxy = Harness::start(&mock.url(), MODELS).await;
    assert!(proxy.state.telemetry.is_none());
    let hello = [json!({"role": "user", "content": "hello"})];
    let answer = post(&proxy, "untraced", &hello).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let sent = mock.requests();
    let (trace, parent) = parent_of(&sent[0]);
    assert_eq!((trace.as_str(), parent.as_str()), (TRACE, CLIENT_SPAN));
}
