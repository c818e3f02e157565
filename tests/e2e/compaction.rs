//! Compaction end to end on the real binary, against a strict provider that enforces
//! its window and rejects broken tool pairs the way OpenAI does: what needs a process
//! (the SDK agent, restarts, a crash, the audit CLI, the metrics endpoint). The rest is
//! in-process, in `src/testing/compaction/`.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manual_compaction_and_the_audit_views() {
    let (strict, mock) = strict_mock(4096).await;
    let proxy = Proxy::start_with(&mock.url(), options(4096, SUMMARY_16K_1S));
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..3 {
        messages.push(big_user(n, 60));
        messages.push(json!({"role": "assistant", "content": format!("noted {n}")}));
    }
    messages.push(big_user(3, 60));
    assert_eq!(chat(&proxy, "manual", &messages).await.status, 200);
    assert!(
        records(&proxy, "manual").is_empty(),
        "small enough: no automatic compaction"
    );

    let got = client::send(request(
        "POST",
        &format!("{}/handoff/conversations/manual/compact", proxy.url()),
        &[
            ("authorization", "Bearer not-for-the-upstream"),
            ("x-handoff-upstream-authorization", "Bearer sk-x"),
        ],
        "",
    ))
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(got.json()["compaction"]["reason"], "manual");
    assert_eq!(got.json()["compaction"]["strategy"], "summarize");
    assert_eq!(strict.summaries.load(Ordering::SeqCst), 1);
    let summary_request = mock.requests().pop().unwrap();
    assert_eq!(
        summary_request.headers["authorization"], "Bearer sk-x",
        "the upstream credential named for the upstream is used, never the admin request's own"
    );

    let view = proxy.audit(&["view", "manual"]);
    assert!(
        view.status.success(),
        "{}",
        String::from_utf8_lossy(&view.stderr)
    );
    let view: Vec<Value> = serde_json::from_slice(&view.stdout).unwrap();
    assert_eq!(view[0]["role"], "system");
    assert_eq!(
        view[1]["role"], "user",
        "the continuation follows the pinned messages"
    );
    assert_eq!(view[2]["role"], "assistant");
    assert!(
        view[2]["content"].as_str().unwrap().contains("FACT-000"),
        "{view:?} {:?}",
        records(&proxy, "manual")
    );

    let show = String::from_utf8_lossy(&proxy.audit(&["show", "manual"]).stdout).into_owned();
    assert!(
        show.contains("compaction cmp-")
            && show.contains("adopted")
            && show.contains("summarize ok"),
        "{show}"
    );
    assert!(show.contains("boundary cmp-"), "{show}");

    // The next request is sent on the compacted view.
    messages.push(json!({"role": "assistant", "content": "noted 3"}));
    messages.push(json!({"role": "user", "content": "and now?"}));
    assert_eq!(chat(&proxy, "manual", &messages).await.status, 200);
    let sent = agent_requests(&mock).pop().unwrap().json();
    assert_eq!(sent["messages"][2]["content"], view[2]["content"]);

    let metrics = proxy.metrics().await;
    assert!(
        metrics
            .contains("handoff_compactions_total{strategy=\"summarize\",outcome=\"committed\"} 1"),
        "{metrics}"
    );
    // Every proxied request lands in the overhead histogram.
    let count: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("handoff_overhead_seconds_count "))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or(0);
    assert!(count >= 2, "{metrics}");

    let missing = client::send(request(
        "POST",
        &format!("{}/handoff/conversations/nope/compact", proxy.url()),
        &[],
        "",
    ))
    .await;
    assert_eq!(missing.status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rescue_shortens_an_over_long_tool_body_only_in_the_view() {
    let (strict, mock) = strict_mock(4096).await;
    let body = format!("HEAD {} TAIL", "data ".repeat(6000));
    let messages = vec![
        json!({"role": "user", "content": "read the log"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": body}),
    ];
    let strict_proxy =
        Proxy::start_with(&mock.url(), options(4096, "[compaction]\nrescue = false\n"));
    let refused = chat(&strict_proxy, "rescue", &messages).await;
    // Without rescue the newest unit cannot fit. The first request's count is a guess
    // (no calibration yet): it is sent, and the model's own refusal comes back.
    assert_eq!(
        refused.status, 400,
        "without rescue the newest unit cannot fit"
    );
    assert!(
        refused.text().contains("maximum context length is 4096"),
        "{}",
        refused.text()
    );
    assert_eq!(refused.json()["error"]["code"], "context_length_exceeded");

    // Rescue is on by default.
    let refusals = strict.over_window.lock().unwrap().len();
    let proxy = Proxy::start_with(&mock.url(), options(4096, ""));
    let got = chat(&proxy, "rescue", &messages).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let sent = agent_requests(&mock).pop().unwrap().json();
    let tool = sent["messages"][2]["content"].as_str().unwrap();
    assert!(
        tool.starts_with("HEAD")
            && tool.ends_with("TAIL")
            && tool.contains("characters omitted by handoff")
    );
    assert_eq!(
        strict.over_window.lock().unwrap().len(),
        refusals,
        "the rescued view fits"
    );
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("handoff_views_rescued_total 1"),
        "{metrics}"
    );
    // The audit says which tool result was shortened, and by how much.
    let show = String::from_utf8_lossy(&proxy.audit(&["show", "rescue"]).stdout).into_owned();
    let note = show
        .lines()
        .find(|l| l.contains("RESCUED"))
        .unwrap_or_default();
    assert!(note.contains("#2 ") && note.contains("bytes"), "{show}");
    proxy.assert_verified(&["rescue"]);
    let replay = proxy.replay("rescue", None);
    assert_eq!(
        replay[2]["content"].as_str().unwrap(),
        body,
        "the original stays whole on disk"
    );
}
