//! The Responses API's own compaction served by handoff, on the in-process harness,
//! against a strict Responses server without it (a self-hosted model's: the trigger
//! and any `compaction` item are a 400, `/responses/compact` a 404): a Codex-like
//! session compacts through handoff, the handle never reaches the model, and a
//! forged, altered or foreign handle is refused in the API's shape.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use mock_upstream::responses::StrictResponses;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

use crate::audit::summarize;
use crate::dialect::HANDLE_PREFIX;
use crate::testing::Harness;

/// `gpt-mock` with a 6,000-token window, and `native` as its native compaction.
fn config(native: &str) -> String {
    format!("[upstream]\nnative_compaction = \"{native}\"\n[models.\"gpt-mock\"]\ncontext_window = 6000\ntokenizer = \"estimate\"\n[compaction]\nprepare_at = 0\n")
}

async fn without_native() -> (Arc<StrictResponses>, MockUpstream) {
    let strict = StrictResponses::new(6000);
    strict.set_native(false);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| responder.answer(request)).await;
    (strict, mock)
}

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

/// An output item as Codex sends it back: without the fields only output has.
fn echoed(mut item: Value) -> Value {
    if let Some(fields) = item.as_object_mut() {
        for field in ["id", "status", "created_by"] {
            fields.remove(field);
        }
    }
    item
}

async fn send(proxy: &Harness, path: &str, key: &str, body: &Value) -> crate::testing::Answer {
    let bearer = format!("Bearer {key}");
    let headers = [
        ("authorization", bearer.as_str()),
        ("x-codex-beta-features", "remote_compaction_v2"),
    ];
    proxy
        .post(path, &headers, body.to_string().as_bytes())
        .await
}

/// A Codex-like session: facts planted turn by turn, a trigger when the history is
/// long, the history started again from the kept prompt and the one item answered.
async fn session(proxy: &Harness, mock: &MockUpstream, stream: bool) -> (Vec<Value>, Value) {
    let filler: String = (0..300).map(|i| format!("w{i} ")).collect();
    let kept = vec![user("fix the failing test")];
    let mut history = kept.clone();
    for turn in 0..4 {
        history.push(user(&format!("FACT-{turn:03} {filler}")));
        let body = json!({"model": "gpt-mock", "instructions": "You are Codex.", "input": history, "store": false});
        let got = send(proxy, "/v1/responses", "sk-served", &body).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let output = got.json()["output"].as_array().unwrap().clone();
        for item in output {
            if item["type"] == "function_call" {
                let answer = json!({"type": "function_call_output", "call_id": item["call_id"], "output": "ok"});
                history.push(echoed(item));
                history.push(answer);
            } else {
                history.push(echoed(item));
            }
        }
    }
    let mut asking = history.clone();
    asking.push(json!({"type": "compaction_trigger"}));
    let body = json!({"model": "gpt-mock", "instructions": "You are Codex.", "input": asking,
                      "store": false, "stream": stream});
    let got = send(proxy, "/v1/responses", "sk-served", &body).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let item = match stream {
        true => {
            let text = got.text();
            let completed = (text.lines())
                .filter_map(|line| line.strip_prefix("data: "))
                .filter_map(|data| serde_json::from_str::<Value>(data).ok())
                .find(|event| event["type"] == "response.completed")
                .expect("a completed event");
            assert!(text.find("response.created") < text.find("response.output_item.added"));
            completed["response"]["output"].clone()
        }
        false => got.json()["output"].clone(),
    };
    assert_eq!(item.as_array().map(Vec::len), Some(1), "{item}");
    let item = item[0].clone();
    assert_eq!(item["type"], "compaction");
    assert!(item["encrypted_content"]
        .as_str()
        .unwrap()
        .starts_with(HANDLE_PREFIX));
    let mut after = kept;
    after.push(echoed(item.clone()));
    after.push(user("what were the facts?"));
    let body = json!({"model": "gpt-mock", "instructions": "You are Codex.", "input": after, "store": false});
    let got = send(proxy, "/v1/responses", "sk-served", &body).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let seen = mock.requests();
    (seen.iter().map(|r| r.json()).collect(), item)
}

#[tokio::test]
async fn a_trigger_the_upstream_refuses_is_served_once_asked_and_at_once_after() {
    for stream in [false, true] {
        let (strict, mock) = without_native().await;
        let proxy = Harness::start(&mock.url(), &config("auto")).await;
        let served = session(&proxy, &mock, stream).await;
        let seen = &served.0;
        // The upstream refused the first trigger, once; handoff served it.
        let refused = strict.refused.lock().unwrap().clone();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].contains("compaction_trigger"), "{refused:?}");
        // Made by the strategy chain: a summary call to the model.
        let summaries = strict.summaries.load(std::sync::atomic::Ordering::SeqCst);
        assert!(summaries >= 1, "{summaries} summary calls");
        // The last request reached the model with the handle opened: every planted
        // fact is in what it read, and no handle ever went upstream.
        let last = seen.last().unwrap();
        let read = last["input"].to_string();
        for fact in 0..4 {
            assert!(read.contains(&format!("FACT-{fact:03}")), "{read}");
        }
        assert!(seen
            .iter()
            .all(|body| !body.to_string().contains(HANDLE_PREFIX)));
        // One conversation, one branch, the request replaying as the client sent it.
        let ids = proxy.conversations().await;
        assert_eq!(ids.len(), 1, "{ids:?}");
        let id = ids[0].as_str().to_owned();
        let log = proxy.log(&id).await;
        assert_eq!(summarize(&ids[0], &log).branches, 1);

        // A second trigger over the first handle, as Codex sends it, once known
        // refused, is served with no upstream refusal; what the second handle stands
        // for still carries every fact the first one did.
        let (_, first) = &served;
        let asking = vec![
            user("fix the failing test"),
            echoed(first.clone()),
            user("what were the facts?"),
            json!({"type": "compaction_trigger"}),
        ];
        let before = mock.requests().len();
        let body = json!({"model": "gpt-mock", "input": asking, "store": false});
        let got = send(&proxy, "/v1/responses", "sk-served", &body).await;
        assert_eq!(got.status, 200, "{}", got.text());
        assert_eq!(strict.refused.lock().unwrap().len(), 1);
        let second = got.json()["output"][0].clone();
        assert_ne!(second["encrypted_content"], first["encrypted_content"]);
        let next = vec![
            user("fix the failing test"),
            echoed(second),
            user("and once more?"),
        ];
        let body = json!({"model": "gpt-mock", "input": next, "store": false});
        let got = send(&proxy, "/v1/responses", "sk-served", &body).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let after = mock.requests();
        assert!(after[before..].iter().all(|r| {
            let input = r.json()["input"].to_string();
            !input.contains("compaction_trigger") && !input.contains(HANDLE_PREFIX)
        }));
        let read = after.last().unwrap().json()["input"].to_string();
        for fact in 0..4 {
            assert!(read.contains(&format!("FACT-{fact:03}")), "{read}");
        }
        assert_eq!(proxy.conversations().await.len(), 1);
    }
}

#[tokio::test]
async fn the_compact_endpoint_is_served_where_the_upstream_has_none() {
    let (strict, mock) = without_native().await;
    let proxy = Harness::start(&mock.url(), &config("serve")).await;
    let filler: String = (0..300).map(|i| format!("w{i} ")).collect();
    let input: Vec<Value> = (0..4)
        .flat_map(|n| {
            [
                user(&format!("FACT-{n:03} {filler}")),
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "noted"}]}),
            ]
        })
        .collect();
    let body = json!({"model": "gpt-mock", "input": input});
    let got = send(&proxy, "/v1/responses/compact", "sk-served", &body).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let answer = got.json();
    assert_eq!(answer["object"], "response.compaction");
    let output = answer["output"].as_array().unwrap().clone();
    assert_eq!(
        output.len(),
        5,
        "four user messages and the item: {output:?}"
    );
    assert_eq!(output[4]["type"], "compaction");
    // Served: the upstream never saw the endpoint.
    assert!(mock
        .requests()
        .iter()
        .all(|r| !r.target.contains("/compact")));
    assert!(strict.refused.lock().unwrap().is_empty());
    // The client's next request, from the compacted output, is answered.
    let mut next = output.clone();
    next.push(user("what were the facts?"));
    let body = json!({"model": "gpt-mock", "input": next});
    let got = send(&proxy, "/v1/responses", "sk-served", &body).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let read = mock.requests().last().unwrap().json()["input"].to_string();
    assert!(
        read.contains("FACT-003") && !read.contains(HANDLE_PREFIX),
        "{read}"
    );
}

#[tokio::test]
async fn forged_altered_and_foreign_handles_are_refused_naming_the_item() {
    let (_strict, mock) = without_native().await;
    let proxy = Harness::start(&mock.url(), &config("serve")).await;
    let (_, item) = session(&proxy, &mock, false).await;
    let sealed = item["encrypted_content"].as_str().unwrap().to_owned();
    let with = |content: &str| {
        json!({"model": "gpt-mock", "store": false, "input": [user("fix the failing test"),
            {"type": "compaction", "encrypted_content": content}, user("go on")]})
    };
    let before = mock.requests().len();
    let mut altered = sealed.clone().into_bytes();
    let at = HANDLE_PREFIX.len() + 5;
    altered[at] = if altered[at] == b'x' { b'y' } else { b'x' };
    let altered = String::from_utf8(altered).unwrap();
    let forged = format!("{HANDLE_PREFIX}e30.AAAA");
    for (content, key) in [
        (altered.as_str(), "sk-served"),
        (forged.as_str(), "sk-served"),
        // Another caller's: its tenant is another.
        (sealed.as_str(), "sk-someone-else"),
        // A provider's sealed item, which this upstream cannot read.
        ("gAAAAABprovider", "sk-served"),
    ] {
        let got = send(&proxy, "/v1/responses", key, &with(content)).await;
        assert_eq!(got.status, 400, "{}", got.text());
        let error = got.json()["error"].clone();
        assert_eq!(error["code"], "invalid_encrypted_content", "{error}");
        assert!(
            error["message"].as_str().unwrap().contains("input[1]"),
            "{error}"
        );
    }
    // Another conversation of the same caller, named by the client.
    let bearer = "Bearer sk-served";
    let headers = [
        ("authorization", bearer),
        (crate::base::id::CONVERSATION_HEADER, "elsewhere"),
    ];
    let got = proxy
        .post(
            "/v1/responses",
            &headers,
            with(&sealed).to_string().as_bytes(),
        )
        .await;
    assert_eq!(got.status, 400, "{}", got.text());
    assert!(
        got.text().contains("another conversation"),
        "{}",
        got.text()
    );
    assert_eq!(mock.requests().len(), before, "nothing went upstream");
}

#[tokio::test]
async fn the_compact_endpoint_serves_a_chain_the_upstream_holds_from_the_record() {
    let (strict, mock) = without_native().await;
    let proxy = Harness::start(&mock.url(), &config("serve")).await;
    let filler: String = (0..300).map(|i| format!("w{i} ")).collect();
    let mut previous: Option<String> = None;
    let mut answers: Vec<Value> = Vec::new();
    for n in 0..4 {
        let mut input = std::mem::take(&mut answers);
        input.push(user(&format!("FACT-{n:03} {filler}")));
        let mut body = json!({"model": "gpt-mock", "store": true, "input": input});
        if let Some(id) = &previous {
            body["previous_response_id"] = json!(id);
        }
        let got = send(&proxy, "/v1/responses", "sk-served", &body).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let answer = got.json();
        previous = answer["id"].as_str().map(str::to_owned);
        for item in answer["output"].as_array().unwrap() {
            if item["type"] == "function_call" {
                answers.push(json!({"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}));
            }
        }
    }
    // The SDK's responses.compact over the chain: the history is in handoff's record.
    answers.push(user("and compact"));
    let body = json!({"model": "gpt-mock", "previous_response_id": previous, "input": answers});
    let got = send(&proxy, "/v1/responses/compact", "sk-served", &body).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let output = got.json()["output"].as_array().unwrap().clone();
    let users = output.iter().filter(|i| i["role"] == "user").count();
    assert_eq!(users, 5, "every user message of the chain: {output:?}");
    assert_eq!(output.last().unwrap()["type"], "compaction");
    assert!(mock
        .requests()
        .iter()
        .all(|r| !r.target.contains("/compact")));
    // The client goes on from the compacted output alone: the model reads the chain's facts.
    let mut next = output.clone();
    next.push(user("what were the facts?"));
    let got = send(
        &proxy,
        "/v1/responses",
        "sk-served",
        &json!({"model": "gpt-mock", "input": next}),
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let read = mock.requests().last().unwrap().json()["input"].to_string();
    assert!(
        read.contains("FACT-000") && read.contains("FACT-003") && !read.contains(HANDLE_PREFIX),
        "{read}"
    );
    assert!(strict.refused.lock().unwrap().is_empty());
    // A response handoff never saw is refused, in the API's shape.
    let body =
        json!({"model": "gpt-mock", "previous_response_id": "resp_unknown", "input": [user("x")]});
    let got = send(&proxy, "/v1/responses/compact", "sk-served", &body).await;
    assert_eq!(got.status, 400, "{}", got.text());
    assert_eq!(got.json()["error"]["code"], "previous_response_not_found");
}
