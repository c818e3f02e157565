//! OpenAI's Responses API end to end: the official openai SDK's `client.responses`
//! through the real binary, against a strict Responses provider. Overflow recovery in
//! each of the API's styles is in-process, in `src/testing/responses.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use crate::support::client::{self, request};
use crate::support::scenario::{self, estimate_model, records, run_client, serve_strict};
use crate::support::{canonical, Proxy, ProxyOptions};
use mock_upstream::responses::StrictResponses;
use mock_upstream::{MockUpstream, Recorded};
use serde_json::{json, Value};

const ID: &str = "responses-agent";

async fn strict_responses(window: u64) -> (Arc<StrictResponses>, MockUpstream) {
    let strict = StrictResponses::new(window);
    let mock = serve_strict(&strict, StrictResponses::answer).await;
    (strict, mock)
}

fn options(data: &std::path::Path, window: u64) -> ProxyOptions {
    estimate_model(data, "gpt-mock", window)
}

fn is_summary(request: &Recorded) -> bool {
    mock_upstream::strict::is_summary(&request.json())
}

fn agent_requests(mock: &MockUpstream) -> Vec<Recorded> {
    mock.requests()
        .into_iter()
        .filter(|r| r.target == "/v1/responses" && !is_summary(r))
        .collect()
}

/// Refusals that are not about the window: an invalid request reached the provider.
fn structural_refusals(strict: &StrictResponses) -> Vec<String> {
    strict
        .refused
        .lock()
        .unwrap()
        .iter()
        .filter(|r| !r.contains("exceeds the context window"))
        .cloned()
        .collect()
}

async fn run_agent(proxy: &Proxy, state: &std::path::Path, first: u32, last: u32) -> Value {
    scenario::run_agent(proxy, "openai_responses_agent.py", state, first, last).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stateless_sdk_agent_compacts_and_survives_a_restart() {
    let (strict, mock) = strict_responses(8000).await;
    let data = tempfile::tempdir().unwrap();
    let state = data.path().join("client-state.json");
    let mut proxy = Proxy::start_with(&mock.url(), options(data.path(), 8000));

    run_agent(&proxy, &state, 1, 16).await;
    let first = records(&proxy, ID);
    assert!(!first.is_empty(), "no compaction in 16 turns");
    assert_eq!(first[0]["strategy"], "summarize", "{}", first[0]);
    assert_eq!(
        first[0]["handoff"]["content"][0]["type"], "output_text",
        "the handoff is a Responses message: {}",
        first[0]["handoff"]
    );
    assert!(strict.summaries.load(std::sync::atomic::Ordering::SeqCst) > 0);

    // Restart: the client's own last request gets the same view, rebuilt from disk.
    let before = agent_requests(&mock).pop().unwrap();
    let sent = before.json();
    assert_eq!(sent["instructions"], "You are a meticulous agent.");
    assert!(sent.to_string().contains("FACT-001"), "FACT-001 was lost");
    // The first turn is compacted away: only the handoff's ledger quotes it.
    scenario::assert_only_the_ledger_quotes(&sent["input"], "Step 1. Remember");
    proxy.kill9();
    let proxy = Proxy::start_with(&mock.url(), options(data.path(), 8000));
    let mut items: Vec<Value> =
        serde_json::from_str(&std::fs::read_to_string(&state).unwrap()).unwrap();
    items.pop(); // the final answer, which came after that request
    let mut again = sent.clone();
    again["input"] = Value::Array(items);
    let resent = client::send(request(
        "POST",
        &format!("{}/v1/responses", proxy.url()),
        &[
            ("authorization", "Bearer sk-responses-agent-test"),
            ("x-handoff-conversation-id", ID),
        ],
        again.to_string(),
    ))
    .await;
    assert_eq!(resent.status, 200, "{}", resent.text());
    let after = agent_requests(&mock).pop().unwrap();
    assert_eq!(
        after.json()["input"],
        sent["input"],
        "the view after a restart differs"
    );

    let done = run_agent(&proxy, &state, 17, 28).await;
    assert!(
        records(&proxy, ID).len() > first.len(),
        "no compaction after the restart"
    );
    assert!(
        structural_refusals(&strict).is_empty(),
        "invalid Responses requests reached the provider: {:?}",
        structural_refusals(&strict)
    );
    // The log holds every item exactly as the client sent it, reasoning included.
    let replay = proxy.replay(ID, None);
    let expected = done["replay"].as_array().unwrap();
    assert_eq!(replay.len(), expected.len(), "replay length");
    for (got, want) in replay.iter().zip(expected) {
        assert_eq!(canonical(got), canonical(want));
    }
    let show = String::from_utf8(proxy.audit(&["show", ID]).stdout).unwrap();
    let head = show.lines().next().unwrap();
    assert!(head.contains("dialect responses"), "{head}");
    // Output items echoed by the SDK join the chain: the only branch is the
    // regenerated answer of the resent request.
    assert!(head.contains(" 2 branches"), "{head}");
    proxy.assert_verified(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_response_id_chain_passes_through_unchanged() {
    let (_strict, mock) = strict_responses(100_000).await;
    let data = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(&mock.url(), options(data.path(), 100_000));
    let got = run_client(&proxy, "openai_responses_chain.py", &[]).await;
    assert!(got["text"].as_str().unwrap().starts_with("answer"), "{got}");
    let seen: Vec<Recorded> = mock.requests();
    let second = seen.last().unwrap().json();
    assert_eq!(second["previous_response_id"], got["first"]);
    assert_eq!(
        second["input"],
        json!([{"type": "function_call_output", "call_id": second["input"][0]["call_id"], "output": "777 is lucky"}]),
        "a stateful request must reach the upstream as sent"
    );
    // Both requests are in one conversation, the second marked server-held.
    let conversations = proxy.conversations();
    assert_eq!(conversations.len(), 1, "{conversations:?}");
    let id = conversations[0]["id"].as_str().unwrap().to_owned();
    let show = String::from_utf8(proxy.audit(&["show", &id]).stdout).unwrap();
    assert_eq!(show.matches("SERVER-HELD").count(), 1, "{show}");
    // The stateful request's items continue the response it names: one chain.
    assert!(
        show.lines().next().unwrap().contains(" 1 branches"),
        "{show}"
    );
    let kinds: Vec<String> = proxy
        .replay(&id, None)
        .iter()
        .map(|item| item["type"].as_str().unwrap_or("message").to_owned())
        .collect();
    assert_eq!(
        kinds,
        [
            "message",
            "reasoning",
            "function_call",
            "function_call_output",
            "message"
        ]
    );
    proxy.assert_verified(&[]);

    // The other Responses paths pass through; handoff's own errors use OpenAI's shape.
    let url = format!("{}/v1/responses", proxy.url());
    let auth = [("authorization", "Bearer sk-chain-test")];
    for path in ["/input_tokens", "/compact"] {
        let before = mock.requests().len();
        let body = json!({"model": "gpt-mock", "input": "hi"}).to_string();
        let _ = client::send(request("POST", &format!("{url}{path}"), &auth, body)).await;
        assert_eq!(
            mock.requests()[before].target,
            format!("/v1/responses{path}")
        );
    }
    for bad in [
        "{\"input\": [".to_owned(),
        json!({"model": "gpt-mock", "input": [{"type": "function_call_output", "call_id": "nope", "output": "x"}]}).to_string(),
    ] {
        let got = client::send(request("POST", &url, &auth, bad.clone())).await;
        assert_eq!(got.status, 400, "{bad}");
        let json: Value = serde_json::from_str(&got.text()).unwrap();
        assert_eq!(json["error"]["type"], "invalid_request_error", "{json}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_continued_after_a_restart_joins_its_conversation() {
    let (_strict, mock) = strict_responses(100_000).await;
    let data = tempfile::tempdir().unwrap();
    let post = |proxy: &Proxy, body: Value| {
        let url = format!("{}/v1/responses", proxy.url());
        client::send(request(
            "POST",
            &url,
            &[
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-restart-test"),
            ],
            body.to_string(),
        ))
    };
    let tools = json!([{"type": "function", "name": "lookup", "parameters": {"type": "object"}}]);
    let mut proxy = Proxy::start_with(&mock.url(), options(data.path(), 100_000));
    let first = post(
        &proxy,
        json!({"model": "gpt-mock", "input": "Look up FACT-777.", "tools": tools}),
    )
    .await;
    assert_eq!(first.status, 200, "{}", first.text());
    let first = first.json();
    let call = first["output"]
        .as_array()
        .unwrap()
        .iter()
        .find(|item| item["type"] == "function_call")
        .unwrap()
        .clone();
    // A reply that is not streamed is logged before it is answered: restart at once,
    // on the same data dir.
    proxy.kill9();
    let proxy = Proxy::start_with(&mock.url(), options(data.path(), 100_000));
    let second = post(
        &proxy,
        json!({"model": "gpt-mock", "previous_response_id": first["id"], "tools": tools,
               "input": [{"type": "function_call_output", "call_id": call["call_id"], "output": "777 is lucky"}]}),
    )
    .await;
    assert_eq!(second.status, 200, "{}", second.text());
    let conversations = proxy.conversations();
    assert_eq!(
        conversations.len(),
        1,
        "the follow-up joined the chain: {conversations:?}"
    );
    assert_eq!(conversations[0]["branches"], 1, "{conversations:?}");
    let id = conversations[0]["id"].as_str().unwrap().to_owned();
    let show = String::from_utf8(proxy.audit(&["show", &id]).stdout).unwrap();
    assert_eq!(show.matches("SERVER-HELD").count(), 1, "{show}");
    // Responses items are named by their type, not `?`.
    assert!(
        show.contains("function_call_output") && show.contains("reasoning"),
        "{show}"
    );
    assert!(!show.contains(" ? "), "{show}");
    assert!(
        !proxy.logs().contains("projected view is invalid"),
        "a stateful follow-up is sent as it is, without an error: {}",
        proxy.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_session_is_one_branch_and_replays_exactly() {
    let (_strict, mock) = strict_responses(100_000).await;
    let data = tempfile::tempdir().unwrap();
    let mut proxy = Proxy::start_with(&mock.url(), options(data.path(), 100_000));
    let mut sent = Vec::new();
    // The calls the last reply made: the server holds them, and the next turn answers
    // them first, as the API requires.
    let mut answers: Vec<Value> = Vec::new();
    for turn in 0..20 {
        if turn == 10 {
            // The chain survives a restart too.
            proxy.kill9();
            proxy = Proxy::start_with(&mock.url(), options(data.path(), 100_000));
        }
        let item = json!({"role": "user", "content": format!("turn {turn}: note FACT-{turn:03}")});
        let mut input = std::mem::take(&mut answers);
        input.push(item.clone());
        let body = json!({"model": "gpt-mock", "conversation": "conv_session_1", "input": input});
        let got = client::send(request(
            "POST",
            &format!("{}/v1/responses", proxy.url()),
            &[
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-conversation-test"),
            ],
            body.to_string(),
        ))
        .await;
        assert_eq!(got.status, 200, "{}", got.text());
        sent.push(item);
        answers = (got.json()["output"].as_array().into_iter().flatten())
            .filter(|output| output["type"] == "function_call")
            .map(|call| json!({"type": "function_call_output", "call_id": call["call_id"], "output": "noted"}))
            .collect();
        // Let the reply be logged before the next turn continues it.
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let conversations = proxy.conversations();
    assert_eq!(conversations.len(), 1, "{conversations:?}");
    assert_eq!(conversations[0]["branches"], 1, "{conversations:?}");
    let id = conversations[0]["id"].as_str().unwrap().to_owned();
    let replay = proxy.replay(&id, None);
    let users: Vec<&Value> = replay.iter().filter(|i| i["role"] == "user").collect();
    assert_eq!(
        users.iter().map(|v| canonical(v)).collect::<Vec<_>>(),
        sent.iter().map(canonical).collect::<Vec<_>>(),
        "every turn, in order"
    );
    assert!(
        replay.len() >= 40,
        "each turn's reply is kept: {}",
        replay.len()
    );
}

/// One Responses request with `input` written as `items` (each item's bytes as given)
/// and `store` left out; returns the output items.
async fn send_items(proxy: &Proxy, items: &[String]) -> Vec<Value> {
    let body = format!(
        r#"{{"model":"gpt-mock","input":[{}],"stream":false}}"#,
        items.join(",")
    );
    let got = client::send(request(
        "POST",
        &format!("{}/v1/responses", proxy.url()),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-ai-sdk-test"),
        ],
        body,
    ))
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    got.json()["output"].as_array().unwrap().clone()
}

/// A session as the Vercel AI SDK's default OpenAI provider sends it (the Responses
/// API, `store` left at the API's default): each earlier reasoning item and assistant
/// message re-sent as an `item_reference`, each `function_call` without `status` and
/// with `id` last. The references expand upstream to the items they name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ai_sdk_session_of_references_is_one_branch_and_replays_exactly() {
    const WINDOW: u64 = 6_000;
    let (strict, mock) = strict_responses(WINDOW).await;
    // Each reasoning item the references stand for is hundreds of tokens upstream.
    strict.set_reasoning_bytes(4_000);
    let data = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(&mock.url(), options(data.path(), WINDOW));
    let padding = "The ledger must stay exact across every handoff. ".repeat(10);
    let mut items: Vec<String> = Vec::new();
    let mut first_request = Vec::new();
    let mut last_request = Vec::new();
    for turn in 1..=10 {
        items.push(
            json!({"role": "user", "content": [{"type": "input_text",
                "text": format!("Turn {turn}. Remember FACT-{turn:03}. {padding}")}]})
            .to_string(),
        );
        for step in 0..2 {
            if first_request.is_empty() {
                first_request = items.clone();
            }
            last_request = items.clone();
            let output = send_items(&proxy, &items).await;
            for item in &output {
                let id = item["id"].as_str().unwrap();
                match item["type"].as_str().unwrap() {
                    "function_call" => {
                        items.push(format!(
                            r#"{{"type":"function_call","call_id":{},"name":{},"arguments":{},"id":"{id}"}}"#,
                            item["call_id"], item["name"], item["arguments"]
                        ));
                        items.push(format!(
                            r#"{{"type":"function_call_output","call_id":{},"output":"looked up: FACT-{turn:03}"}}"#,
                            item["call_id"]
                        ));
                    }
                    _ => items.push(format!(r#"{{"type":"item_reference","id":"{id}"}}"#)),
                }
            }
            if step == 1 {
                assert_eq!(output.len(), 1, "a call's output gets a message");
            }
        }
    }
    // Not even for the window.
    let refused = strict.refused.lock().unwrap().clone();
    assert!(refused.is_empty(), "the upstream refused: {refused:?}");
    let conversations = proxy.conversations();
    assert_eq!(conversations.len(), 1, "{conversations:?}");
    assert_eq!(conversations[0]["branches"], 1, "{conversations:?}");
    let id = conversations[0]["id"].as_str().unwrap().to_owned();
    assert!(
        records(&proxy, &id).len() >= 2,
        "two compactions in 10 turns: {}",
        records(&proxy, &id).len()
    );
    // The strategies read the items the references name, not their ids: no summary
    // reads a reference, and the summaries quote the assistant's messages. (A summary
    // prepared in the background covers the span known when it started, which may end
    // at a user turn whose call and result stay recent, so not every one quotes one.)
    let summaries: Vec<String> = mock
        .requests()
        .iter()
        .filter(|r| is_summary(r))
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert!(!summaries.is_empty());
    for summary in &summaries {
        assert!(
            !summary.contains("[item_reference]"),
            "a summary read references: {}",
            &summary[..summary.len().min(600)]
        );
    }
    // A summary rendered as text quotes the assistant's messages the references name;
    // one that continues the conversation sends the references themselves, which the
    // upstream expands (this mock answers 404 to one it does not know).
    assert!(
        summaries
            .iter()
            .any(|s| s.contains("the record is noted") || s.contains("\"item_reference\"")),
        "no summary reads an assistant message"
    );
    // The last request, item for item and byte for byte, then its reply.
    let replay = proxy.replay_raw(&["replay", &id]);
    assert_eq!(replay.len(), last_request.len() + 1, "{replay:?}");
    assert_eq!(replay[..last_request.len()], last_request[..]);
    assert!(replay[last_request.len()].contains(r#""type":"message""#));
    // Any request by its number: the first, as sent.
    let first = proxy.replay_raw(&["replay", &id, "--request", "1"]);
    assert_eq!(first[..first_request.len()], first_request[..]);
    let outside = proxy.audit(&["replay", &id, "--request", "999"]);
    assert!(!outside.status.success());
    assert!(
        String::from_utf8_lossy(&outside.stderr).contains("no request 999"),
        "{outside:?}"
    );
    proxy.assert_verified(&[]);
}
