//! What the operator sees of a compaction, on the in-process harness: a manual
//! compaction through the admin API (with the upstream credential named for the
//! upstream, never the admin request's own), the audit's view, show, replay and verify
//! read as functions, the metrics; and a tool body too long for any view, shortened in
//! the view only, refused without `compaction.rescue`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::{json, Value};

use super::{agent_requests, strict, user};
use crate::testing::Harness;

/// The 4k model, summaries on the 16k one allowed 1 s each, compacting inline.
const CONFIG: &str = "[models.\"strict\"]\ncontext_window = 4096\n[models.\"strict-16k\"]\ncontext_window = 16384\n[compaction]\nsummary_model = \"strict-16k\"\nsummary_timeout = \"1s\"\nmax_wait = \"60s\"\n";

/// `audit view`, `show` and `replay` of conversation `id`, as the CLI prints them.
async fn view(proxy: &Harness, id: &str) -> Vec<Value> {
    let text = proxy
        .audit(id, |audit, id, tenant, out| {
            audit.view(id, Some(tenant), out)
        })
        .await;
    serde_json::from_str(&text).unwrap()
}

async fn show(proxy: &Harness, id: &str) -> String {
    proxy
        .audit(id, |audit, id, tenant, out| {
            audit.show(id, Some(tenant), out)
        })
        .await
}

async fn replay(proxy: &Harness, id: &str) -> Vec<Value> {
    let text = proxy
        .audit(id, |audit, id, tenant, out| {
            audit.replay(id, Some(tenant), None, None, out, &mut std::io::sink())
        })
        .await;
    serde_json::from_str(&text).unwrap()
}

/// `audit verify` finds no problem in conversation `id`.
async fn assert_verified(proxy: &Harness, id: &str) {
    let verified = proxy
        .audit(id, |audit, id, tenant, out| {
            audit.verify(Some(id), Some(tenant), out)
        })
        .await;
    assert!(!verified.contains("problem"), "{verified}");
}

#[tokio::test(start_paused = true)]
async fn manual_compaction_and_the_audit_views() {
    let (strict, mock) = strict(Duration::ZERO).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..3 {
        messages.push(user(n, 60));
        messages.push(json!({"role": "assistant", "content": format!("noted {n}")}));
    }
    messages.push(user(3, 60));
    assert_eq!(proxy.chat("manual", "strict", &messages).await.status, 200);
    assert!(
        proxy.records("manual").await.is_empty(),
        "small enough: no automatic compaction"
    );

    let headers = [
        ("authorization", "Bearer not-for-the-upstream"),
        ("x-handoff-upstream-authorization", "Bearer sk-x"),
    ];
    let got = proxy
        .post("/handoff/conversations/manual/compact", &headers, b"")
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

    let view = view(&proxy, "manual").await;
    assert_eq!(view[0]["role"], "system");
    assert_eq!(
        view[1]["role"], "user",
        "the continuation follows the pinned messages"
    );
    assert_eq!(view[2]["role"], "assistant");
    assert!(
        view[2]["content"].as_str().unwrap().contains("FACT-000"),
        "{view:?}"
    );
    let show = show(&proxy, "manual").await;
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
    assert_eq!(proxy.chat("manual", "strict", &messages).await.status, 200);
    let sent = agent_requests(&mock).pop().unwrap();
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

    let missing = proxy
        .post("/handoff/conversations/nope/compact", &[], b"")
        .await;
    assert_eq!(missing.status, 404);
}

#[tokio::test(start_paused = true)]
async fn rescue_shortens_an_over_long_tool_body_only_in_the_view() {
    let (strict, mock) = strict(Duration::ZERO).await;
    let body = format!("HEAD {} TAIL", "data ".repeat(6000));
    let messages = vec![
        json!({"role": "user", "content": "read the log"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": body}),
    ];
    let without = format!("{CONFIG}rescue = false\n");
    let strict_proxy = Harness::start(&mock.url(), &without).await;
    let refused = strict_proxy.chat("rescue", "strict", &messages).await;
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
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let got = proxy.chat("rescue", "strict", &messages).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let sent = agent_requests(&mock).pop().unwrap();
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
    let show = show(&proxy, "rescue").await;
    let note = show
        .lines()
        .find(|l| l.contains("RESCUED"))
        .unwrap_or_default();
    assert!(note.contains("#2 ") && note.contains("bytes"), "{show}");
    assert_verified(&proxy, "rescue").await;
    let replay = replay(&proxy, "rescue").await;
    assert_eq!(
        replay[2]["content"].as_str().unwrap(),
        body,
        "the original stays whole in the log"
    );
}
