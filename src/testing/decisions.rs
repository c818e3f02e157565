//! The audit shows the proxy's own numbers, on the in-process harness: each request's
//! decision (the budget and trigger it was measured against, the calibrated estimate
//! of the view sent, the compaction that view used, why it was over the trigger, a
//! refusal) is logged, and the timeline and `audit show` read it, next to the
//! provider's own count of the input.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use mock_upstream::strict::Strict;
use mock_upstream::{MockUpstream, Recorded, Reply};
use serde_json::{json, Value};

use super::compaction::{agent_requests, user};
use super::{Answer, Harness};

/// The 16k model, summaries on it too, compacting inline.
const CONFIG: &str = "[models.\"strict\"]\ncontext_window = 16384\n[models.\"strict-16k\"]\ncontext_window = 16384\n[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = 0\n";

/// The trigger and the input budget of the 16k model when the client reserves 1,024
/// tokens: 0.9 × (16,384 − 1,024), and 16,384 − 1,024.
const TRIGGER: u64 = 13_824;
const BUDGET: u64 = 15_360;

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "lookup",
        "description": "Looks a record up by its query and returns what the archive holds about it, with dates and owners.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "what to look up"}}, "required": ["query"]}
    }}])
}

/// One request of the 16k model with `max_tokens` 1,024 and tools, as the openai SDK
/// sends it.
async fn send(proxy: &Harness, id: &str, messages: &[Value]) -> Answer {
    let body =
        json!({"model": "strict-16k", "max_tokens": 1024, "tools": tools(), "messages": messages});
    let headers = [
        ("x-handoff-conversation-id", id),
        ("authorization", "Bearer sk-x"),
    ];
    proxy
        .post(
            "/v1/chat/completions",
            &headers,
            body.to_string().as_bytes(),
        )
        .await
}

/// A user turn, then the agent's tool calls, each answered `ok`, until it answers.
async fn turn(proxy: &Harness, id: &str, history: &mut Vec<Value>, user: Value) {
    history.push(user);
    loop {
        let got = send(proxy, id, history).await;
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

/// The request events of conversation `id`'s timeline.
async fn requests_of(proxy: &Harness, id: &str) -> Vec<Value> {
    let path = format!("/handoff/conversations/{id}/timeline?limit=2000");
    let timeline = proxy.get(&path).await.json();
    let events = timeline["events"].as_array().unwrap();
    assert_eq!(timeline["trigger_tokens"], TRIGGER, "{timeline}");
    events
        .iter()
        .filter(|e| e["type"] == "request")
        .cloned()
        .collect()
}

/// Conversation `id`'s log lines of `kind`, as written.
async fn lines_of(proxy: &Harness, id: &str, kind: &str) -> Vec<Value> {
    let log = proxy.log(id).await;
    log.lines
        .iter()
        .map(|line| serde_json::to_value(line).unwrap())
        .filter(|line| line["kind"] == kind)
        .collect()
}

/// What `audit show` prints for conversation `id`.
async fn show(proxy: &Harness, id: &str) -> String {
    proxy
        .audit(id, |audit, id, tenant, out| {
            audit.show(id, Some(tenant), out)
        })
        .await
}

/// True when `body` carries a message whose content is `handoff`'s.
fn carries(body: &Value, handoff: &Value) -> bool {
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .any(|m| m["content"] == handoff["content"])
}

/// The strict 16k provider, answering every request.
async fn strict_16k() -> (Arc<Strict>, MockUpstream) {
    let strict = Strict::new(16_384);
    let answering = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| answering.answer(request)).await;
    (strict, mock)
}

#[tokio::test]
async fn the_timeline_draws_the_trigger_and_count_each_request_was_decided_with() {
    let (_strict, mock) = strict_16k().await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut history = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..13 {
        turn(&proxy, "decided", &mut history, user(n, 700)).await;
    }
    let records: Vec<Value> = (proxy.records("decided").await.iter())
        .map(|r| serde_json::to_value(r).unwrap())
        .collect();
    assert!(!records.is_empty(), "the session compacted");

    // The client's max_tokens is the reserve, not the default.
    let requests = requests_of(&proxy, "decided").await;
    let decisions = lines_of(&proxy, "decided", "decision").await;
    assert_eq!(decisions.len(), requests.len(), "one decision per request");
    for (event, decision) in requests.iter().zip(&decisions) {
        assert_eq!(event["trigger"], TRIGGER, "{event}");
        assert_eq!(event["trigger"], decision["trigger"]);
        assert_eq!(event["input_budget"], BUDGET);
        assert_eq!(event["reserved"], 1024);
        assert_eq!(event["estimated"], false);
        assert!(
            event["tools_tokens"].as_u64().unwrap() > 20,
            "tools are counted: {event}"
        );
        assert_eq!(event["estimated_tokens"], decision["estimate"]);
        // Over the drawn trigger only when the proxy says why.
        if event["estimated_tokens"].as_u64().unwrap() > TRIGGER {
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
        assert_eq!(event["provider_tokens"], Strict::count(body), "{event}");
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
        assert!(carries(&sent[number - 1], &record["handoff"]));
        assert!(!carries(&sent[number - 2], &record["handoff"]));
    }

    // `audit show` prints the same figures.
    let show = show(&proxy, "decided").await;
    let trigger = format!("trigger={TRIGGER}");
    assert_eq!(show.matches(&trigger).count(), requests.len(), "{show}");
    assert_eq!(show.matches("COMPACTED HERE").count(), records.len());
    let last = requests.last().unwrap();
    assert!(
        show.contains(&format!(
            "sent~{} ",
            last["estimated_tokens"].as_u64().unwrap()
        )) && show.contains(&format!("provider={}", last["provider_tokens"])),
        "{show}"
    );
}

#[tokio::test]
async fn a_view_sent_over_the_trigger_says_why_and_a_refusal_or_an_upstream_error_is_marked() {
    let strict = Strict::new(16_384);
    // The scripted model, but a 503 for a question that asks for one.
    let answering = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request: &Recorded| {
        if request.json().to_string().contains("PLEASE-FAIL") {
            return Reply::error(503, "overloaded", "try later");
        }
        answering.answer(request)
    })
    .await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut history = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..3 {
        turn(&proxy, "odd", &mut history, user(n, 200)).await;
    }
    // The newest message alone is over the trigger and under the budget with a handoff
    // of the rest: everything before it is compacted, and the view is sent.
    history.push(sized_user(90, 14_100));
    let got = send(&proxy, "odd", &history).await;
    assert_eq!(got.status, 200, "{}", got.text());
    history.pop();
    // Alone over the budget, with calibrated counts: refused, and logged as refused.
    history.push(sized_user(91, 17_000));
    let refused = send(&proxy, "odd", &history).await;
    assert_eq!(refused.status, 400, "{}", refused.text());
    history.pop();
    history.push(json!({"role": "user", "content": "PLEASE-FAIL now"}));
    let failed = send(&proxy, "odd", &history).await;
    assert_eq!(failed.status, 503);

    let requests = requests_of(&proxy, "odd").await;
    let over: Vec<&Value> = requests.iter().filter(|e| !e["over"].is_null()).collect();
    assert_eq!(over.len(), 1, "{requests:#?}");
    assert_eq!(over[0]["over"], "newest_unit");
    assert!(over[0]["estimated_tokens"].as_u64().unwrap() > TRIGGER);
    assert!(over[0]["estimated_tokens"].as_u64().unwrap() <= BUDGET);
    assert_eq!(over[0]["compacted_here"], true, "{}", over[0]);
    let refusal = &requests[requests.len() - 2];
    assert_eq!(refusal["refused"], "context_length_exceeded", "{refusal}");
    assert!(refusal["estimated_tokens"].as_u64().unwrap() > BUDGET);
    assert!(
        refusal["provider_tokens"].is_null(),
        "never sent: {refusal}"
    );
    let error = requests.last().unwrap();
    assert_eq!(error["upstream_status"], 503, "{error}");
    for event in &requests {
        if event["estimated_tokens"].as_u64().unwrap_or(0) > TRIGGER {
            assert!(
                !event["over"].is_null() || !event["refused"].is_null(),
                "a request drawn over the trigger without a why: {event}"
            );
        }
    }
    // Uncalibrated, a first request over the budget by less than a factor of two is
    // sent on that guess; the provider refuses it, and nothing can be cut.
    let first = [
        json!({"role": "system", "content": "be brief"}),
        sized_user(1, 15_800),
    ];
    let guessed = send(&proxy, "guess", &first).await;
    assert_eq!(guessed.status, 400, "{}", guessed.text());
    let guess = requests_of(&proxy, "guess").await.pop().unwrap();
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
    let asked = [
        json!({"role": "system", "content": "be brief"}),
        json!({"role": "user", "content": "read the log"}),
        call,
        json!({"role": "tool", "tool_call_id": "c1", "content": body}),
    ];
    let rescued = send(&proxy, "rescue", &asked).await;
    assert_eq!(rescued.status, 200, "{}", rescued.text());
    let rescue = requests_of(&proxy, "rescue").await.pop().unwrap();
    assert_eq!(rescue["rescued"], true, "{rescue}");
    assert!(
        rescue["over"].is_null() || rescue["over"] == "rescued",
        "{rescue}"
    );
    assert!(
        rescue["estimated_tokens"].as_u64().unwrap() <= BUDGET,
        "{rescue}"
    );

    let show = show(&proxy, "odd").await;
    assert!(show.contains("OVER THE TRIGGER (newest_unit)"), "{show}");
    assert!(show.contains("REFUSED context_length_exceeded"), "{show}");
    assert!(show.contains("UPSTREAM ANSWERED 503"), "{show}");
}
