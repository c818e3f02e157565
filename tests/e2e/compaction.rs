//! Compaction end to end on the real binary, against a strict provider that enforces
//! its window and rejects broken tool pairs the way OpenAI does: what needs a process
//! (the SDK agent, restarts, a crash, and the audit CLI over what they left). The rest
//! is in-process, in `src/testing/compaction/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use mock_upstream::strict::SummaryMode;

use crate::support::client::{self, request};
use crate::support::scenario::*;
use crate::support::{Proxy, ProxyOptions};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_40_turn_sdk_agent_in_16k_never_sees_an_error() {
    let (strict, mock) = strict_mock(16_384).await;
    let proxy = Proxy::start_with(&mock.url(), options(16_384, ""));
    // run_client fails the test if the agent saw any error.
    run_client(&proxy, "openai_compacting_agent.py", &["40"]).await;

    assert!(
        strict.over_window.lock().unwrap().is_empty(),
        "over-window requests reached the upstream"
    );
    assert!(
        strict.broken_pairs.lock().unwrap().is_empty(),
        "{:?}",
        strict.broken_pairs.lock().unwrap()
    );
    let records = records(&proxy, "agent40");
    assert!(
        records.len() >= 3,
        "expected several compactions, got {}",
        records.len()
    );
    for record in &records {
        assert_eq!(record["strategy"], "summarize", "{record}");
        assert_eq!(record["attempts"][0]["outcome"], "ok");
        assert!(record["tokens_after"].as_u64() < record["tokens_before"].as_u64());
    }
    // Facts from the first turns still reach the model, through the chain of handoffs.
    let last = agent_requests(&mock).pop().unwrap().json().to_string();
    for early in ["FACT-001", "FACT-002", "FACT-003"] {
        assert!(last.contains(early), "{early} was lost");
    }
    let replay = proxy.replay("agent40", None);
    assert_eq!(
        replay.iter().filter(|m| m["role"] == "user").count(),
        40,
        "every original is kept"
    );
    proxy.assert_verified(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_view_is_stable_between_compactions_and_after_a_restart() {
    let (strict, mock) = strict_mock(4096).await;
    let data = tempfile::tempdir().unwrap();
    // Compacted inline (nothing prepared in the background): the views between
    // compactions, and the summary calls, are this test's to count.
    let config = format!("{SUMMARY_16K_1S}prepare_at = 0\n");
    let start = || ProxyOptions {
        data_dir: Some(data.path().to_owned()),
        ..options(4096, &config)
    };
    let proxy = Proxy::start_with(&mock.url(), start());
    let mut messages = drive_until_compaction(&proxy, "stable", 500, 20).await;
    let summaries = strict.summaries.load(Ordering::SeqCst);

    // Two more small turns: each upstream request extends the previous one byte for byte.
    let mut bodies = Vec::new();
    for n in 0..2 {
        messages.push(json!({"role": "user", "content": format!("small {n}")}));
        let got = chat(&proxy, "stable", &messages).await;
        messages.push(got.json()["choices"][0]["message"].clone());
        if let Some(call) = messages.last().unwrap()["tool_calls"][0]["id"]
            .as_str()
            .map(str::to_owned)
        {
            messages.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}));
            let got = chat(&proxy, "stable", &messages).await;
            messages.push(got.json()["choices"][0]["message"].clone());
        }
        bodies.push(agent_requests(&mock).pop().unwrap().json());
    }
    let first: Vec<String> = bodies[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(Value::to_string)
        .collect();
    let second: Vec<String> = bodies[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(Value::to_string)
        .collect();
    assert_eq!(
        first[..],
        second[..first.len()],
        "the view must only grow between compactions"
    );
    assert_eq!(strict.summaries.load(Ordering::SeqCst), summaries);

    // A restart rebuilds the same view from disk, with no new summary call.
    let before = agent_requests(&mock).pop().unwrap().body;
    drop(proxy);
    let proxy = Proxy::start_with(&mock.url(), start());
    messages.pop();
    let got = chat(&proxy, "stable", &messages).await;
    assert_eq!(got.status, 200);
    let after = agent_requests(&mock).pop().unwrap().body;
    assert_eq!(before, after, "the view after a restart must be identical");
    assert_eq!(strict.summaries.load(Ordering::SeqCst), summaries);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_during_the_summary_call_leaves_a_consistent_state() {
    let (strict, mock) = strict_mock(4096).await;
    strict.set_summary_mode(SummaryMode::Slow);
    let data = tempfile::tempdir().unwrap();
    let start = || ProxyOptions {
        data_dir: Some(data.path().to_owned()),
        ..options(
            4096,
            "[compaction]\nsummary_model = \"strict-16k\"\nsummary_timeout = \"60s\"\n",
        )
    };
    let mut proxy = Proxy::start_with(&mock.url(), start());
    let mut messages = vec![];
    for n in 0..8 {
        messages.push(big_user(n, 500));
        messages.push(json!({"role": "assistant", "content": "noted"}));
    }
    messages.push(big_user(8, 500));
    let url = format!("{}{CHAT}", proxy.url());
    let body = json!({"model": "strict", "messages": messages}).to_string();
    let pending = tokio::spawn(async move {
        client::send(request(
            "POST",
            &url,
            // The same credential as the turns that follow: the same tenant.
            &[
                ("x-handoff-conversation-id", "crash"),
                ("authorization", "Bearer sk-x"),
            ],
            body,
        ))
        .await
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while strict.summaries.load(Ordering::SeqCst) == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no summary call was made"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    proxy.kill9();
    pending.abort();

    strict.set_summary_mode(SummaryMode::Good);
    let proxy = Proxy::start_with(&mock.url(), start());
    assert!(
        proxy.audit(&["verify", "crash"]).status.success(),
        "nothing half-committed"
    );
    let got = chat(&proxy, "crash", &messages).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(records(&proxy, "crash").len(), 1);
    assert!(proxy.audit(&["verify", "crash"]).status.success());
}
