//! What handoff leaves as it is, on the in-process harness: a chat body and its reply
//! byte for byte, other paths with their method, query and status, uploads streamed
//! past the chat body limit, and odd roles or broken pairs left to the provider until
//! a compaction needs the history whole. What needs the listener (hop-by-hop headers on
//! the wire, h2c, frame timing, signals) is in `tests/e2e/proxy.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use mock_upstream::{chat_completion, MockUpstream, Reply};
use serde_json::json;

use crate::testing::Harness;

const CHAT: &str = "/v1/chat/completions";

#[tokio::test]
async fn chat_body_and_reply_pass_through_unchanged() {
    let mock = MockUpstream::replying(Reply::chat_text("hello there")).await;
    let proxy = Harness::start(&mock.url(), "").await;
    let sent = json!({
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi", "x_unknown_message_field": [1, 2]}
        ],
        "x_unknown_top_field": {"keep": true}
    })
    .to_string();
    let got = proxy
        .post(
            CHAT,
            &[("authorization", "Bearer sk-test-123")],
            sent.as_bytes(),
        )
        .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json(), chat_completion("hello there"));
    let seen = mock.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].target, CHAT);
    assert_eq!(
        seen[0].body,
        sent.as_bytes(),
        "the body must reach the upstream byte for byte"
    );
}

#[tokio::test]
async fn other_paths_pass_through_with_method_query_and_status() {
    let mock = MockUpstream::with(|req| {
        if req.target.starts_with("/v1/models") {
            Reply::error(404, "model_not_found", "no such model")
        } else {
            Reply::json(json!({"len": req.body.len()}))
        }
    })
    .await;
    let proxy = Harness::start(&mock.url(), "[limits]\nmax_body_bytes = 1024\n").await;
    let models = Request::get(format!("{}/v1/models/x?limit=2&after=a", proxy.url()))
        .body(Full::default())
        .unwrap();
    let got = proxy.send(models).await;
    assert_eq!(got.status, 404);
    assert_eq!(got.json()["error"]["code"], "model_not_found");
    assert_eq!(mock.requests()[0].target, "/v1/models/x?limit=2&after=a");
    assert_eq!(mock.requests()[0].method, "GET");

    // Uploads are streamed, so the chat-completions body limit does not apply to them.
    let upload = Request::put(format!("{}/v1/files", proxy.url()))
        .body(Full::new(Bytes::from(vec![b'x'; 256 * 1024])))
        .unwrap();
    let got = proxy.send(upload).await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["len"], 256 * 1024);
}

#[tokio::test]
async fn unknown_roles_and_broken_pairs_are_the_providers_to_judge_until_handoff_must_compact() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let proxy = Harness::start(&mock.url(), "[models.\"tiny\"]\ncontext_window = 2000\n").await;

    // Nothing to compact: sent byte for byte, whatever handoff makes of it.
    let odd = json!({"model": "m", "messages": [
        {"role": "robot", "content": "x"},
        {"role": "user", "content": "x"},
        {"role": "system", "content": "mid-conversation"},
        {"role": "tool", "tool_call_id": "call_9", "content": "42"}
    ]});
    let got = proxy.post(CHAT, &[], odd.to_string().as_bytes()).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(mock.requests().len(), 1);
    assert_eq!(mock.requests()[0].json(), odd);

    // Over the window, the history must be compacted: a broken pair is named.
    let filler = "word ".repeat(3000);
    let orphan = json!({"model": "tiny", "messages": [
        {"role": "user", "content": filler},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": "x"},
        {"role": "tool", "tool_call_id": "call_9", "content": "42"}
    ]});
    let got = proxy.post(CHAT, &[], orphan.to_string().as_bytes()).await;
    assert_eq!(got.status, 400, "{}", got.text());
    assert_eq!(got.json()["error"]["code"], "invalid_tool_pairs");
    let message = got.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("call_9") && message.contains("messages[3]"),
        "{message}"
    );
    assert_eq!(mock.requests().len(), 1, "nothing more reached the model");
}
