//! Summaries that never give up, on the in-process harness: a history too long for one
//! summary request is folded into the handoff in several calls (parts at once and a
//! merge, or each call extending the running handoff), a failed call fails the fold
//! with every call's usage on the record, and a fold past `max_summary_calls` is
//! refused before any call, naming the count it needs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::Arc;

use mock_upstream::strict::{Strict, SummaryMode};
use mock_upstream::{AgentStyle, MockUpstream};

use crate::testing::{Answer, Harness};

/// The 16k model, which writes the summaries too.
const MODELS: &str = "[models.\"strict\"]\ncontext_window = 16384\n[models.\"strict-16k\"]\ncontext_window = 16384\n";

/// The strict provider, playing an agent that answers briefly after tool results and
/// writes handoffs of a realistic length (about 1k tokens).
async fn strict_agent(strict: Arc<Strict>) -> MockUpstream {
    strict.set_style(AgentStyle {
        brief_answers: true,
        ..Default::default()
    });
    strict.set_summary_padding(1100);
    MockUpstream::with(move |req| strict.answer(req)).await
}

/// Every `FACT-…` word in `text`.
fn facts_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("FACT-"))
        .map(str::to_owned)
        .collect()
}

/// About 60k tokens at once, to the 16k model, in conversation `id`.
async fn send_history(proxy: &Harness, id: &str) -> Answer {
    let answer = proxy
        .chat(id, "strict-16k", &crate::testing::long_history(60, 1000))
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer
}

#[tokio::test]
async fn a_history_four_windows_long_is_folded_by_a_same_window_summary_model() {
    fold_a_history_four_windows_long("", |inputs| {
        // The parts at once, each on its own, then one merge of their handoffs.
        let (merge, parts) = inputs.split_last().unwrap();
        assert!(
            merge.starts_with("<part_handoff part=\"1\""),
            "{}",
            &merge[..80]
        );
        assert_eq!(merge.matches("<part_handoff part=").count(), parts.len());
        for part in parts {
            assert!(part.starts_with("<history part="), "{}", &part[..80]);
        }
    })
    .await;
}

#[tokio::test]
async fn with_fold_concurrency_1_each_call_extends_the_running_handoff() {
    fold_a_history_four_windows_long("[compaction]\nfold_concurrency = 1\n", |inputs| {
        assert!(
            inputs.iter().all(|i| !i.contains("<part_handoff")),
            "no merge"
        );
        for text in &inputs[1..] {
            assert!(
                text.starts_with("<running_handoff>"),
                "each later call extends the handoff"
            );
        }
    })
    .await;
}

/// Sends about 60k tokens at once to a 16k model that also writes the summaries, with
/// `config`; every fact the summariser saw reaches the handoff, and `calls` checks the
/// summary requests' texts.
async fn fold_a_history_four_windows_long(config: &str, calls: impl Fn(&[String])) {
    let strict = Strict::new(16_384);
    let mock = strict_agent(Arc::clone(&strict)).await;
    let proxy = Harness::start(&mock.url(), &format!("{MODELS}{config}")).await;
    send_history(&proxy, "reconnect").await;

    let records = proxy.records("reconnect").await;
    assert_eq!(records.len(), 1, "{records:?}");
    let record = &records[0];
    assert_eq!(record.strategy, "summarize", "{record:?}");
    let attempt = &record.attempts[0];
    let made = attempt.calls.unwrap();
    assert!(made >= 4, "{attempt:?}");
    let inputs = strict.summary_inputs.lock().unwrap().clone();
    assert_eq!(inputs.len(), made as usize);
    assert_eq!(
        attempt.usage.as_ref().unwrap()["prompt_tokens"]
            .as_u64()
            .unwrap(),
        inputs.iter().map(|(_, tokens)| tokens).sum::<u64>(),
        "usage is the sum over the calls"
    );
    let handoff = record.handoff["content"].as_str().unwrap();
    // What the summariser was shown to summarise: the recent messages are reference only.
    let seen: BTreeSet<String> = inputs
        .iter()
        .flat_map(|(text, _)| facts_in(text.split("<retained_recent_messages").next().unwrap()))
        .collect();
    assert!(seen.len() >= 50, "the summariser saw {} facts", seen.len());
    let kept = facts_in(handoff);
    let lost: Vec<_> = seen.difference(&kept).collect();
    assert!(lost.is_empty(), "facts lost in the fold: {lost:?}");
    let texts: Vec<String> = inputs.iter().map(|(text, _)| text.clone()).collect();
    calls(&texts);
    assert!(
        strict.over_window.lock().unwrap().is_empty(),
        "no request overflowed"
    );
    let verified = proxy
        .audit("reconnect", |audit, id, tenant, out| {
            audit.verify(Some(id), Some(tenant), out)
        })
        .await;
    assert!(!verified.contains("problem"), "{verified}");
}

#[tokio::test]
async fn a_failed_call_fails_the_fold_and_extract_takes_over_with_the_calls_recorded() {
    let strict = Strict::new(16_384);
    strict.set_summary_mode(SummaryMode::FailCall(2));
    let mock = strict_agent(Arc::clone(&strict)).await;
    let proxy = Harness::start(&mock.url(), MODELS).await;
    send_history(&proxy, "bad-call").await;

    let record = &proxy.records("bad-call").await[0];
    assert_eq!(record.strategy, "extract", "{record:?}");
    let attempt = &record.attempts[0];
    assert_eq!(attempt.strategy, "summarize");
    assert_eq!(attempt.outcome, "failed");
    assert_eq!(attempt.reason.as_deref(), Some("http_error"));
    // The parts run at once: the round with the failed call ends, and no merge follows.
    let inputs = strict.summary_inputs.lock().unwrap().clone();
    assert_eq!(attempt.calls.unwrap() as usize, inputs.len(), "{attempt:?}");
    assert!(inputs.len() >= 2, "{attempt:?}");
    assert!(
        inputs
            .iter()
            .all(|(text, _)| !text.contains("<part_handoff")),
        "no merge after the failed call"
    );
    assert_eq!(
        attempt.usage.as_ref().unwrap()["prompt_tokens"]
            .as_u64()
            .unwrap(),
        inputs.iter().map(|(_, tokens)| tokens).sum::<u64>(),
        "the usage of every call, the failed one included"
    );
}

#[tokio::test]
async fn a_fold_past_max_summary_calls_fails_with_the_count_needed() {
    let strict = Strict::new(16_384);
    let mock = strict_agent(Arc::clone(&strict)).await;
    let config = format!("{MODELS}[compaction]\nmax_summary_calls = 2\n");
    let proxy = Harness::start(&mock.url(), &config).await;
    send_history(&proxy, "too-many").await;

    let record = &proxy.records("too-many").await[0];
    let attempt = &record.attempts[0];
    assert_eq!(
        attempt.reason.as_deref(),
        Some("precheck_failed"),
        "{attempt:?}"
    );
    let error = attempt.error.as_deref().unwrap();
    let needed: u32 = error
        .split("needs ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {error:?}"));
    assert!(needed > 2, "{error}");
    assert!(error.contains("max_summary_calls allows 2"), "{error}");
    assert_eq!(
        strict.summary_inputs.lock().unwrap().len(),
        0,
        "no call was made"
    );
    assert_eq!(record.strategy, "extract");
}
