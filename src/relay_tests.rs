//! The relay on the in-process harness: a stream passes frame for frame and ends only
//! once its reply is logged; a cut, or a stall past `read_timeout`, reaches the client
//! as a cut and is logged incomplete; what follows the end is drained, not relayed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use mock_upstream::{chat_stream_frames, MockUpstream, Reply};
use serde_json::json;

use crate::base::line::{Entry, MessageLine, Source};
use crate::testing::{Answer, Harness};

async fn stream(proxy: &Harness, id: &str) -> Answer {
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    proxy
        .post(
            "/v1/chat/completions",
            &[(crate::base::id::CONVERSATION_HEADER, id)],
            body.to_string().as_bytes(),
        )
        .await
}

/// The logged replies of conversation `id`.
async fn replies(proxy: &Harness, id: &str) -> Vec<MessageLine> {
    proxy
        .log(id)
        .await
        .lines
        .into_iter()
        .filter_map(|line| match line.entry {
            Entry::Message(message) if message.source == Source::Upstream => Some(message),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_stream_passes_whole_and_ends_only_once_its_reply_is_logged() {
    let mock = MockUpstream::replying(Reply::chat_stream(
        &["hel", "lo"],
        Duration::from_millis(50),
    ))
    .await;
    let proxy = Harness::start(&mock.url(), "").await;
    let answer = stream(&proxy, "whole").await;
    assert_eq!(answer.status, 200);
    assert!(answer.cut.is_none(), "{:?}", answer.cut);
    let expected: String = chat_stream_frames(&["hel", "lo"]).concat();
    assert_eq!(
        answer.text(),
        expected,
        "the client gets the upstream's bytes"
    );
    // Read right after the end: the reply was logged before the client saw it.
    let logged = replies(&proxy, "whole").await;
    assert_eq!(logged.len(), 1);
    assert!(logged[0].message.get().contains("hello"));
    assert!(logged[0].incomplete.is_none());
}

#[tokio::test(start_paused = true)]
async fn a_stream_the_upstream_cuts_is_a_cut_for_the_client_and_logged_incomplete() {
    let mock = MockUpstream::replying(
        Reply::chat_stream(&["a", "b", "c"], Duration::from_millis(10)).cut_at(3),
    )
    .await;
    let proxy = Harness::start(&mock.url(), "").await;
    let answer = stream(&proxy, "cut").await;
    assert!(
        answer.cut.is_some(),
        "the client must see a cut, not a clean end"
    );
    assert!(!answer.text().contains("[DONE]"));
    assert!(
        answer.text().contains("\"a\""),
        "what came before the cut was relayed"
    );
    let logged = replies(&proxy, "cut").await;
    assert_eq!(logged.len(), 1);
    assert_eq!(logged[0].incomplete.as_deref(), Some("upstream_cut"));
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_stalls_past_read_timeout_is_cut() {
    let mock =
        MockUpstream::replying(Reply::chat_stream(&["a", "b"], Duration::from_secs(120))).await;
    let proxy = Harness::start(&mock.url(), "[upstream]\nread_timeout = \"5s\"\n").await;
    let started = tokio::time::Instant::now();
    let answer = stream(&proxy, "stall").await;
    assert!(answer.cut.is_some());
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(5) && waited < Duration::from_secs(120),
        "{waited:?}"
    );
    let logged = replies(&proxy, "stall").await;
    assert_eq!(logged[0].incomplete.as_deref(), Some("timeout"));
}

#[tokio::test(start_paused = true)]
async fn what_follows_the_end_of_a_stream_is_drained_not_relayed() {
    let mut frames = chat_stream_frames(&["done"]);
    frames.push("data: {\"late\": true}\n\n".to_owned());
    let mock = MockUpstream::replying(Reply::Sse {
        frames: frames.clone(),
        gap: Duration::from_millis(10),
        cut_after: None,
    })
    .await;
    let proxy = Harness::start(&mock.url(), "").await;
    let answer = stream(&proxy, "drain").await;
    assert!(answer.cut.is_none());
    assert!(
        answer.text().ends_with("data: [DONE]\n\n"),
        "{}",
        answer.text()
    );
    assert!(!answer.text().contains("late"));
    assert_eq!(answer.text(), frames[..frames.len() - 1].concat());
}
