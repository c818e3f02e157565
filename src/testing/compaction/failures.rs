//! A summary that fails (empty, cut at its length, a server error, reasoning only, or
//! past `summary_timeout`) is a failed attempt on the record, with its reason and the
//! usage it cost, and the chain's extract commits; on the in-process harness, time
//! paused, so the timeout passes at once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use mock_upstream::strict::SummaryMode;
use serde_json::{json, Value};

use super::{strict, user};
use crate::base::record::CompactionRecord;
use crate::testing::Harness;

/// The 4k model, summaries on the 16k one allowed 1 s each; a request waits for its
/// compaction's attempts to end, so the record it needed is committed when it is
/// answered.
const CONFIG: &str = "[models.\"strict\"]\ncontext_window = 4096\n[models.\"strict-16k\"]\ncontext_window = 16384\n[compaction]\nsummary_model = \"strict-16k\"\nsummary_timeout = \"1s\"\nmax_wait = \"60s\"\n";

/// Turns of about 500 tokens (each answered, a tool call with its `ok` included) until
/// conversation `id` has a committed compaction; its records.
async fn drive_until_compaction(proxy: &Harness, id: &str) -> Vec<CompactionRecord> {
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..20 {
        messages.push(user(n, 500));
        loop {
            let got = proxy.chat(id, "strict", &messages).await;
            assert_eq!(got.status, 200, "turn {n}: {}", got.text());
            let reply = got.json()["choices"][0]["message"].clone();
            let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
            messages.push(reply);
            match call {
                Some(call) => {
                    messages.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}))
                }
                None => break,
            }
        }
        let records = proxy.records(id).await;
        if !records.is_empty() {
            return records;
        }
    }
    panic!("{id}: no compaction in 20 turns");
}

#[tokio::test(start_paused = true)]
async fn summary_failures_fall_back_to_extract_and_record_every_attempt() {
    let cases = [
        (SummaryMode::Empty, "empty_summary", true),
        (SummaryMode::Length, "finish_reason", true),
        (SummaryMode::ServerError, "http_error", true),
        (SummaryMode::ReasoningOnly, "reasoning_only", true),
        (SummaryMode::Slow, "timeout", false),
    ];
    for (mode, reason, has_usage) in cases {
        let (strict, mock) = strict(Duration::ZERO).await;
        strict.set_summary_mode(mode);
        let proxy = Harness::start(&mock.url(), CONFIG).await;
        let records = drive_until_compaction(&proxy, "fails").await;
        let record = &records[0];
        assert_eq!(record.strategy, "extract", "{mode:?}: {record:?}");
        let attempts = &record.attempts;
        assert_eq!(attempts.len(), 2, "{mode:?}");
        assert_eq!(attempts[0].strategy, "summarize");
        assert_eq!(attempts[0].outcome, "failed");
        assert_eq!(attempts[0].reason.as_deref(), Some(reason), "{mode:?}");
        assert_eq!(
            attempts[0].usage.as_ref().is_some_and(Value::is_object),
            has_usage,
            "{mode:?}: usage of a discarded summary is kept"
        );
        assert_eq!(attempts[1].outcome, "ok");
        let handoff = record.handoff["content"].as_str().unwrap();
        assert!(
            handoff.contains("## User messages (verbatim, oldest first)\n- FACT-000 ")
                && !handoff.contains("user message(s) left out"),
            "extract keeps every user message, the oldest included: {record:?}"
        );
        assert!(strict.over_window.lock().unwrap().is_empty());
        let metrics = proxy.metrics().await;
        assert!(
            metrics.contains(&format!("reason=\"{reason}\"")),
            "{metrics}"
        );
    }
}
