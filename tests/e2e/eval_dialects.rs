//! `handoff eval` replays recorded conversations of every dialect: chat completions,
//! Anthropic Messages, Responses and Gemini, each parsed in its own wire format and calibrated
//! by its own usage.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use crate::support::client::{self, request};
use crate::support::Proxy;
use mock_upstream::scripted::{ScriptedCoder, Thinking};
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

/// A user turn of about 1,500 tokens stating fact `n`.
fn turn(n: usize) -> String {
    let words: Vec<String> = (0..700).map(|i| format!("w{i}")).collect();
    format!("FACT-{n:03} {}", words.join(" "))
}

/// Records a conversation of `turns` user turns in `dialect`, each request carrying the
/// whole history and the previous replies.
async fn record(proxy: &Proxy, dialect: &str, turns: usize) {
    let (path, list) = match dialect {
        "anthropic" => ("/v1/messages", "messages"),
        "responses" => ("/v1/responses", "input"),
        "gemini" => ("/v1beta/models/eval-model:generateContent", "contents"),
        _ => ("/v1/chat/completions", "messages"),
    };
    let mut history: Vec<Value> = Vec::new();
    for n in 0..turns {
        if dialect == "gemini" {
            history.push(json!({"role": "user", "parts": [{"text": turn(n)}]}));
            let body = json!({"contents": history, "systemInstruction": {"parts": [{"text": "You are terse."}]},
                "generationConfig": {"maxOutputTokens": 256}});
            let got = client::send(request(
                "POST",
                &format!("{}{path}", proxy.url()),
                &[
                    ("content-type", "application/json"),
                    ("x-goog-api-key", "eval-key"),
                    ("x-handoff-conversation-id", "eval-gemini"),
                ],
                body.to_string(),
            ))
            .await;
            assert_eq!(got.status, 200, "{dialect}: {}", got.text());
            history.push(got.json()["candidates"][0]["content"].clone());
            continue;
        }
        history.push(json!({"role": "user", "content": turn(n)}));
        let mut body = json!({"model": "eval-model", "max_tokens": 256, list: history});
        match dialect {
            "anthropic" => body["system"] = json!("You are terse."),
            "responses" => {
                // A tool, so the model answers with function_call items: not chat's shape.
                body["instructions"] = json!("You are terse.");
                body["tools"] = json!([{"type": "function", "name": "exec_command", "parameters": {"type": "object"}}]);
            }
            _ => {}
        }
        let got = client::send(request(
            "POST",
            &format!("{}{path}", proxy.url()),
            &[
                ("content-type", "application/json"),
                ("x-handoff-conversation-id", &format!("eval-{dialect}")),
            ],
            body.to_string(),
        ))
        .await;
        assert_eq!(got.status, 200, "{dialect}: {}", got.text());
        let reply = got.json();
        if dialect == "responses" {
            let call = reply["output"][0].clone();
            assert_eq!(call["type"], "function_call", "{reply}");
            let output = json!({"type": "function_call_output", "call_id": call["call_id"], "output": format!("ran: {n}")});
            history.extend([call, output]);
            continue;
        }
        let text = reply["choices"][0]["message"]["content"]
            .as_str()
            .or_else(|| reply["content"][0]["text"].as_str())
            .or_else(|| reply["output"][0]["content"][0]["text"].as_str())
            .unwrap()
            .to_owned();
        history.push(match dialect {
            "anthropic" => json!({"role": "assistant", "content": reply["content"]}),
            _ => json!({"role": "assistant", "content": text}),
        });
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_replays_a_data_dir_with_a_conversation_of_each_dialect() {
    let work = tempfile::tempdir().unwrap();
    let model = ScriptedCoder::new(1_000_000, 1000, work.path().to_owned(), Thinking::Some);
    let answer = Arc::clone(&model);
    let mock = MockUpstream::with(move |r| answer.answer(r)).await;
    let proxy = Proxy::start(&mock.url());
    for dialect in ["chat", "anthropic", "responses", "gemini"] {
        record(&proxy, dialect, 8).await;
    }
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(["eval", "--chain", "extract", "--window", "8192", "--json"])
        .args(["--probe", "FACT-[0-9]{3}"])
        .arg("--config")
        .arg(proxy.config_path())
        .current_dir(proxy.dir())
        .env_remove("HANDOFF_CONFIG")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_slice(&output.stdout).unwrap();
    let conversations = report["conversations"].as_array().unwrap();
    assert_eq!(conversations.len(), 4, "{report}");
    for conversation in conversations {
        assert_eq!(conversation["requests"], 8, "{conversation}");
        assert_eq!(
            conversation["errors"].as_array().map_or(0, Vec::len),
            0,
            "{conversation}"
        );
        let compactions = conversation["compactions"].as_array().unwrap();
        assert!(!compactions.is_empty(), "{conversation}");
        assert!(compactions.iter().all(|c| c["strategy"] == "extract"));
    }
    // The figures of BENCHMARKS.md's eval table.
    for c in conversations {
        let compactions = c["compactions"].as_array().unwrap();
        let before: u64 = compactions
            .iter()
            .map(|x| x["tokens_before"].as_u64().unwrap())
            .sum();
        let after: u64 = compactions
            .iter()
            .map(|x| x["tokens_after"].as_u64().unwrap())
            .sum();
        println!(
            "EVAL-ROW | {} | {} | {} | {before}→{after} | {} |",
            c["name"],
            c["requests"],
            compactions.len(),
            c["recall"]["share"]
        );
    }
}
