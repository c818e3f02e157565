//! Anthropic's Messages API on the in-process harness, against a strict Messages
//! provider: an overflow answer or an overflow event opening a stream is compacted and
//! retried, handoff's own errors come in Anthropic's shape, and
//! `[dialects.anthropic] base_url` routes Messages to their own upstream. The SDK
//! agents and restarts are in `tests/e2e/anthropic.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use mock_upstream::anthropic::StrictAnthropic;
use mock_upstream::{MockUpstream, Recorded};
use serde_json::{json, Value};

use crate::base::line::{Entry, Source};
use crate::compaction::Reason;
use crate::testing::{fact_history, Harness};

const MESSAGES: &str = "/v1/messages";
const COUNT_TOKENS: &str = "/v1/messages/count_tokens";

/// The model `claude-mock` with a `window`-token window counted as bytes/4.
fn model(window: u64) -> String {
    format!("[models.\"claude-mock\"]\ncontext_window = {window}\ntokenizer = \"estimate\"\n")
}

/// That model, compacted inline (nothing prepared in the background).
fn inline(window: u64) -> String {
    format!("{}[compaction]\nprepare_at = 0\n", model(window))
}

async fn strict_anthropic(window: u64) -> (Arc<StrictAnthropic>, MockUpstream) {
    let strict = StrictAnthropic::new(window);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |req| responder.answer(req)).await;
    (strict, mock)
}

fn is_summary(request: &Recorded) -> bool {
    mock_upstream::strict::is_summary(&request.json())
}

#[tokio::test]
async fn an_overflow_answer_is_compacted_and_retried_and_errors_use_anthropics_shape() {
    // The provider's window is smaller than the configured one: only its refusal can
    // tell handoff that the request is too long.
    let (strict, mock) = strict_anthropic(3000).await;
    let proxy = Harness::start(&mock.url(), &inline(6000)).await;
    let messages =
        fact_history(json!({"role": "assistant", "content": [{"type": "text", "text": "noted"}]}));
    let headers = [
        ("x-api-key", "sk-ant-overflow"),
        ("anthropic-version", "2023-06-01"),
        ("x-handoff-conversation-id", "overflow"),
    ];
    let body = json!({"model": "claude-mock", "max_tokens": 100, "messages": messages});
    let got = proxy
        .post(MESSAGES, &headers, body.to_string().as_bytes())
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(strict.refused.lock().unwrap()[0].contains("prompt is too long"));
    let records = proxy.records("overflow").await;
    assert_eq!(records[0].reason, Reason::ContextLengthExceeded);

    // handoff's own errors on this path are in Anthropic's shape.
    for (bad, kind) in [
        ("{\"messages\": [", "invalid_request_error"),
        (
            r#"{"model":"claude-mock","messages":[{"role":"tool","content":"x"}]}"#,
            "invalid_request_error",
        ),
        (
            r#"{"model":"claude-mock","messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_x","content":"1"}]}]}"#,
            "invalid_request_error",
        ),
    ] {
        let got = proxy.post(MESSAGES, &headers, bad.as_bytes()).await;
        assert_eq!(got.status, 400, "{bad}");
        let json: Value = serde_json::from_str(&got.text()).unwrap();
        assert_eq!(json["type"], "error", "{json}");
        assert_eq!(json["error"]["type"], kind, "{json}");
        assert!(json["error"]["message"].as_str().unwrap().len() > 10);
    }

    // count_tokens passes through untouched.
    let count = json!({"model": "claude-mock", "messages": [{"role": "user", "content": "hi"}]});
    let before = mock.requests().len();
    let _ = proxy
        .post(COUNT_TOKENS, &headers, count.to_string().as_bytes())
        .await;
    let seen = mock.requests();
    assert_eq!(seen.len(), before + 1);
    assert_eq!(seen[before].target, "/v1/messages/count_tokens");
    assert_eq!(seen[before].json(), count);
}

#[tokio::test]
async fn an_overflow_event_opening_a_stream_is_compacted_and_retried() {
    // Like a provider that only learns the length once streaming: the stream opens
    // with `message_start` and then an `error` event.
    let strict = StrictAnthropic::new(3000);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |req| {
        let body = req.json();
        let input = mock_upstream::anthropic::count(&body);
        if body["stream"] == true && input > 3000 && !is_summary(req) {
            let start = json!({"type": "message_start", "message": {"id": "msg_x", "type": "message", "role": "assistant",
                "content": [], "model": "claude-mock", "stop_reason": null, "usage": {"input_tokens": 0, "output_tokens": 0}}});
            let error = json!({"type": "error", "error": {"type": "invalid_request_error",
                "message": format!("prompt is too long: {input} tokens > 3000 maximum")}});
            return mock_upstream::Reply::Sse {
                frames: vec![
                    format!("event: message_start\ndata: {start}\n\n"),
                    format!("event: error\ndata: {error}\n\n"),
                ],
                gap: std::time::Duration::from_millis(5),
                cut_after: None,
            };
        }
        responder.answer(req)
    })
    .await;
    let proxy = Harness::start(&mock.url(), &inline(6000)).await;
    let messages = fact_history(json!({"role": "assistant", "content": "noted"}));
    let body =
        json!({"model": "claude-mock", "max_tokens": 100, "stream": true, "messages": messages});
    let headers = [
        ("x-api-key", "sk-ant-stream"),
        ("x-handoff-conversation-id", "stream-overflow"),
    ];
    let got = proxy
        .post(MESSAGES, &headers, body.to_string().as_bytes())
        .await;
    assert_eq!(got.status, 200);
    let text = got.text();
    assert!(text.contains("event: message_stop"), "{text}");
    assert!(
        !text.contains("event: error"),
        "the client saw the refused attempt: {text}"
    );
    let records = proxy.records("stream-overflow").await;
    assert_eq!(records[0].reason, Reason::ContextLengthExceeded);
    // The reply of the retried stream is logged.
    let log = proxy.log("stream-overflow").await;
    let reply = log
        .lines
        .iter()
        .rev()
        .find_map(|line| match &line.entry {
            Entry::Message(message) => Some(message),
            _ => None,
        })
        .unwrap();
    assert_eq!(reply.source, Source::Upstream);
    assert_eq!(reply.complete, Some(true));
}

#[tokio::test]
async fn dialects_anthropic_base_url_routes_messages_to_their_own_upstream() {
    let (_strict, anthropic) = strict_anthropic(100_000).await;
    let openai = MockUpstream::with(|_| mock_upstream::Reply::chat_text("from openai")).await;
    let routed = format!(
        "{}[dialects.anthropic]\nbase_url = {:?}\n",
        model(100_000),
        anthropic.url()
    );
    let proxy = Harness::start(&openai.url(), &routed).await;
    let headers = [("x-api-key", "sk-ant-route")];
    let body = json!({"model": "claude-mock", "max_tokens": 50, "messages": [{"role": "user", "content": "hi"}]});
    let got = proxy
        .post(MESSAGES, &headers, body.to_string().as_bytes())
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let count = json!({"model": "claude-mock", "messages": [{"role": "user", "content": "hi"}]});
    let _ = proxy
        .post(COUNT_TOKENS, &headers, count.to_string().as_bytes())
        .await;
    let chat = json!({"model": "gpt-x", "messages": [{"role": "user", "content": "hi"}]});
    let got = proxy
        .post(
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-route")],
            chat.to_string().as_bytes(),
        )
        .await;
    assert_eq!(got.status, 200);
    let to_anthropic: Vec<String> = anthropic
        .requests()
        .iter()
        .map(|r| r.target.clone())
        .collect();
    assert_eq!(to_anthropic, ["/v1/messages", "/v1/messages/count_tokens"]);
    let to_openai: Vec<String> = openai.requests().iter().map(|r| r.target.clone()).collect();
    assert_eq!(to_openai, ["/v1/chat/completions"]);
}
