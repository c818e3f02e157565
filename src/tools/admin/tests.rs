//! The admin API on the in-process harness: who may call it, listing and reading
//! conversations, a manual compaction the next request adopts, and the metrics.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use http::Request;
use http_body_util::Full;
use mock_upstream::{MockUpstream, Reply};
use serde_json::json;

use crate::dialect::pair::CONTINUATION;
use crate::testing::{Answer, Harness};

async fn get(proxy: &Harness, path: &str, headers: &[(&str, &str)]) -> Answer {
    let mut request = Request::get(format!("{}{path}", proxy.url()));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    proxy.send(request.body(Full::default()).unwrap()).await
}

/// A conversation `id` of `turns` long user turns, each answered.
async fn converse(proxy: &Harness, id: &str, turns: usize) -> Vec<serde_json::Value> {
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..turns {
        messages.push(json!({"role": "user", "content": format!("turn {n}: FACT-{n:03} {}", "word ".repeat(150))}));
        let answer = proxy.chat(id, "m", &messages).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        messages.push(answer.json()["choices"][0]["message"].clone());
    }
    messages
}

#[tokio::test]
async fn the_admin_token_guards_everything_but_health() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Harness::start(&mock.url(), "[admin]\ntoken = \"adm-secret\"\n").await;
    let health = get(&proxy, "/handoff/health", &[]).await;
    assert_eq!(health.status, 200);
    assert_eq!(
        health.json(),
        json!({"status": "ok", "version": env!("CARGO_PKG_VERSION")})
    );
    let wrong = get(
        &proxy,
        "/handoff/conversations",
        &[("authorization", "Bearer nope")],
    )
    .await;
    assert_eq!(wrong.status, 403);
    let right = get(
        &proxy,
        "/handoff/config",
        &[("authorization", "Bearer adm-secret")],
    )
    .await;
    assert_eq!(right.status, 200, "{}", right.text());
    assert!(
        !right.text().contains("adm-secret"),
        "the config is shown masked"
    );
    // A browser page of another site may not act for the local user.
    let foreign = get(
        &proxy,
        "/handoff/conversations",
        &[("origin", "https://evil.example")],
    )
    .await;
    assert_eq!(foreign.status, 403);
}

#[tokio::test]
async fn conversations_are_listed_and_read_with_their_timeline() {
    let mock = MockUpstream::replying(Reply::chat_text("noted")).await;
    let proxy = Harness::start(&mock.url(), "").await;
    converse(&proxy, "listed-a", 2).await;
    converse(&proxy, "listed-b", 1).await;
    let list = get(&proxy, "/handoff/conversations?limit=1", &[]).await;
    assert_eq!(list.status, 200, "{}", list.text());
    let page = list.json();
    assert_eq!(page["data"].as_array().unwrap().len(), 1);
    assert_eq!(page["has_more"], true);
    let next = page["next_after"].as_str().unwrap().to_owned();
    let rest = get(&proxy, &format!("/handoff/conversations?after={next}"), &[]).await;
    let ids: Vec<String> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .chain(rest.json()["data"].as_array().unwrap())
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids, ["listed-a", "listed-b"]);
    let one = get(&proxy, "/handoff/conversations/listed-a", &[]).await;
    assert_eq!(one.status, 200, "{}", one.text());
    assert_eq!(one.json()["requests"], 2, "{}", one.text());
    let timeline = get(&proxy, "/handoff/conversations/listed-a/timeline", &[]).await;
    assert_eq!(timeline.status, 200, "{}", timeline.text());
    let missing = get(&proxy, "/handoff/conversations/never", &[]).await;
    assert_eq!(missing.status, 404);
}

#[tokio::test]
async fn a_manual_compaction_is_committed_and_the_next_request_adopts_it() {
    let mock = MockUpstream::replying(Reply::chat_text("noted")).await;
    let config = "[models.\"m\"]\ncontext_window = 100000\n[compaction]\nstrategy = \"extract\"\n";
    let proxy = Harness::start(&mock.url(), config).await;
    let mut messages = converse(&proxy, "manual", 6).await;
    let before = mock.requests().len();
    let compact = Request::post(format!(
        "{}/handoff/conversations/manual/compact",
        proxy.url()
    ))
    .body(Full::default())
    .unwrap();
    let answer = proxy.send(compact).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert_eq!(answer.json()["compaction"]["strategy"], "extract");
    assert_eq!(mock.requests().len(), before, "extract calls no model");
    assert_eq!(proxy.records("manual").await.len(), 1);
    messages.push(json!({"role": "user", "content": "and now?"}));
    let next = proxy.chat("manual", "m", &messages).await;
    assert_eq!(next.status, 200);
    let sent = mock.requests().last().unwrap().json();
    assert_eq!(
        sent["messages"][1]["content"], CONTINUATION,
        "the view starts with the pair"
    );
    let record = &proxy.records("manual").await[0];
    let covered = record.source.end_exclusive - record.source.start;
    assert!(covered >= 2, "{covered}");
    // The system message, the pair, then what the handoff does not cover.
    let sent = sent["messages"].as_array().unwrap();
    assert_eq!(sent.len(), 1 + 2 + (messages.len() - 1 - covered));
    assert_eq!(sent.last().unwrap(), messages.last().unwrap());
    let metrics = get(&proxy, "/handoff/metrics", &[]).await;
    assert!(
        metrics.text().contains("handoff_compactions_total"),
        "{}",
        metrics.text()
    );
}

#[tokio::test]
async fn any_request_is_served_as_the_client_sent_it() {
    let mock = MockUpstream::replying(Reply::chat_text("noted")).await;
    let proxy = Harness::start(&mock.url(), "").await;
    let messages = converse(&proxy, "as-sent", 3).await;
    let answer = get(&proxy, "/handoff/conversations/as-sent/requests/3", &[]).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    #[derive(serde::Deserialize)]
    struct AsSent {
        number: usize,
        requests: usize,
        messages: Vec<Box<serde_json::value::RawValue>>,
        reply: Vec<Box<serde_json::value::RawValue>>,
    }
    let got: AsSent = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!((got.number, got.requests), (3, 3));
    // The third request carried the system prompt, three turns and two replies as the
    // client wrote them; then the model's reply.
    let sent: Vec<String> = messages[..6].iter().map(|m| m.to_string()).collect();
    let served: Vec<&str> = got.messages.iter().map(|m| m.get()).collect();
    assert_eq!(served, sent);
    assert_eq!(got.reply.len(), 1);
    assert!(got.reply[0].get().contains("noted"));
    for (path, status) in [("0", 404), ("4", 404), ("x", 400)] {
        let wrong = get(
            &proxy,
            &format!("/handoff/conversations/as-sent/requests/{path}"),
            &[],
        )
        .await;
        assert_eq!(wrong.status, status, "{path}: {}", wrong.text());
    }
}
