//! Compaction at its edges, on the in-process harness against the strict provider: a
//! crowd of requests over the trigger, a request no view can fit, compaction switched
//! off, and a provider whose window is smaller than handoff was told.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};

use super::{strict, user};
use crate::compaction::Reason;
use crate::testing::Harness;

/// Summaries on the 16k model, each given a second.
const SUMMARY_16K_1S: &str =
    "[compaction]\nsummary_model = \"strict-16k\"\nsummary_timeout = \"1s\"\nmax_wait = \"60s\"\n";

/// The strict model with a `window`-token window (the 16k one beside it), and `extra`.
fn config(window: u64, extra: &str) -> String {
    format!("[models.\"strict\"]\ncontext_window = {window}\n[models.\"strict-16k\"]\ncontext_window = 16384\n{extra}\n")
}

#[tokio::test]
async fn thirty_two_concurrent_requests_share_one_compaction() {
    let (strict, mock) = strict(Duration::ZERO).await;
    let proxy = Arc::new(Harness::start(&mock.url(), &config(4096, SUMMARY_16K_1S)).await);
    // A history just over the trigger (3318 tokens for a 4k window).
    let mut messages = vec![json!({"role": "system", "content": "s"})];
    for n in 0..6 {
        messages.push(user(n, 500));
        messages.push(json!({"role": "assistant", "content": "noted"}));
    }
    messages.push(user(99, 500));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let proxy = Arc::clone(&proxy);
        let messages = messages.clone();
        tasks.push(tokio::spawn(async move {
            proxy.chat("crowd", "strict", &messages).await.status
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap(), 200);
    }
    // Their views fit the input budget, so they were sent while the compaction they
    // started runs on: it lands once.
    let mut records = proxy.records("crowd").await;
    for _ in 0..100 {
        if !records.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        records = proxy.records("crowd").await;
    }
    assert_eq!(records.len(), 1);
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        1,
        "one summary call for one compaction"
    );
}

#[tokio::test]
async fn an_irreducible_request_gets_400_with_the_numbers() {
    let (_strict, mock) = strict(Duration::ZERO).await;
    let proxy = Harness::start(&mock.url(), &config(4096, "")).await;
    // About 400 KB of new text: tokenised off the async path.
    let got = proxy.chat("huge", "strict", &[user(1, 120_000)]).await;
    assert_eq!(got.status, 400);
    assert_eq!(got.json()["error"]["code"], "context_length_exceeded");
    let message = got.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("newest unit")
            && message.contains("4096 window")
            && message.contains("input budget")
            && message.contains("trigger"),
        "{message}"
    );
    assert!(
        mock.requests().is_empty(),
        "nothing over the window goes upstream"
    );
}

#[tokio::test]
async fn disabled_compaction_is_respected_by_every_path() {
    let (strict, mock) = strict(Duration::ZERO).await;
    let proxy = Harness::start(
        &mock.url(),
        &config(4096, "[compaction]\nenabled = false\n"),
    )
    .await;
    let messages = vec![
        user(1, 3000),
        json!({"role": "assistant", "content": "ok"}),
        user(2, 3000),
    ];
    let got = proxy.chat("off", "strict", &messages).await;
    assert_eq!(got.status, 400, "the upstream's own error comes back");
    assert_eq!(got.json()["error"]["code"], "context_length_exceeded");
    assert_eq!(
        strict.over_window.lock().unwrap().len(),
        1,
        "no reactive retry either"
    );
    assert_eq!(strict.summaries.load(Ordering::SeqCst), 0);
    assert!(proxy.records("off").await.is_empty());
}

#[tokio::test]
async fn a_context_length_answer_compacts_and_retries() {
    // handoff believes the window is 16k; the provider enforces 4k.
    let (strict, mock) = strict(Duration::ZERO).await;
    let proxy = Harness::start(&mock.url(), &config(16_384, SUMMARY_16K_1S)).await;
    let mut messages: Vec<Value> = vec![];
    for n in 0..9 {
        messages.push(user(n, 500));
        messages.push(json!({"role": "assistant", "content": "noted"}));
    }
    messages.push(user(9, 500));
    let got = proxy.chat("reactive", "strict", &messages).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let refused = strict.over_window.lock().unwrap().len();
    assert!(
        (1..=2).contains(&refused),
        "refused {refused} times; max_retries is 2"
    );
    let records = proxy.records("reactive").await;
    assert_eq!(records.len(), refused, "one compaction per refusal");
    assert!(records
        .iter()
        .all(|r| r.reason == Reason::ContextLengthExceeded));
}
