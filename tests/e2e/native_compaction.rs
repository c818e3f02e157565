//! The providers' own compaction through the real binary, driven by the official
//! SDKs against strict providers that compact as their APIs document: the session
//! stays one conversation on at most two branches, handoff never compacts what the
//! provider keeps under the window, and the record replays what the SDK sent.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::support::scenario::{estimate_model, records, run_client, serve_strict};
use crate::support::Proxy;
use mock_upstream::anthropic::StrictAnthropic;
use mock_upstream::responses::StrictResponses;
use mock_upstream::MockUpstream;
use serde_json::Value;

const WINDOW: u64 = 8000;

/// Asserts what every session of `mode` keeps: one conversation, at most two branches,
/// no compaction of handoff's, the last request (`ran["replay"]`) and each before it
/// (`ran["sent"]`) replayed as sent, `audit verify` clean. Its branches, its replay, and what `audit show` prints.
fn one_session(proxy: &Proxy, mode: &str, ran: &Value) -> (u64, Vec<Value>, String) {
    let listed = proxy.conversations();
    assert_eq!(listed.len(), 1, "{mode}: one conversation: {listed:?}");
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    let branches = listed[0]["branches"].as_u64().unwrap();
    assert!(branches <= 2, "{mode}: {}", listed[0]);
    assert!(records(proxy, &id).is_empty(), "{mode}: handoff compacted");
    // The last request replays as the SDK sent it, its reply after it.
    let sent = ran["replay"].as_array().unwrap();
    let replayed = proxy.replay(&id, None);
    assert!(replayed.len() > sent.len(), "{mode}");
    assert_eq!(&replayed[..sent.len()], sent.as_slice(), "{mode}");
    // And so does each request before it.
    for (number, input) in ran["sent"].as_array().unwrap().iter().enumerate() {
        let number = (number + 1).to_string();
        let out = proxy.audit(&["replay", &id, "--request", &number]);
        let replayed: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
        let input = input.as_array().unwrap();
        assert_eq!(
            &replayed[..input.len()],
            input.as_slice(),
            "{mode}: request {number}"
        );
    }
    proxy.assert_verified(&[&id]);
    let shown = proxy.audit(&["show", &id]);
    let shown = String::from_utf8_lossy(&shown.stdout).into_owned();
    (branches, replayed, shown)
}

/// The openai SDK's session in `mode` (`context_management` past `threshold`, or
/// `compact`), 12 turns, through a fresh handoff in front of `strict`: the mock, the
/// proxy, its data dir and what the client printed.
pub(crate) async fn openai_run(
    strict: &Arc<StrictResponses>,
    mode: &str,
    threshold: u64,
) -> (MockUpstream, Proxy, tempfile::TempDir, Value) {
    let mock = serve_strict(strict, StrictResponses::answer).await;
    let data = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(&mock.url(), estimate_model(data.path(), "gpt-mock", WINDOW));
    let ran = run_client(
        &proxy,
        "openai_native_compaction.py",
        &[mode, "12", &threshold.to_string()],
    )
    .await;
    (mock, proxy, data, ran)
}

/// The anthropic SDK's session in `mode` of `turns` turns, past the least trigger,
/// through a fresh handoff in front of `strict`, as [`openai_run`].
pub(crate) async fn anthropic_run(
    strict: &Arc<StrictAnthropic>,
    mode: &str,
    turns: u32,
) -> (MockUpstream, Proxy, tempfile::TempDir, Value) {
    let mock = serve_strict(strict, StrictAnthropic::answer).await;
    let data = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(
        &mock.url(),
        estimate_model(data.path(), "claude-mock", MESSAGES_WINDOW),
    );
    let ran = run_client(
        &proxy,
        "anthropic_native_compaction.py",
        &[mode, &turns.to_string(), TRIGGER, REPEAT],
    )
    .await;
    (mock, proxy, data, ran)
}

/// One openai SDK session in `mode` (`context_management` past `threshold`, or
/// `compact` every third turn) through handoff: its figures for BENCHMARKS.md.
async fn openai_session(mode: &str, threshold: u64) {
    let strict = StrictResponses::new(WINDOW);
    let (_mock, proxy, _data, ran) = openai_run(&strict, mode, threshold).await;
    let compactions = ran["compactions"].as_u64().unwrap();
    assert!(compactions >= 2, "{mode}: {ran}");
    assert_eq!(
        strict.compactor.compactions.load(Ordering::SeqCst) as u64,
        compactions,
        "{mode}: every compaction is the provider's"
    );
    let refused = strict.refused.lock().unwrap().clone();
    assert!(
        refused.is_empty(),
        "{mode}: the provider refused {refused:?}"
    );
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        0,
        "{mode}: handoff summarised a session the provider keeps under the window"
    );

    let (branches, _, shown) = one_session(&proxy, mode, &ran);
    assert!(shown.contains("PROVIDER COMPACTION"), "{mode}: {shown}");
    assert!(shown.contains("asked the provider"), "{mode}: {shown}");
    println!(
        "NATIVE-ROW | openai SDK ({mode}) | {} | {compactions} | 0 | {branches} | exact |",
        ran["requests"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_sdk_session_with_context_management_compaction_is_one_conversation() {
    openai_session("context_management", 3000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_openai_sdk_session_that_calls_responses_compact_is_one_conversation() {
    openai_session("compact", 0).await;
}

/// The Messages window of the anthropic sessions: past the API's least trigger.
pub(crate) const MESSAGES_WINDOW: u64 = 200_000;

/// The least `compact_20260112` trigger the API takes, and how many times a tool
/// result repeats the filler to pass it in a few turns.
pub(crate) const TRIGGER: &str = "50000";
pub(crate) const REPEAT: &str = "10";

/// One anthropic SDK session in `mode` (`compact`, `compact_stream`, `compact_pause`,
/// `clear_thinking`) of `turns` turns through handoff.
async fn anthropic_session(mode: &str, turns: u32) {
    let strict = StrictAnthropic::new(MESSAGES_WINDOW);
    let (_mock, proxy, _data, ran) = anthropic_run(&strict, mode, turns).await;
    let compactions = ran["compactions"].as_u64().unwrap();
    assert_eq!(
        strict.compactor.compactions.load(Ordering::SeqCst) as u64,
        compactions,
        "{mode}"
    );
    if mode == "clear_thinking" {
        assert!(strict.cleared.load(Ordering::SeqCst) > 0, "{mode}: {ran}");
    } else {
        assert!(compactions >= 2, "{mode}: {ran}");
    }
    let refused = strict.refused.lock().unwrap().clone();
    assert!(
        refused.is_empty(),
        "{mode}: the provider refused {refused:?}"
    );
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        0,
        "{mode}: handoff summarised"
    );

    let (branches, replayed, shown) = one_session(&proxy, mode, &ran);
    // Each compaction block is logged as the SDK assembled it, streamed or not.
    let logged: Vec<Value> = (replayed.iter())
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|b| b["type"] == "compaction")
        .collect();
    let assembled = ran["blocks"].as_array().unwrap();
    for block in assembled {
        assert!(logged.contains(block), "{mode}: {block} is not in the log");
    }
    // Its request lines keep what it asked, beta header included.
    assert!(shown.contains("anthropic-beta:"), "{mode}: {shown}");
    println!(
        "NATIVE-ROW | anthropic SDK ({mode}) | {} | {compactions} | 0 | {branches} | exact |",
        ran["requests"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_sdk_session_with_the_compact_edit_is_one_conversation() {
    anthropic_session("compact", 18).await;
    anthropic_session("compact_stream", 18).await;
    anthropic_session("compact_pause", 18).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_anthropic_sdk_session_that_clears_old_thinking_is_one_conversation() {
    anthropic_session("clear_thinking", 4).await;
}
