//! The audit shows the proxy's own numbers, where a process is needed: a manual
//! compaction's aim and the calibration across a restart, and a prepared compaction as
//! the browser draws it. The decisions, the timeline and `audit show` are tested
//! in-process (`src/testing/decisions.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use crate::support::client::{self, request};
use crate::support::scenario::{
    agent_requests, big_user, log_lines, of_kind, options, paced, post_chat, records,
};
use crate::support::{Proxy, ProxyOptions};
use mock_upstream::strict::Strict;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

const SUMMARY: &str =
    "[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = 0\n";

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "lookup",
        "description": "Looks a record up by its query and returns what the archive holds about it, with dates and owners.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look up"}}, "required": ["query"]}
    }}])
}

/// One request of the 16k model with `max_tokens` and tools, as the openai SDK sends it.
async fn send(proxy: &Proxy, id: &str, messages: &[Value], max_tokens: u64) -> client::Whole {
    post_chat(
        proxy,
        &[
            ("x-handoff-conversation-id", id),
            ("authorization", "Bearer sk-x"),
        ],
        &json!({"model": "strict-16k", "max_tokens": max_tokens, "tools": tools(), "messages": messages}),
    )
    .await
}

/// A user turn of about `tokens` tokens, then the agent's tool call, its result and
/// the answer: two requests.
async fn turn(proxy: &Proxy, id: &str, history: &mut Vec<Value>, user: Value, max_tokens: u64) {
    history.push(user);
    loop {
        let got = send(proxy, id, history, max_tokens).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let reply = got.json()["choices"][0]["message"].clone();
        let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
        history.push(reply);
        match call {
            Some(call) => {
                history.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}))
            }
            None => return,
        }
    }
}

fn timeline(proxy: &Proxy, id: &str) -> Value {
    let url = format!(
        "{}/handoff/conversations/{id}/timeline?limit=2000",
        proxy.url()
    );
    let rt = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| rt.block_on(client::send(request("GET", &url, &[], "")))).json()
}

/// Request events of a timeline.
fn requests_of(timeline: &Value) -> Vec<Value> {
    timeline["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "request")
        .cloned()
        .collect()
}

/// The item of the array `list` whose `key` is `value`.
fn item(list: &Value, key: &str, value: &str) -> Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|i| i[key] == value)
        .unwrap_or_else(|| panic!("no {key} {value} in {list}"))
        .clone()
}

/// True when `body` carries a message whose content is `handoff`'s.
fn carries(body: &Value, handoff: &Value) -> bool {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["content"] == handoff["content"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_compaction_aims_at_the_budget_the_client_left_and_a_restart_keeps_the_calibration(
) {
    // A model that counts 1.3 times what tiktoken does: calibration matters.
    let strict = Strict::scaled(16_384, 1.3);
    let answering = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| answering.answer(request)).await;
    let data = tempfile::tempdir().unwrap();
    let start = || {
        Proxy::start_with(
            &mock.url(),
            ProxyOptions {
                data_dir: Some(data.path().to_owned()),
                ..options(16_384, &format!("{SUMMARY}keep_recent = 0.45\n"))
            },
        )
    };
    let proxy = start();
    let mut history = vec![json!({"role": "system", "content": "be brief"})];
    // About 5,000 tokens by the provider's count: under the trigger of a client that
    // keeps 8,000 for its answer (0.9 × 8,384 = 7,545).
    for n in 0..6 {
        turn(&proxy, "manual", &mut history, big_user(n, 300), 8000).await;
    }
    assert!(records(&proxy, "manual").is_empty());
    drop(proxy);

    // Restarted, the first request is already counted as the provider counts.
    let proxy = start();
    turn(&proxy, "manual", &mut history, big_user(6, 300), 8000).await;
    let requests = requests_of(&timeline(&proxy, "manual"));
    let first_after = &requests[requests.len() - 2];
    let (estimate, local) = (
        first_after["estimated_tokens"].as_u64().unwrap(),
        first_after["local_tokens"].as_u64().unwrap(),
    );
    assert!(
        estimate as f64 > local as f64 * 1.2,
        "calibrated after a restart: {first_after}"
    );

    let compacted = client::send(request(
        "POST",
        &format!("{}/handoff/conversations/manual/compact", proxy.url()),
        &[("authorization", "Bearer sk-x")],
        "",
    ))
    .await;
    assert_eq!(compacted.status, 200, "{}", compacted.text());
    let answer = compacted.json();
    let budget = &answer["budget"];
    assert_eq!(budget["from"], "decision");
    assert_eq!(budget["reserved"], 8000);
    assert_eq!(budget["input_budget"], 16_384 - 8000);
    assert_eq!(budget["trigger"], 7545);
    assert!(budget["tools_tokens"].as_u64().unwrap() > 20);
    // Kept verbatim: a share of that budget. Of the default one (14,746 with a reserve
    // of 1,638), the share is more than the whole history: nothing to compact.
    let record = &answer["compaction"];
    assert!(
        record["source"]["end_exclusive"].as_u64().unwrap() >= 4,
        "{record}"
    );
    // The next request is sent with it, under the client's trigger.
    history.push(big_user(7, 100));
    let got = send(&proxy, "manual", &history, 8000).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let last = requests_of(&timeline(&proxy, "manual")).pop().unwrap();
    assert_eq!(last["compaction"], record["id"]);
    assert!(last["provider_tokens"].as_u64().unwrap() < 7545, "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prepared_compaction_is_drawn_waiting_from_its_commit_to_its_adoption() {
    let mock = paced(
        &Strict::new(8192),
        Duration::from_millis(400),
        Duration::from_millis(1000),
    )
    .await;
    let extra = "[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = 0.6\n";
    let proxy = Proxy::start_with(&mock.url(), options(8192, extra));
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..9 {
        crate::support::scenario::agent_turn(&proxy, "prepared", &mut messages, big_user(n, 450))
            .await;
    }
    let records = records(&proxy, "prepared");
    let prepared = records
        .iter()
        .find(|r| r["reason"] == "prepared")
        .expect("a prepared record");
    let id = prepared["id"].as_str().unwrap();

    // From the log itself: the requests before its boundary, and the one that adopted it.
    let lines = log_lines(&proxy, "prepared");
    let boundary = lines
        .iter()
        .position(|l| l["kind"] == "compact_boundary" && l["compact_id"] == id)
        .unwrap();
    let waiting_from = of_kind(&lines[..boundary], "request").len() + 1;
    let adopt = lines
        .iter()
        .position(|l| l["kind"] == "adopt" && l["compact_id"] == id)
        .expect("adopted");
    let adopted_at = of_kind(&lines[..adopt], "request").len();
    assert!(
        adopted_at > waiting_from,
        "requests went out while it waited: {waiting_from} → {adopted_at}"
    );
    // The provider got the handoff from that request on, not before.
    let sent = agent_requests(&mock);
    assert!(carries(&sent[adopted_at - 1].json(), &prepared["handoff"]));
    assert!(!carries(&sent[adopted_at - 2].json(), &prepared["handoff"]));

    let timeline = timeline(&proxy, "prepared");
    let span = item(&timeline["prepared"], "id", id);
    assert_eq!(span["waiting_from"], waiting_from, "{span}");
    assert_eq!(span["adopted_at"], adopted_at, "{span}");

    // And the browser draws it so.
    let shots = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let seen = crate::support::scenario::run_client(
        &proxy,
        "ui_chart.py",
        &["prepared", shots.to_str().unwrap()],
    )
    .await;
    let band = item(&seen["prepared"], "id", id);
    assert_eq!(band["waiting_from"], waiting_from.to_string());
    assert_eq!(band["adopted_at"], adopted_at.to_string());
    // Being written from the request that started it to its commit: a band of its own
    // when a request went out meanwhile.
    let started_from = span["started_from"].as_u64().unwrap();
    assert!(
        started_from >= 1 && started_from <= waiting_from as u64,
        "{span}"
    );
    if started_from < waiting_from as u64 {
        let writing = item(&seen["preparing"], "id", id);
        assert_eq!(writing["started_from"], started_from.to_string(), "{seen}");
    }
    assert!(
        seen["adopted"].as_array().unwrap().contains(&json!(id)),
        "{seen}"
    );
    let marker = item(&seen["markers"], "compaction", id);
    assert_eq!(marker["request"], adopted_at.to_string(), "{seen}");
    // A dot per request, each at the trigger the proxy logged for it.
    let requests = requests_of(&timeline);
    let dots = seen["points"].as_array().unwrap();
    assert_eq!(dots.len(), requests.len());
    for (dot, event) in dots.iter().zip(&requests) {
        assert_eq!(dot["trigger"], event["trigger"].to_string());
        assert_eq!(dot["estimate"], event["estimated_tokens"].to_string());
        assert_eq!(dot["estimated"], "false");
        if event["estimated_tokens"].as_u64() > event["trigger"].as_u64() {
            assert_ne!(dot["over"], "", "{dot}");
        }
    }
    let reported = seen["provider"].as_array().unwrap();
    assert_eq!(reported.len(), requests.len());
    for (square, event) in reported.iter().zip(&requests) {
        assert_eq!(
            square.as_str().unwrap(),
            event["provider_tokens"].to_string()
        );
    }
}
