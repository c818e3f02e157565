//! The request-stage hooks run wherever a request's text reaches a model, on the
//! in-process harness: on the paths handoff does not track (a legacy completion, the
//! batches of three APIs, an embedding, `/responses/compact`), with a proxy key or
//! without, and on the text outside a tracked request's messages (tool descriptions, a
//! `prediction`). What a redact hook takes out never reaches the upstream; what a deny
//! rule refuses is answered in the API's shape with nothing sent.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use mock_upstream::{chat_completion, MockUpstream, Reply};
use serde_json::{json, Value};

use crate::testing::{sha256_hex, Harness};

const KEY: &str = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX0123";
const PROXY_KEY: &str = "hk-everywhere-0123456789";

const HOOKS: &str = "[middleware]\nchain = [\"secrets\", \"stop\"]\n\
    [middleware.hooks.secrets]\nkind = \"redact\"\ndetectors = [\"api_keys\"]\n\
    [middleware.hooks.stop]\nkind = \"deny\"\n\
    [[middleware.hooks.stop.rules]]\ncontent = \"FORBIDDEN-PLAN\"\nmessage = \"no plans\"\n";

/// The generating paths handoff does not track, each with a body carrying `text`.
fn untracked(text: &str) -> Vec<(&'static str, Value)> {
    vec![
        (
            "/v1/completions",
            json!({"model": "gpt-x", "prompt": format!("complete: {text}")}),
        ),
        (
            "/v1/messages/batches",
            json!({"requests": [{"custom_id": "a", "params": {"model": "claude-x", "max_tokens": 5,
                "messages": [{"role": "user", "content": text}]}}]}),
        ),
        (
            "/v1beta/models/gemini-x:batchGenerateContent",
            json!({"batch": {"input_config": {"requests": {"requests": [{"request": {
                "contents": [{"role": "user", "parts": [{"text": text}]}]}}]}}}}),
        ),
        (
            "/v1/responses/compact",
            json!({"model": "gpt-x", "input": [{"role": "user", "content": text}]}),
        ),
        ("/v1/embeddings", json!({"model": "emb-x", "input": [text]})),
    ]
}

async fn post(proxy: &Harness, path: &str, keyed: bool, body: &Value) -> (u16, Value) {
    let key = if keyed { PROXY_KEY } else { "sk-client" };
    let got = proxy.post_as(path, key, body).await;
    (got.status.as_u16(), got.json())
}

async fn proxy(mock: &MockUpstream, keyed: bool) -> Harness {
    let keys = if keyed {
        format!(
            "[[auth.keys]]\nname = \"team\"\nsha256 = \"{}\"\n",
            sha256_hex(PROXY_KEY)
        )
    } else {
        String::new()
    };
    Harness::start(&mock.url(), &format!("{HOOKS}{keys}")).await
}

#[tokio::test]
async fn a_secret_on_an_untracked_generating_path_never_reaches_the_upstream() {
    for keyed in [false, true] {
        let mock = MockUpstream::with(|_| Reply::json(json!({"id": "x", "object": "ok"}))).await;
        let proxy = proxy(&mock, keyed).await;
        for (path, body) in untracked(&format!("my key is {KEY}")) {
            let (status, answer) = post(&proxy, path, keyed, &body).await;
            assert_eq!(status, 200, "{path} keyed={keyed}: {answer}");
            let sent = mock.requests().pop().unwrap();
            let sent = String::from_utf8_lossy(&sent.body).into_owned();
            assert!(!sent.contains(KEY), "{path} keyed={keyed} sent {sent}");
            assert!(sent.contains("[redacted:api_key:"), "{path}: {sent}");
        }
    }
}

#[tokio::test]
async fn a_deny_rule_refuses_an_untracked_generating_request_in_its_api_s_shape() {
    for keyed in [false, true] {
        let mock = MockUpstream::with(|_| Reply::json(json!({"id": "x"}))).await;
        let proxy = proxy(&mock, keyed).await;
        for (path, body) in untracked("the FORBIDDEN-PLAN") {
            let (status, answer) = post(&proxy, path, keyed, &body).await;
            assert_eq!(status, 403, "{path} keyed={keyed}: {answer}");
            let message = answer.pointer("/error/message").and_then(Value::as_str);
            assert!(
                message.is_some_and(|m| m.starts_with("no plans")),
                "{path}: {answer}"
            );
        }
        assert!(mock.requests().is_empty(), "nothing was sent");
    }
}

#[tokio::test]
async fn text_outside_a_tracked_request_s_messages_is_shown_to_the_hooks() {
    let mock = MockUpstream::with(|_| Reply::json(chat_completion("ok"))).await;
    let proxy = proxy(&mock, false).await;
    let body = json!({"model": "gpt-x",
        "messages": [{"role": "user", "content": "edit the file"}],
        "tools": [{"type": "function", "function": {"name": "deploy",
            "description": format!("deploys with {KEY}"), "parameters": {"type": "object"}}}],
        "prediction": {"type": "content", "content": format!("token = \"{KEY}\"")}});
    let (status, answer) = post(&proxy, "/v1/chat/completions", false, &body).await;
    assert_eq!(status, 200, "{answer}");
    let sent = mock.requests().pop().unwrap();
    let sent = String::from_utf8_lossy(&sent.body).into_owned();
    assert!(!sent.contains(KEY), "sent {sent}");
    assert_eq!(sent.matches("[redacted:api_key:").count(), 2, "{sent}");

    let mut refused = body.clone();
    refused["tools"][0]["function"]["description"] = json!("runs the FORBIDDEN-PLAN");
    let (status, answer) = post(&proxy, "/v1/chat/completions", false, &refused).await;
    assert_eq!(status, 403, "a rule reads tool descriptions: {answer}");
}

#[tokio::test]
async fn a_batch_over_an_uploaded_file_is_refused_by_a_closed_hook_and_passed_by_an_open_one() {
    let mock = MockUpstream::with(|_| Reply::json(json!({"id": "batch_1"}))).await;
    let from_file = json!({"input_file_id": "file-abc", "endpoint": "/v1/chat/completions",
        "completion_window": "24h"});
    // Hooks fail closed unless they say otherwise.
    let proxy = Harness::start(&mock.url(), HOOKS).await;
    let (status, answer) = post(&proxy, "/v1/batches", false, &from_file).await;
    assert_eq!(status, 403, "{answer}");
    assert!(mock.requests().is_empty());

    let open = HOOKS
        .replace("kind = \"redact\"", "kind = \"redact\"\nfailure = \"open\"")
        .replace("kind = \"deny\"", "kind = \"deny\"\nfailure = \"open\"");
    let proxy = Harness::start(&mock.url(), &open).await;
    let (status, answer) = post(&proxy, "/v1/batches", false, &from_file).await;
    assert_eq!(status, 200, "every hook fails open: {answer}");
    assert_eq!(mock.requests().len(), 1);
}
