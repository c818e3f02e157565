//! The tracked route's phases on the in-process harness: reading and checking the body,
//! naming the conversation, logging before sending, and the upstream failing. Each
//! bad input gets the API's own error shape, and nothing the client sent is lost.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use mock_upstream::{MockUpstream, Reply};
use serde_json::json;

use crate::base::id::CONVERSATION_HEADER;
use crate::base::line::{Entry, Source};
use crate::testing::Harness;

const CHAT: &str = "/v1/chat/completions";

fn turn(text: &str) -> Vec<u8> {
    json!({"model": "m", "messages": [{"role": "user", "content": text}]})
        .to_string()
        .into_bytes()
}

#[tokio::test]
async fn bad_bodies_get_each_api_s_error_shape_and_never_go_upstream() {
    let mock = MockUpstream::replying(Reply::chat_text("unused")).await;
    let proxy = Harness::start(&mock.url(), "[limits]\nmax_body_bytes = 2000\n").await;
    let malformed = proxy
        .post(CHAT, &[], b"{\"model\": \"m\",\n \"messages\": [}")
        .await;
    assert_eq!(malformed.status, 400);
    let error = &malformed.json()["error"];
    assert_eq!(error["type"], "invalid_request_error");
    assert_eq!(error["code"], "invalid_json");
    assert!(
        error["message"].as_str().unwrap().contains("line 2 column"),
        "{error}"
    );
    let anthropic = proxy.post("/v1/messages", &[], b"{\"messages\": [").await;
    assert_eq!(anthropic.status, 400);
    assert_eq!(anthropic.json()["type"], "error");
    assert_eq!(anthropic.json()["error"]["type"], "invalid_request_error");
    let shape = proxy
        .post(CHAT, &[], br#"{"model": "m", "messages": "hello"}"#)
        .await;
    assert_eq!(shape.status, 400, "{}", shape.text());
    let huge = turn(&"x".repeat(5000));
    let huge = proxy.post(CHAT, &[], &huge).await;
    assert_eq!(huge.status, 413);
    assert_eq!(huge.json()["error"]["code"], "request_too_large");
    assert!(
        huge.text().contains("2000"),
        "the limit is named: {}",
        huge.text()
    );
    assert!(mock.requests().is_empty(), "nothing bad went upstream");
}

#[tokio::test]
async fn broken_tool_pairs_pass_until_a_compaction_needs_them_whole_then_are_refused_clearly() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Harness::start(&mock.url(), "[models.\"m\"]\ncontext_window = 1000\n").await;
    let orphan = |text: &str| {
        json!({"model": "m", "messages": [
            {"role": "user", "content": text},
            {"role": "tool", "tool_call_id": "nope", "content": "r"},
            {"role": "user", "content": "and?"}]})
        .to_string()
    };
    // Short: the provider decides, and handoff passes it on untouched.
    let short = proxy
        .post(
            CHAT,
            &[(CONVERSATION_HEADER, "pairs")],
            orphan("q").as_bytes(),
        )
        .await;
    assert_eq!(short.status, 200, "{}", short.text());
    // Over the trigger: no valid handoff can be cut from it, and the client is told why.
    let long = proxy
        .post(
            CHAT,
            &[(CONVERSATION_HEADER, "pairs-long")],
            orphan(&"word ".repeat(2000)).as_bytes(),
        )
        .await;
    assert_eq!(long.status, 400, "{}", long.text());
    assert!(long.text().contains("nope"), "{}", long.text());
    assert_eq!(
        mock.requests().len(),
        1,
        "the refused request never went upstream"
    );
    let kept =
        proxy.log("pairs-long").await.lines.iter().any(
            |line| matches!(&line.entry, Entry::Message(m) if m.message.get().contains("nope")),
        );
    assert!(kept, "what the client sent is logged all the same");
}

#[tokio::test]
async fn an_invalid_conversation_id_is_refused_and_a_valid_one_names_the_conversation() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Harness::start(&mock.url(), "").await;
    let invalid = proxy
        .post(CHAT, &[(CONVERSATION_HEADER, "../etc")], &turn("hi"))
        .await;
    assert_eq!(invalid.status, 400);
    assert_eq!(invalid.json()["error"]["code"], "invalid_conversation_id");
    let named = proxy
        .post(CHAT, &[(CONVERSATION_HEADER, "mine-1")], &turn("hi"))
        .await;
    assert_eq!(named.status, 200);
    let log = proxy.log("mine-1").await;
    let sources: Vec<Source> = log
        .lines
        .iter()
        .filter_map(|line| match &line.entry {
            Entry::Message(m) => Some(m.source),
            _ => None,
        })
        .collect();
    assert_eq!(sources, [Source::Client, Source::Upstream]);
}

#[tokio::test]
async fn an_upstream_that_is_down_is_a_502_and_the_request_is_still_logged() {
    let proxy = Harness::start("http://127.0.0.1:1", "").await;
    let answer = proxy
        .post(CHAT, &[(CONVERSATION_HEADER, "down")], &turn("keep me"))
        .await;
    assert_eq!(answer.status, 502);
    assert_eq!(answer.json()["error"]["code"], "upstream_unreachable");
    assert!(answer.text().contains("unreachable"), "{}", answer.text());
    let log = proxy.log("down").await;
    let kept = log.lines.iter().any(|line| {
        matches!(&line.entry, Entry::Message(m) if m.source == Source::Client && m.message.get().contains("keep me"))
    });
    assert!(
        kept,
        "the client's message is logged before it goes upstream"
    );
}

#[tokio::test(start_paused = true)]
async fn an_upstream_slower_than_read_timeout_is_a_504() {
    let mock =
        MockUpstream::replying(Reply::chat_text("late").delayed(Duration::from_secs(60))).await;
    let proxy = Harness::start(&mock.url(), "[upstream]\nread_timeout = \"5s\"\n").await;
    let started = tokio::time::Instant::now();
    let answer = proxy.post(CHAT, &[], &turn("hi")).await;
    assert_eq!(answer.status, 504, "{}", answer.text());
    assert_eq!(answer.json()["error"]["code"], "upstream_timeout");
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test]
async fn each_credential_s_conversations_are_its_tenant_s() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Harness::start(&mock.url(), "").await;
    for key in ["Bearer sk-one", "Bearer sk-two"] {
        let answer = proxy
            .post(
                CHAT,
                &[(CONVERSATION_HEADER, "same-name"), ("authorization", key)],
                &turn("hi"),
            )
            .await;
        assert_eq!(answer.status, 200);
    }
    let ids = proxy
        .state
        .tracker
        .store()
        .list(None, None, 10)
        .await
        .unwrap();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert_ne!(ids[0].tenant(), ids[1].tenant());
    // The client's credential went upstream as it was sent.
    let seen: Vec<String> = mock
        .requests()
        .iter()
        .map(|r| r.headers["authorization"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(seen, ["Bearer sk-one", "Bearer sk-two"]);
}

#[tokio::test]
async fn a_reply_being_logged_when_the_client_leaves_is_still_logged() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Harness::start(&mock.url(), "").await;
    assert_eq!(
        proxy
            .chat("left", "m", &[json!({"role": "user", "content": "hi"})])
            .await
            .status,
        200
    );
    let id = proxy.conversation("left").await.unwrap();
    let parent = proxy
        .log("left")
        .await
        .lines
        .iter()
        .rev()
        .find_map(|line| match &line.entry {
            Entry::Message(message) => Some(message.digest),
            _ => None,
        });
    let target = crate::capture::ReplyTarget {
        trace: opentelemetry::Context::new(),
        tracker: std::sync::Arc::clone(&proxy.state.tracker),
        id: id.clone(),
        parent,
        model: "m".into(),
        dialect: crate::dialect::DialectKind::OpenAiChat,
        estimate: None,
        required: true,
        conversation: None,
        metrics: std::sync::Arc::clone(&proxy.state.metrics),
        price: None,
        references: None,
        decision: None,
        after: None,
        prepend: None,
    };
    let reply = json!({"choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": "again"}}]})
    .to_string();
    let replies = || async {
        let log = proxy.log("left").await;
        log.lines
            .into_iter()
            .filter(|line| matches!(&line.entry, Entry::Message(m) if m.source == Source::Upstream))
            .count()
    };
    assert_eq!(replies().await, 1);

    // The log write waits for the conversation, which the test holds; the client's
    // request is dropped meanwhile, as hyper drops it when the client closes.
    let entry = proxy.state.tracker.entry(&id).await.unwrap();
    let held = entry.lock().await;
    let head = http::Response::new(()).into_parts().0;
    let answering = tokio::spawn(super::reply::answer_read(head, reply.into(), target, None));
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!answering.is_finished(), "the answer waited for the log");
    answering.abort();
    assert!(answering.await.unwrap_err().is_cancelled());
    assert_eq!(replies().await, 1, "nothing logged while the state is held");
    drop(held);
    for _ in 0..100 {
        if replies().await == 2 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("the reply whose client left was never logged");
}

#[tokio::test]
async fn a_reference_is_estimated_at_the_size_of_the_item_it_names() {
    use crate::base::digest::message_digest;
    use crate::dialect::{DialectKind, Message, RawMessage, Role};
    let reasoning = json!({"type": "reasoning", "id": "rs_big_7f3a", "summary": [],
        "encrypted_content": "opaque ".repeat(2_000)});
    let message = json!({"type": "message", "id": "msg_7f3a", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "ok", "annotations": []}]});
    let mock = MockUpstream::replying(Reply::json(json!({"id": "resp_7f3a", "object": "response",
        "status": "completed", "model": "m", "output": [reasoning, message],
        "usage": {"input_tokens": 5, "output_tokens": 9, "total_tokens": 14}})))
    .await;
    let proxy = Harness::start(&mock.url(), "").await;
    let answer = proxy
        .post(
            "/v1/responses",
            &[("authorization", "Bearer sk-test")],
            br#"{"model":"m","input":"hi"}"#,
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let tokenizer = crate::config::Tokenizer::default();
    let digest = |id: &str| message_digest(&json!({"type": "item_reference", "id": id}));
    // Counted off the request path: wait for it.
    let mut counted = None;
    for _ in 0..200 {
        counted = proxy.state.tokens.cached(tokenizer, &digest("rs_big_7f3a"));
        if counted.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let item = proxy.state.tokens.count_message(
        tokenizer,
        &message_digest(&json!("the item")),
        &json!({"type": "reasoning", "id": "rs_big_7f3a", "summary": [], "encrypted_content": "opaque ".repeat(2_000)}),
    );
    assert_eq!(counted, Some(item), "the reference counts as the item");
    // In another byte form too; a reference to an item never seen counts as itself.
    let read = |raw: &str| {
        Message::read(
            RawMessage::from(raw.to_owned()),
            DialectKind::Responses,
            |_| Ok(Role::Assistant),
        )
        .unwrap()
        .token_count(&proxy.state.tokens, tokenizer)
    };
    assert_eq!(
        read(r#"{"id": "rs_big_7f3a", "type": "item_reference"}"#),
        item
    );
    assert!(read(r#"{"type":"item_reference","id":"rs_never_7f3a"}"#) < 50);
}
