//! Arize Phoenix (PyPI `arize-phoenix`, installed into `.venv-phoenix` by
//! scripts/test.sh), a backend teams read LLM traces in, started here with its OTLP
//! receiver; the real binary exports to it. A tool-calling session that compacts,
//! under a client's span, is then read back through Phoenix's own REST API: the trace
//! tree (client → handoff's request → compaction → summary calls), the GenAI
//! attributes with their values, the upstream's requests carrying the context, and
//! no credential nor message text in any span.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mock_upstream::strict::Strict;
use mock_upstream::{AgentStyle, MockUpstream};
use serde_json::{json, Value};
use support::client::{request, send};
use support::{Proxy, ProxyOptions};

const KEY: &str = "sk-phoenix-secret-9f8e7d6c5b4a";
const TRACE: &str = "0af7651916cd43dd8448eb211c80319c";
const CLIENT_SPAN: &str = "b7ad6b7169203331";
const PROJECT: &str = "handoff-test";

/// A port nothing listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `phoenix serve` in a working dir of its own, killed when dropped; or, with
/// `TEST_PHOENIX_URL` set, a Phoenix already running there (to look at the
/// trace in its web UI afterwards).
struct Phoenix {
    child: Option<Child>,
    url: String,
    _dir: tempfile::TempDir,
}

impl Drop for Phoenix {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Phoenix {
    async fn start() -> Self {
        if let Ok(url) = std::env::var("TEST_PHOENIX_URL") {
            return Self {
                child: None,
                url,
                _dir: tempfile::tempdir().unwrap(),
            };
        }
        let phoenix = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-phoenix/bin/phoenix");
        assert!(
            phoenix.exists(),
            "{} is missing: run scripts/test.sh",
            phoenix.display()
        );
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let child = Command::new(phoenix)
            .arg("serve")
            .env("PHOENIX_WORKING_DIR", dir.path())
            .env("PHOENIX_HOST", "127.0.0.1")
            .env("PHOENIX_PORT", port.to_string())
            .env("PHOENIX_GRPC_PORT", free_port().to_string())
            .env("PHOENIX_TELEMETRY_ENABLED", "false")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let started = Self {
            child: Some(child),
            url,
            _dir: dir,
        };
        // Listening first (the client helper fails on a refused connection), then ready.
        for _ in 0..240 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                let health =
                    send(request("GET", &format!("{}/healthz", started.url), &[], "")).await;
                if health.status == 200 {
                    return started;
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        panic!("phoenix did not start within two minutes");
    }

    /// Every span of the project, as Phoenix's REST API gives them.
    async fn spans(&self) -> Vec<Value> {
        let url = format!("{}/v1/projects/{PROJECT}/spans?limit=1000", self.url);
        let answer = send(request("GET", &url, &[], "")).await;
        if answer.status != 200 {
            return Vec::new();
        }
        answer.json()["data"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }
}

/// A coding agent's session: each turn reads a file through a tool, then answers.
fn session(turns: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "You are a coding agent."})];
    for n in 0..turns {
        let filler: Vec<String> = (0..500).map(|i| format!("line{i}")).collect();
        messages.push(json!({"role": "user", "content": format!("FACT-{n:03} read file {n}")}));
        messages.push(
            json!({"role": "assistant", "content": null, "tool_calls": [{
                "id": format!("call_{n}"), "type": "function",
                "function": {"name": "read_file", "arguments": format!("{{\"path\":\"f{n}.rs\"}}")}
            }]}),
        );
        messages.push(json!({"role": "tool", "tool_call_id": format!("call_{n}"), "content": filler.join(" ")}));
        messages.push(json!({"role": "assistant", "content": format!("read {n}")}));
    }
    messages.push(json!({"role": "user", "content": "What were the facts?"}));
    messages
}

fn attribute<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attributes"][key]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_compacting_tool_session_reads_back_from_phoenix_as_one_tree() {
    let phoenix = Phoenix::start().await;
    let strict = Strict::new(16_384);
    strict.set_style(AgentStyle {
        brief_answers: true,
        ..Default::default()
    });
    let answering = Arc::clone(&strict);
    let mock = MockUpstream::with(move |req| answering.answer(req)).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: format!(
                "[models.\"strict-16k\"]\ncontext_window = 16384\n\
                 [tracing]\nendpoint = {:?}\nresource = {{ \"openinference.project.name\" = {PROJECT:?} }}\n",
                phoenix.url
            ),
            ..Default::default()
        },
    );
    let tools = json!([{"type": "function", "function": {"name": "read_file", "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]);
    let body = json!({"model": "strict-16k", "messages": session(24), "tools": tools});
    let bearer = format!("Bearer {KEY}");
    let parent = format!("00-{TRACE}-{CLIENT_SPAN}-01");
    let answer = send(request(
        "POST",
        &format!("{}/v1/chat/completions", proxy.url()),
        &[
            ("content-type", "application/json"),
            ("authorization", &bearer),
            ("x-handoff-conversation-id", "phoenix"),
            ("traceparent", &parent),
        ],
        body.to_string(),
    ))
    .await;
    assert_eq!(answer.status, 200, "{}", answer.text());

    // Spans leave in batches: wait for the request span, the last to end.
    let mut spans = Vec::new();
    for _ in 0..60 {
        spans = phoenix.spans().await;
        if spans.iter().any(|s| s["parent_id"] == CLIENT_SPAN) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let of_trace: Vec<&Value> = spans
        .iter()
        .filter(|s| s["context"]["trace_id"] == TRACE)
        .collect();
    let request_span = of_trace
        .iter()
        .find(|s| s["parent_id"] == CLIENT_SPAN)
        .unwrap_or_else(|| panic!("no request span under the client's: {spans:#?}"));
    let request_id = request_span["context"]["span_id"].as_str().unwrap();
    assert_eq!(request_span["name"], "chat strict-16k");
    assert_eq!(attribute(request_span, "gen_ai.operation.name"), "chat");
    assert_eq!(attribute(request_span, "gen_ai.provider.name"), "openai");
    assert_eq!(
        attribute(request_span, "gen_ai.request.model"),
        "strict-16k"
    );
    assert!(
        attribute(request_span, "gen_ai.usage.input_tokens")
            .as_u64()
            .unwrap()
            > 0
    );
    assert!(attribute(request_span, "gen_ai.conversation.id")
        .as_str()
        .unwrap()
        .ends_with("phoenix"));
    assert_eq!(attribute(request_span, "handoff.decision.window"), 16384);
    assert!(
        attribute(request_span, "handoff.tokens_saved")
            .as_u64()
            .unwrap()
            > 0
    );

    let compaction = of_trace
        .iter()
        .find(|s| s["name"] == "handoff.compaction")
        .unwrap_or_else(|| panic!("no compaction span: {of_trace:#?}"));
    assert_eq!(compaction["parent_id"], request_id);
    let compaction_id = compaction["context"]["span_id"].as_str().unwrap();
    let summaries: Vec<&&Value> = of_trace
        .iter()
        .filter(|s| attribute(s, "handoff.summary_call") == true)
        .collect();
    assert!(!summaries.is_empty(), "{of_trace:#?}");
    for summary in &summaries {
        assert_eq!(summary["parent_id"], compaction_id);
        assert_eq!(attribute(summary, "gen_ai.operation.name"), "chat");
    }

    // The upstream's requests carry the trace, with handoff's spans as parents.
    let span_ids: Vec<&str> = of_trace
        .iter()
        .filter_map(|s| s["context"]["span_id"].as_str())
        .collect();
    for sent in mock.requests() {
        let traceparent = sent.headers["traceparent"].to_str().unwrap().to_owned();
        let parts: Vec<&str> = traceparent.split('-').collect();
        assert_eq!(parts[1], TRACE);
        assert!(
            span_ids.contains(&parts[2]),
            "{traceparent} names no span of handoff's"
        );
    }

    // Nothing of the key, nor (without the opt-in) of a message, in any span.
    let all = serde_json::to_string(&spans).unwrap();
    assert!(
        !all.contains(KEY) && !all.contains("phoenix-secret"),
        "a key reached Phoenix"
    );
    assert!(
        !all.contains("FACT-0") && !all.contains("line42"),
        "a message reached Phoenix"
    );
    drop(proxy);
}
