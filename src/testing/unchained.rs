//! Server-held Responses conversations past the window, on the in-process harness,
//! against the strict Responses server (it stores responses and conversations, and
//! refuses an input over its window): a 30-turn tool loop chained by
//! `previous_response_id`, and one over a `conversation`, are continued from
//! handoff's record and compacted, where they would die of the window.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use mock_upstream::responses::StrictResponses;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

use crate::audit::summarize;
use crate::testing::Harness;

const CONFIG: &str = "[models.\"gpt-mock\"]\ncontext_window = 6000\ntokenizer = \"estimate\"\n[compaction]\nprepare_at = 0\n";

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// The output of a create, streamed or not.
fn output_of(got: &crate::testing::Answer, stream: bool) -> Value {
    if !stream {
        return got.json();
    }
    (got.text().lines())
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str::<Value>(data).ok())
        .find(|event| event["type"] == "response.completed")
        .map(|event| event["response"].clone())
        .expect("a completed response")
}

/// A 30-turn tool loop that sends only its new items each turn, the rest held by the
/// server: chained by `previous_response_id`, or over `conversation`. Turns served.
async fn held_session(proxy: &Harness, over_conversation: bool) -> usize {
    let filler: String = (0..250).map(|i| format!("w{i} ")).collect();
    let mut previous: Option<String> = None;
    let mut pending: Vec<Value> = Vec::new();
    let mut served = 0;
    for turn in 0..30 {
        let mut input = std::mem::take(&mut pending);
        input.push(user(&format!("FACT-{turn:03} {filler}")));
        loop {
            let stream = served % 2 == 1;
            let mut body =
                json!({"model": "gpt-mock", "input": input, "store": true, "stream": stream});
            match (&previous, over_conversation) {
                (_, true) => body["conversation"] = json!("conv_held"),
                (Some(id), false) => body["previous_response_id"] = json!(id),
                (None, false) => {}
            }
            let got = proxy
                .post(
                    "/v1/responses",
                    &[("authorization", "Bearer sk-held")],
                    body.to_string().as_bytes(),
                )
                .await;
            assert_eq!(got.status, 200, "turn {turn}: {}", got.text());
            served += 1;
            let response = output_of(&got, stream);
            previous = response["id"].as_str().map(str::to_owned);
            let calls: Vec<Value> = (response["output"].as_array().unwrap().iter())
                .filter(|item| item["type"] == "function_call")
                .cloned()
                .collect();
            if calls.is_empty() {
                break;
            }
            input = (calls.iter())
                .map(|call| json!({"type": "function_call_output", "call_id": call["call_id"], "output": "found"}))
                .collect();
        }
    }
    served
}

async fn strict() -> (Arc<StrictResponses>, MockUpstream) {
    let strict = StrictResponses::new(6000);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| responder.answer(request)).await;
    (strict, mock)
}

#[tokio::test]
async fn a_server_held_session_past_the_window_is_continued_from_the_record() {
    for over_conversation in [false, true] {
        let (strict, mock) = strict().await;
        let proxy = Harness::start(&mock.url(), CONFIG).await;
        let served = held_session(&proxy, over_conversation).await;
        assert!(served >= 30, "{served} requests");
        // What the server refused for its window (handoff's estimate runs under its
        // count until usage calibrates it) was compacted tighter and sent again: every
        // turn was answered.
        let refused = strict.refused.lock().unwrap().clone();
        assert!(refused.len() <= 2, "{refused:?}");
        let held_refused = (mock.requests().iter())
            .filter(|r| {
                r.json().get("previous_response_id").is_some()
                    || r.json().get("conversation").is_some()
            })
            .filter(|r| r.json()["input"].to_string().len() > 20_000)
            .count();
        assert_eq!(held_refused, 0, "no held request carried the history");
        let ids = proxy.conversations().await;
        assert_eq!(ids.len(), 1, "{ids:?}");
        let id = ids[0].as_str().to_owned();
        assert!(!proxy.records(&id).await.is_empty(), "handoff compacted");
        let log = proxy.log(&id).await;
        assert_eq!(summarize(&ids[0], &log).branches, 1);
        // Each request sent from the record says so on its decision line.
        let held = if over_conversation {
            "conversation"
        } else {
            "previous_response"
        };
        let noted = (log.lines.iter())
            .filter(|line| matches!(&line.entry, crate::base::line::Entry::Decision(d) if d.from_record.as_deref() == Some(held)))
            .count();
        assert!(noted >= 1, "no decision line says {held}");
        // Past the window, a request went without the server's reference, carrying the
        // compacted history; the model read the first fact through the handoff.
        let sent = mock.requests();
        let alone = (sent.iter())
            .filter(|r| !mock_upstream::strict::is_summary(&r.json()))
            .filter(|r| {
                r.json().get("previous_response_id").is_none()
                    && r.json().get("conversation").is_none()
            })
            .count();
        assert!(alone >= 1, "sent from the record {alone} times");
        assert!(sent
            .iter()
            .any(|r| r.json()["input"].to_string().contains("FACT-029")));
        let last_alone = (sent.iter().rev())
            .map(|r| r.json())
            .find(|body| {
                !mock_upstream::strict::is_summary(body)
                    && body.get("previous_response_id").is_none()
                    && body.get("conversation").is_none()
                    && body["input"].as_array().is_some_and(|i| i.len() > 2)
            })
            .unwrap();
        let read = last_alone["input"].to_string();
        assert!(
            read.contains("FACT-000"),
            "the handoff carries the first fact: {read}"
        );
    }
}

#[tokio::test]
async fn a_server_held_request_that_fits_goes_as_it_came() {
    let (_strict, mock) = strict().await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let body = json!({"model": "gpt-mock", "input": [user("hello")], "store": true});
    let got = proxy
        .post("/v1/responses", &[], body.to_string().as_bytes())
        .await;
    let answer = got.json();
    let id = answer["id"].as_str().unwrap().to_owned();
    let call = (answer["output"].as_array().unwrap().iter())
        .find(|item| item["type"] == "function_call")
        .unwrap()["call_id"]
        .clone();
    let next = json!({"model": "gpt-mock", "input": [{"type": "function_call_output",
        "call_id": call, "output": "found"}], "previous_response_id": id, "store": true});
    let got = proxy
        .post("/v1/responses", &[], next.to_string().as_bytes())
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let sent = mock.requests().last().unwrap().body.clone();
    assert_eq!(sent, next.to_string().into_bytes(), "byte for byte");
}
