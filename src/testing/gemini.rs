//! Google's Gemini API on the in-process harness: a stream in its JSON-array form is
//! relayed and its reply logged as the model's content with its usage, and bodies that
//! are not the API's shape get Google's own error shape and go nowhere.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use mock_upstream::scripted::{ScriptedCoder, Thinking};
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

use super::{Answer, Harness};

const STREAM: &str = "/v1beta/models/gemini-mock:streamGenerateContent";
const GENERATE: &str = "/v1beta/models/gemini-mock:generateContent";

/// A user turn of about 600 tokens stating fact `n`.
fn turn(n: usize) -> Value {
    let words: Vec<String> = (0..280).map(|i| format!("w{i}")).collect();
    json!({"role": "user", "parts": [{"text": format!("FACT-{n:03} {}", words.join(" "))}]})
}

fn body(contents: &[Value]) -> Value {
    json!({"contents": contents, "systemInstruction": {"parts": [{"text": "You are terse."}]},
        "generationConfig": {"thinkingConfig": {"thinkingBudget": -1}}})
}

/// Posts `body` to `target` in conversation `id`, with the API key header.
async fn post(proxy: &Harness, target: &str, id: &str, body: &str) -> Answer {
    let headers = [("x-handoff-conversation-id", id), ("x-goog-api-key", "k")];
    proxy.post(target, &headers, body.as_bytes()).await
}

#[tokio::test]
async fn the_json_array_stream_is_logged_and_bad_bodies_get_google_s_errors() {
    let work = tempfile::tempdir().unwrap();
    let model = ScriptedCoder::new(1_000_000, 3, work.path().to_owned(), Thinking::Some);
    let answer = Arc::clone(&model);
    let mock = MockUpstream::with(move |r| answer.answer(r)).await;
    let config = "[models.\"gemini-mock\"]\ncontext_window = 100000\n";
    let proxy = Harness::start(&mock.url(), config).await;

    let got = post(&proxy, STREAM, "array", &body(&[turn(1)]).to_string()).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let chunks = got.json();
    assert!(chunks.as_array().is_some_and(|c| !c.is_empty()), "{chunks}");
    let log = proxy.log("array").await;
    let lines: Vec<Value> = (log.lines.iter())
        .map(|line| serde_json::to_value(line).unwrap())
        .collect();
    let reply = lines.iter().find(|l| l["source"] == "upstream").unwrap();
    assert_eq!(
        reply["message"],
        json!({"role": "model", "parts": [{"text": "Reading notes"}]}),
        "{reply}"
    );
    assert!(
        reply["usage"]["promptTokenCount"].as_u64().unwrap() > 100,
        "{reply}"
    );
    for (bad, why) in [
        ("{not json", "not JSON"),
        (r#"{"contents": "hello"}"#, "contents is not a list"),
        (r#"{"contents": [7]}"#, "a content is not an object"),
    ] {
        let refused = post(&proxy, GENERATE, "bad", bad).await;
        assert_eq!(refused.status, 400, "{why}: {}", refused.text());
        let error = &refused.json()["error"];
        assert_eq!(error["code"], 400, "{why}");
        assert_eq!(error["status"], "INVALID_ARGUMENT", "{why}");
        assert!(
            !error["message"].as_str().unwrap().is_empty(),
            "{why}: {error}"
        );
    }
    assert_eq!(mock.requests().len(), 1, "nothing malformed went upstream");
}
