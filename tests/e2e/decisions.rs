//! The audit shows the proxy's own numbers. Each request's decision (the budget and
//! trigger it was measured against, the calibrated estimate of the view sent, the
//! compaction that view used, why it was over the trigger, a refusal) is logged, and
//! the timeline, `audit show` and a manual compaction read it, next to the provider's
//! own count of the input.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::time::Duration;

use crate::support::client::{self, request};
use crate::support::scenario::{
    agent_requests, big_user, log_lines, of_kind, options, paced, post_chat, records, strict_mock,
};
use crate::support::{Proxy, ProxyOptions};
use mock_upstream::strict::Strict;
use mock_upstream::{MockUpstream, Recorded, Reply};
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

/// A user message of about `tokens` tokens, one a word.
fn sized_user(n: usize, tokens: usize) -> Value {
    json!({"role": "user", "content": format!("BIG-{n}{}", " hello".repeat(tokens))})
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
async fn the_timeline_draws_the_trigger_and_count_each_request_was_decided_with() {
    let (_strict, mock) = strict_mock(16_384).await;
    let proxy = Proxy::start_with(&mock.url(), options(16_384, SUMMARY));
    let mut history = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..13 {
        turn(&proxy, "decided", &mut history, big_user(n, 700), 1024).await;
    }
    let records = records(&proxy, "decided");
    assert!(!records.is_empty(), "the session compacted");

    // 0.9 × (16,384 − 1,024): the client's max_tokens is the reserve, not the default.
    let timeline = timeline(&proxy, "decided");
    let requests = requests_of(&timeline);
    let lines = log_lines(&proxy, "decided");
    let decisions = of_kind(&lines, "decision");
    assert_eq!(decisions.len(), requests.len(), "one decision per request");
    assert_eq!(timeline["trigger_tokens"], 13_824);
    for (event, decision) in requests.iter().zip(&decisions) {
        assert_eq!(event["trigger"], 13_824, "{event}");
        assert_eq!(event["trigger"], decision["trigger"]);
        assert_eq!(event["input_budget"], 15_360);
        assert_eq!(event["reserved"], 1024);
        assert_eq!(event["estimated"], false);
        assert!(
            event["tools_tokens"].as_u64().unwrap() > 20,
            "tools are counted: {event}"
        );
        assert_eq!(event["estimated_tokens"], decision["estimate"]);
        // Over the drawn trigger only when the proxy says why.
        if event["estimated_tokens"].as_u64().unwrap() > 13_824 {
            assert!(
                !event["over"].is_null(),
                "over the trigger without a why: {event}"
            );
        }
    }

    // The provider's series is the scripted model's own count of each view it got.
    let sent = agent_requests(&mock);
    assert_eq!(sent.len(), requests.len());
    for (event, body) in requests.iter().zip(&sent) {
        assert_eq!(
            event["provider_tokens"],
            Strict::count(&body.json()),
            "{event}"
        );
    }
    // Calibrated, handoff's estimate of what it sent stays close to the provider's.
    for event in &requests[2..] {
        let (ours, theirs) = (
            event["estimated_tokens"].as_f64().unwrap(),
            event["provider_tokens"].as_f64().unwrap(),
        );
        assert!((ours - theirs).abs() / theirs < 0.1, "{ours} vs {theirs}");
    }

    // "Compacted here" is on the request whose view first carried each handoff.
    let marked: Vec<usize> = requests
        .iter()
        .filter(|e| e["compacted_here"] == true)
        .map(|e| e["number"].as_u64().unwrap() as usize)
        .collect();
    assert_eq!(marked.len(), records.len(), "{marked:?}");
    for (number, record) in marked.iter().zip(&records) {
        assert_eq!(requests[number - 1]["compaction"], record["id"]);
        assert!(carries(&sent[number - 1].json(), &record["handoff"]));
        assert!(!carries(&sent[number - 2].json(), &record["handoff"]));
    }

    // `audit show` prints the same figures.
    let show = String::from_utf8(proxy.audit(&["show", "decided"]).stdout).unwrap();
    assert_eq!(
        show.matches("trigger=13824").count(),
        requests.len(),
        "{show}"
    );
    assert_eq!(show.matches("COMPACTED HERE").count(), records.len());
    let last = requests.last().unwrap();
    assert!(
        show.contains(&format!(
            "sent~{} ",
            last["estimated_tokens"].as_u64().unwrap()
        )) && show.contains(&format!("provider={}", last["provider_tokens"])),
        "{show}"
    );
    proxy.assert_verified(&["decided"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_sent_over_the_trigger_says_why_and_a_refusal_or_an_upstream_error_is_marked() {
    let (strict, inner) = strict_mock(16_384).await;
    drop(inner);
    // The scripted model, but a 503 for a question that asks for one.
    let mock = MockUpstream::with(move |request: &Recorded| {
        if request.json().to_string().contains("PLEASE-FAIL") {
            return Reply::error(503, "overloaded", "try later");
        }
        strict.answer(request)
    })
    .await;
    let proxy = Proxy::start_with(&mock.url(), options(16_384, SUMMARY));
    let mut history = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..3 {
        turn(&proxy, "odd", &mut history, big_user(n, 200), 1024).await;
    }
    // The newest message alone is over the trigger (13,824) and under the budget
    // (15,360) with a handoff of the rest: everything before it is compacted, and the
    // view is sent.
    history.push(sized_user(90, 14_100));
    let got = send(&proxy, "odd", &history, 1024).await;
    assert_eq!(got.status, 200, "{}", got.text());
    history.push(got.json()["choices"][0]["message"].clone());
    history.pop();
    history.pop();
    // Alone over the budget, with calibrated counts: refused, and logged as refused.
    history.push(sized_user(91, 17_000));
    let refused = send(&proxy, "odd", &history, 1024).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    history.pop();
    history.push(json!({"role": "user", "content": "PLEASE-FAIL now"}));
    let failed = send(&proxy, "odd", &history, 1024).await;
    assert_eq!(failed.status, 503);

    let requests = requests_of(&timeline(&proxy, "odd"));
    let over: Vec<&Value> = requests.iter().filter(|e| !e["over"].is_null()).collect();
    assert_eq!(over.len(), 1, "{requests:#?}");
    assert_eq!(over[0]["over"], "newest_unit");
    assert!(over[0]["estimated_tokens"].as_u64().unwrap() > 13_824);
    assert!(over[0]["estimated_tokens"].as_u64().unwrap() <= 15_360);
    assert_eq!(over[0]["compacted_here"], true, "{}", over[0]);
    let refusal = &requests[requests.len() - 2];
    assert_eq!(refusal["refused"], "context_length_exceeded", "{refusal}");
    assert!(refusal["estimated_tokens"].as_u64().unwrap() > 15_360);
    assert!(
        refusal["provider_tokens"].is_null(),
        "never sent: {refusal}"
    );
    let error = requests.last().unwrap();
    assert_eq!(error["upstream_status"], 503, "{error}");
    for event in &requests {
        if event["estimated_tokens"].as_u64().unwrap_or(0) > 13_824 {
            assert!(
                !event["over"].is_null() || !event["refused"].is_null(),
                "a request drawn over the trigger without a why: {event}"
            );
        }
    }
    // Uncalibrated, a first request over the budget by less than a factor of two is
    // sent on that guess; the provider refuses it, and nothing can be cut.
    let guessed = send(
        &proxy,
        "guess",
        &[
            json!({"role": "system", "content": "be brief"}),
            sized_user(1, 15_800),
        ],
        1024,
    )
    .await;
    assert_eq!(guessed.status, 400, "{}", guessed.text());
    let guess = requests_of(&timeline(&proxy, "guess")).pop().unwrap();
    assert_eq!(guess["over"], "guess", "{guess}");
    assert_eq!(guess["upstream_status"], 400);
    assert_eq!(
        guess["retries"], 1,
        "the provider refused it once for its size"
    );
    // A tool result too long for any view is shortened in the view only.
    let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "lookup", "arguments": "{\"query\":\"the log\"}"}}]});
    let body = format!("START{}END", " hello".repeat(17_000));
    let rescued = send(
        &proxy,
        "rescue",
        &[
            json!({"role": "system", "content": "be brief"}),
            json!({"role": "user", "content": "read the log"}),
            call,
            json!({"role": "tool", "tool_call_id": "c1", "content": body}),
        ],
        1024,
    )
    .await;
    assert_eq!(rescued.status, 200, "{}", rescued.text());
    let rescue = requests_of(&timeline(&proxy, "rescue")).pop().unwrap();
    assert_eq!(rescue["rescued"], true, "{rescue}");
    assert!(
        rescue["over"].is_null() || rescue["over"] == "rescued",
        "{rescue}"
    );
    assert!(
        rescue["estimated_tokens"].as_u64().unwrap() <= 15_360,
        "{rescue}"
    );

    let show = String::from_utf8(proxy.audit(&["show", "odd"]).stdout).unwrap();
    assert!(show.contains("OVER THE TRIGGER (newest_unit)"), "{show}");
    assert!(show.contains("REFUSED context_length_exceeded"), "{show}");
    assert!(show.contains("UPSTREAM ANSWERED 503"), "{show}");
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
