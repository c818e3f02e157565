//! OpenAI's Responses API on the in-process harness, against a strict Responses
//! provider: every way it says a request is too long (a status, an error event, a
//! failed response, streamed or not) is compacted and retried. The SDK agents, chains
//! and restarts are in `tests/e2e/responses.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use mock_upstream::responses::{OverflowStyle, StrictResponses};
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

use crate::base::line::{Entry, Source};
use crate::compaction::Reason;
use crate::testing::{fact_history, Harness};

/// `gpt-mock` with a `window`-token window counted as bytes/4, compacted inline.
fn inline(window: u64) -> String {
    format!("[models.\"gpt-mock\"]\ncontext_window = {window}\ntokenizer = \"estimate\"\n[compaction]\nprepare_at = 0\n")
}

async fn strict_responses(window: u64) -> (Arc<StrictResponses>, MockUpstream) {
    let strict = StrictResponses::new(window);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |req| responder.answer(req)).await;
    (strict, mock)
}

#[tokio::test]
async fn each_overflow_style_is_compacted_and_retried() {
    let input = fact_history(
        json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "noted", "annotations": []}]}),
    );
    for (style, stream) in [
        (OverflowStyle::Status, false),
        (OverflowStyle::StreamError, true),
        (OverflowStyle::Failed, true),
        (OverflowStyle::Failed, false),
    ] {
        let (strict, mock) = strict_responses(3000).await;
        strict.set_style(style);
        let proxy = Harness::start(&mock.url(), &inline(6000)).await;
        let body = json!({"model": "gpt-mock", "input": input, "stream": stream, "store": false});
        let headers = [
            ("authorization", "Bearer sk-overflow"),
            ("x-handoff-conversation-id", "overflow"),
        ];
        let got = proxy
            .post("/v1/responses", &headers, body.to_string().as_bytes())
            .await;
        let text = got.text();
        assert_eq!(got.status, 200, "{style:?}: {text}");
        if stream {
            assert!(
                text.contains("event: response.completed"),
                "{style:?}: {text}"
            );
            assert!(
                !text.contains("context_length_exceeded"),
                "{style:?}: {text}"
            );
        } else {
            let json: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(json["status"], "completed", "{style:?}: {json}");
        }
        assert!(
            !strict.refused.lock().unwrap().is_empty(),
            "{style:?}: never refused"
        );
        let records = proxy.records("overflow").await;
        assert_eq!(
            records[0].reason,
            Reason::ContextLengthExceeded,
            "{style:?}"
        );
        let log = proxy.log("overflow").await;
        let last = log.lines.iter().rev().find_map(|line| match &line.entry {
            Entry::Message(message) => Some(message.source),
            _ => None,
        });
        assert_eq!(last, Some(Source::Upstream), "{style:?}: reply not logged");
    }
}
