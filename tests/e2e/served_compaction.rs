//! The APIs' own compaction served by the real binary where the upstream lacks it,
//! driven by the official SDKs: the same sessions as `native_compaction`, against
//! strict upstreams that refuse the asks as such servers do (an extra input, an
//! invalid value, a 404). With `native_compaction` left at `auto`, the upstream
//! refuses the first ask and handoff serves every one from then on: every turn is
//! answered, the items and blocks are well formed (the SDKs parse them), the model
//! reads the facts the session planted, and no ask or handle reaches it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use mock_upstream::anthropic::StrictAnthropic;
use mock_upstream::responses::StrictResponses;
use mock_upstream::{MockUpstream, Recorded};
use serde_json::Value;

use crate::native_compaction::{anthropic_run, openai_run, MESSAGES_WINDOW};
use crate::support::scenario::serve_strict;
use crate::support::Proxy;

const HANDLE: &str = "handoff-compaction.v1.";

/// What the model read last (its latest request that is no summary call): the share
/// of the `turns` facts the session planted that it holds.
fn facts_read(mock: &MockUpstream, turns: u32) -> f64 {
    let sent = mock.requests();
    let last = (sent.iter().rev())
        .find(|r| !mock_upstream::strict::is_summary(&r.json()))
        .unwrap();
    let read = String::from_utf8_lossy(&last.body);
    let held = (1..=turns)
        .filter(|turn| read.contains(&format!("FACT-{turn:03}")))
        .count();
    held as f64 / f64::from(turns)
}

/// Asserts what every served session keeps, and prints its row for BENCHMARKS.md:
/// every turn answered (the SDK ran to its end), the upstream refused only the first
/// ask, no ask or handle went upstream after it, ≥ 90% of the facts read, one
/// conversation whose record verifies.
fn served_session(
    row: &str,
    proxy: &Proxy,
    mock: &MockUpstream,
    (refused, summaries): (&[String], usize),
    ran: &Value,
    turns: u32,
) {
    assert_eq!(
        refused.len(),
        1,
        "{row}: refused once, then served: {refused:?}"
    );
    let compactions = ran["compactions"].as_u64().unwrap();
    let sent = mock.requests();
    let asked = |r: &&Recorded| {
        let body = String::from_utf8_lossy(&r.body).into_owned();
        body.contains("\"context_management\"") || r.target.ends_with("/compact")
    };
    assert_eq!(
        sent.iter().filter(asked).count(),
        1,
        "{row}: an ask went upstream after the refusal"
    );
    let handles = |r: &&Recorded| String::from_utf8_lossy(&r.body).contains(HANDLE);
    assert_eq!(
        sent.iter().filter(handles).count(),
        0,
        "{row}: a handle went upstream"
    );
    let share = facts_read(mock, turns);
    assert!(
        share >= 0.9,
        "{row}: the model read {share:.2} of the facts"
    );
    let listed = proxy.conversations();
    assert_eq!(listed.len(), 1, "{row}: one conversation: {listed:?}");
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    proxy.assert_verified(&[&id]);
    // The last request replays as the SDK sent it.
    let sent = ran["replay"].as_array().unwrap();
    let replayed = proxy.replay(&id, None);
    assert_eq!(&replayed[..sent.len()], sent.as_slice(), "{row}");
    println!(
        "SERVED-ROW | {row} | {} | {compactions} | {summaries} | 1 | {} | {:.0}% of the facts, replay exact |",
        ran["requests"],
        listed[0]["branches"],
        share * 100.0
    );
}

async fn openai_served(mode: &str, threshold: u64) {
    let strict = StrictResponses::new(8000);
    strict.set_native(false);
    let (mock, proxy, _data, ran) = openai_run(&strict, mode, threshold).await;
    assert!(ran["compactions"].as_u64().unwrap() >= 2, "{mode}: {ran}");
    let refused = strict.refused.lock().unwrap().clone();
    let summaries = strict.summaries.load(std::sync::atomic::Ordering::SeqCst);
    assert!(summaries >= 1, "{mode}: made by the strategy chain");
    served_session(
        &format!("openai SDK 3.57.0 (`{mode}`)"),
        &proxy,
        &mock,
        (&refused, summaries),
        &ran,
        12,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_compaction_is_served_where_the_upstream_has_none() {
    openai_served("context_management", 3000).await;
    openai_served("compact", 0).await;
}

async fn anthropic_served(mode: &str, turns: u32) {
    let strict = StrictAnthropic::new(MESSAGES_WINDOW);
    strict.set_native(false);
    let (mock, proxy, _data, ran) = anthropic_run(&strict, mode, turns).await;
    let refused = strict.refused.lock().unwrap().clone();
    let summaries = strict.summaries.load(std::sync::atomic::Ordering::SeqCst);
    if mode == "clear_thinking" {
        // Old thinking was taken out of what the model read: the latest turn's kept.
        let last = mock.requests().last().unwrap().json();
        let thinking = (last["messages"].as_array().unwrap().iter())
            .filter(|m| m["content"].to_string().contains("\"thinking\""))
            .count();
        assert!(
            thinking <= 1,
            "{mode}: {thinking} turns kept their thinking"
        );
    } else {
        assert!(ran["compactions"].as_u64().unwrap() >= 1, "{mode}: {ran}");
        assert!(summaries >= 1, "{mode}: made by the strategy chain");
        // Each block carries the handoff readable and the handle sealed.
        for block in ran["blocks"].as_array().unwrap() {
            assert!(
                block["encrypted_content"]
                    .as_str()
                    .unwrap()
                    .starts_with(HANDLE),
                "{block}"
            );
            assert!(
                block["content"].as_str().unwrap().contains("FACT-001"),
                "{block}"
            );
        }
    }
    served_session(
        &format!("anthropic SDK 2.14.0 (`{mode}`)"),
        &proxy,
        &mock,
        (&refused, summaries),
        &ran,
        turns,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_compaction_is_served_where_the_upstream_has_none() {
    anthropic_served("compact", 18).await;
    anthropic_served("compact_stream", 18).await;
    anthropic_served("compact_pause", 18).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn anthropic_sdk_thinking_edits_are_served_where_the_upstream_has_none() {
    anthropic_served("clear_thinking", 4).await;
}

/// A handle survives a restart of a proxy on its data dir: the secret that seals it is
/// kept there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_opens_after_a_restart() {
    use crate::support::handles::{go_on, mint, SERVED};
    let strict = StrictResponses::new(6000);
    strict.set_native(false);
    let mock = serve_strict(&strict, StrictResponses::answer).await;
    let data = tempfile::tempdir().unwrap();
    let options = || crate::support::ProxyOptions {
        extra_toml: SERVED.to_owned(),
        data_dir: Some(data.path().to_owned()),
        ..Default::default()
    };
    let proxy = Proxy::start_with(&mock.url(), options());
    let item = mint(&proxy).await;
    drop(proxy);
    let proxy = Proxy::start_with(&mock.url(), options());
    let got = go_on(&proxy, &item).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let input = mock.requests().last().unwrap().json()["input"].to_string();
    assert!(
        input.contains("FACT-000") && !input.contains(HANDLE),
        "{input}"
    );
    assert!(strict.refused.lock().unwrap().is_empty());
}
