//! Anthropic's Messages API end to end: the official `anthropic` SDK through the real
//! binary, against a strict Messages provider that refuses what the real API refuses,
//! across restarts. Overflow recovery, the error shape and routing by dialect are
//! in-process, in `src/testing/anthropic.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::support::client::{self, request};
use crate::support::scenario::{self, estimate_model, records, serve_strict};
use crate::support::{canonical, Proxy, ProxyOptions};
use mock_upstream::anthropic::StrictAnthropic;
use mock_upstream::{MockUpstream, Recorded};
use serde_json::{json, Value};

const WINDOW: u64 = 8000;
const ID: &str = "claude-agent";

async fn strict_anthropic(window: u64) -> (Arc<StrictAnthropic>, MockUpstream) {
    let strict = StrictAnthropic::new(window);
    let mock = serve_strict(&strict, StrictAnthropic::answer).await;
    (strict, mock)
}

fn options(data: &std::path::Path, window: u64) -> ProxyOptions {
    estimate_model(data, "claude-mock", window)
}

fn is_summary(request: &Recorded) -> bool {
    mock_upstream::strict::is_summary(&request.json())
}

fn agent_requests(mock: &MockUpstream) -> Vec<Recorded> {
    mock.requests()
        .into_iter()
        .filter(|r| r.target.starts_with("/v1/messages") && !is_summary(r))
        .collect()
}

/// Refusals that are not about the window: a structural error reached the provider.
fn structural_refusals(strict: &StrictAnthropic) -> Vec<String> {
    strict
        .refused
        .lock()
        .unwrap()
        .iter()
        .filter(|r| !r.contains("prompt is too long") && !r.contains("exceed context limit"))
        .cloned()
        .collect()
}

async fn run_agent(proxy: &Proxy, state: &std::path::Path, first: u32, last: u32) -> Value {
    scenario::run_agent(proxy, "anthropic_agent.py", state, first, last).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_agent_compacts_with_summarize_then_extract_across_a_restart() {
    let (strict, mock) = strict_anthropic(WINDOW).await;
    let data = tempfile::tempdir().unwrap();
    let state = data.path().join("client-state.json");
    let mut proxy = Proxy::start_with(&mock.url(), options(data.path(), WINDOW));

    // Phase 1: long enough to compact at least once, with summaries.
    run_agent(&proxy, &state, 1, 16).await;
    let first = records(&proxy, ID);
    assert!(!first.is_empty(), "no compaction in 16 turns");
    assert!(
        first.iter().all(|r| r["strategy"] == "summarize"),
        "{first:?}"
    );
    assert!(
        first[0]["handoff"]["content"][0]["type"] == "text",
        "the handoff is an Anthropic message: {}",
        first[0]["handoff"]
    );

    // Restart: the same request gets the same view, rebuilt from disk.
    let before = agent_requests(&mock).pop().unwrap();
    let sent = before.json().to_string();
    assert!(
        sent.contains("FACT-001"),
        "FACT-001 was lost in the summary"
    );
    // The first turn is compacted away: only the handoff's ledger quotes it.
    scenario::assert_only_the_ledger_quotes(&before.json()["messages"], "Step 1. Remember");
    proxy.kill9();
    let proxy = Proxy::start_with(&mock.url(), options(data.path(), WINDOW));
    // The client's own last request: its messages without the answer it got.
    let mut history: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    history.pop();
    let mut again = before.json();
    again["messages"] = Value::Array(history);
    let resent = client::send(request(
        "POST",
        &format!("{}/v1/messages", proxy.url()),
        &[
            ("x-api-key", "sk-ant-agent-test"),
            ("anthropic-version", "2023-06-01"),
            ("x-handoff-conversation-id", ID),
        ],
        again.to_string(),
    ))
    .await;
    assert_eq!(resent.status, 200, "{}", resent.text());
    let after = agent_requests(&mock).pop().unwrap();
    assert_eq!(
        after.json()["messages"],
        before.json()["messages"],
        "the view after a restart differs"
    );

    // Phase 2: summaries fail, so the chain falls back to extract.
    strict.fail_summaries.store(true, Ordering::SeqCst);
    let done = run_agent(&proxy, &state, 17, 34).await;
    let all = records(&proxy, ID);
    let extracted: Vec<&Value> = all.iter().filter(|r| r["strategy"] == "extract").collect();
    assert!(!extracted.is_empty(), "no extract compaction: {all:?}");
    assert_eq!(extracted[0]["attempts"][0]["strategy"], "summarize");
    assert_eq!(extracted[0]["attempts"][0]["outcome"], "failed");

    assert!(
        structural_refusals(&strict).is_empty(),
        "invalid Messages requests reached the provider: {:?}",
        structural_refusals(&strict)
    );
    // Every view: system unchanged at the top level, roles alternating, never ending
    // with an assistant turn (the strict provider checks all of that per request).
    for sent in agent_requests(&mock) {
        let body = sent.json();
        assert_eq!(body["system"][0]["text"], "You are a meticulous agent.");
        assert!(body["messages"][0]["role"] == "user");
    }

    // The log holds every original, exactly as the client sent it.
    let replay = proxy.replay(ID, None);
    let expected = done["replay"].as_array().unwrap();
    // The client's list ends with the final answer, which the log has as the reply.
    assert_eq!(replay.len(), expected.len(), "replay length");
    for (got, want) in replay.iter().zip(expected) {
        assert_eq!(canonical(got), canonical(want));
    }
    let show = String::from_utf8(proxy.audit(&["show", ID]).stdout).unwrap();
    // SDK echoes of streamed and non-streamed replies join the chain: the only branch
    // is the regenerated answer of the request resent after the restart.
    assert!(show.contains("dialect anthropic"), "{show}");
    let head = show.lines().next().unwrap();
    assert!(head.contains(" 2 branches"), "{head}");
    assert!(head.contains(&format!("{} messages", 34 * 4 + 1)), "{head}");
    proxy.assert_verified(&[]);

    // The key (sent as Authorization by the SDK, as x-api-key by the resend) is never
    // written, in the log of originals or in the proxy's own logs.
    for (path, bytes) in crate::support::read_tree(&proxy.data_dir()) {
        let text = String::from_utf8_lossy(&bytes);
        assert!(
            !text.contains("sk-ant-agent-test"),
            "key in {}",
            path.display()
        );
    }
    assert!(
        !proxy.logs().contains("sk-ant-agent-test"),
        "key in the logs"
    );
}

/// LangGraph's `ChatAnthropic` echoes a text reply as a plain string and a tool turn as
/// its blocks: one message each way, so a linear thread is one branch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_replies_echoed_as_strings_keep_one_branch() {
    let (_strict, mock) = strict_anthropic(100_000).await;
    let data = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(&mock.url(), options(data.path(), 100_000));
    let mut messages: Vec<Value> = Vec::new();
    for turn in 0..15 {
        messages.push(json!({"role": "user", "content": format!("look up item {turn}")}));
        loop {
            let body = json!({"model": "claude-mock", "max_tokens": 256, "messages": messages});
            let got = client::send(request(
                "POST",
                &format!("{}/v1/messages", proxy.url()),
                &[
                    ("content-type", "application/json"),
                    ("x-api-key", "sk-ant-echo"),
                ],
                body.to_string(),
            ))
            .await;
            assert_eq!(got.status, 200, "{}", got.text());
            let reply = got.json();
            let blocks = reply["content"].as_array().unwrap().clone();
            let calls: Vec<&Value> = blocks.iter().filter(|b| b["type"] == "tool_use").collect();
            if calls.is_empty() {
                // A text answer comes back as a string.
                let text: String = blocks.iter().filter_map(|b| b["text"].as_str()).collect();
                messages.push(json!({"role": "assistant", "content": text}));
                break;
            }
            let results: Vec<Value> = calls
                .iter()
                .map(|c| json!({"type": "tool_result", "tool_use_id": c["id"], "content": "found"}))
                .collect();
            messages.push(json!({"role": "assistant", "content": blocks}));
            messages.push(json!({"role": "user", "content": results}));
        }
    }
    let conversations = proxy.conversations();
    assert_eq!(conversations.len(), 1, "{conversations:?}");
    assert_eq!(conversations[0]["branches"], 1, "{conversations:?}");
}
