//! Zero-wait compaction on the in-process harness, time paused, against the strict
//! provider whose summaries take 3 s: prepared at the mark, adopted only at the
//! trigger; a request that crosses the trigger first is sent without waiting while its
//! view fits the input budget, and waits (never runs a second one) when it does not;
//! and a failed summary that falls back to extract.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use mock_upstream::strict::SummaryMode;
use serde_json::Value;

use super::{agent_requests, assert_compacted_view, decisions, strict, user};
use crate::base::line::Entry;
use crate::base::record::Reason;
use crate::testing::Harness;

/// The 4k model, summaries on a 16k one, prepared at 0.8 of the trigger.
const CONFIG: &str = "[models.\"strict\"]\ncontext_window = 4096\n[models.\"strict-16k\"]\ncontext_window = 16384\n[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = 0.8\nmax_wait = \"60s\"\n";

/// Sends one more turn of `tokens`, answering the strict agent's tool calls, and lets
/// `pause` of (virtual) time pass after each request (5 s: a preparation it started
/// finishes before the next).
async fn turn(
    proxy: &Harness,
    id: &str,
    messages: &mut Vec<Value>,
    (n, tokens): (usize, usize),
    pause: Duration,
) {
    messages.push(user(n, tokens));
    loop {
        let answer = proxy.chat(id, "strict", messages).await;
        tokio::time::sleep(pause).await;
        assert_eq!(answer.status, 200, "turn {n}: {}", answer.text());
        let reply = answer.json()["choices"][0]["message"].clone();
        let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
        messages.push(reply);
        match call {
            Some(call) => messages
                .push(serde_json::json!({"role": "tool", "tool_call_id": call, "content": "ok"})),
            None => return,
        }
    }
}

/// Lets the background run: virtual time passes until `id` has `records`.
async fn wait_for_records(proxy: &Harness, id: &str, records: usize) {
    for _ in 0..600 {
        if proxy.records(id).await.len() >= records {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no record {records} for {id}");
}

fn adopt_lines(log: &crate::store::ConversationLog) -> Vec<(String, usize)> {
    log.lines
        .iter()
        .filter_map(|line| match &line.entry {
            Entry::Adopt(adopt) => Some((adopt.compact_id.clone(), adopt.arrived)),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_prepared_compaction_waits_for_the_trigger_and_is_adopted_without_a_summary_call() {
    let (strict, mock) = strict(Duration::from_secs(3)).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    let mut n = 0;
    // Up to the mark: every request goes as the client sent it.
    while proxy.records("zero").await.is_empty() && n < 40 {
        turn(
            &proxy,
            "zero",
            &mut messages,
            (n, 150),
            Duration::from_secs(5),
        )
        .await;
        n += 1;
    }
    let records = proxy.records("zero").await;
    assert_eq!(records.len(), 1, "prepared in the background");
    let prepared = &records[0];
    assert_eq!(prepared.reason, Reason::Prepared);
    assert!(prepared.prepared.is_some());
    assert_eq!(strict.summaries.load(Ordering::SeqCst), 1);
    assert_eq!(prepared.summary_calls, 1, "the record counts its call");
    for sent in agent_requests(&mock) {
        let first = &sent["messages"][1]["content"];
        assert!(
            first.as_str().is_some_and(|t| t.starts_with("FACT-000")),
            "sent as the client asked before the trigger: {first}"
        );
    }
    // Past the mark, under the trigger: still untouched, and nothing is prepared twice.
    let mut crossed = false;
    while !crossed && n < 40 {
        let before = mock.requests().len();
        let started = tokio::time::Instant::now();
        turn(&proxy, "zero", &mut messages, (n, 150), Duration::ZERO).await;
        n += 1;
        crossed = mock.requests()[before..].iter().any(|r| {
            r.json()["messages"][1]["content"]
                .as_str()
                .is_some_and(|t| t.starts_with("Continue from the compacted state"))
        });
        if crossed {
            assert!(
                started.elapsed() < Duration::from_secs(3),
                "the crossing request waited for nothing"
            );
        }
    }
    assert!(crossed, "the trigger was never crossed");
    let sent = agent_requests(&mock).pop().unwrap();
    assert_compacted_view(
        sent["messages"].as_array().unwrap(),
        &messages[..messages.len() - 1],
    );
    let log = proxy.log("zero").await;
    let adopted = adopt_lines(&log);
    assert_eq!(adopted.len(), 1, "{adopted:?}");
    assert_eq!(adopted[0].0, prepared.id);
    assert!(
        adopted[0].1 >= 2,
        "the turns since the preparation stay verbatim: {adopted:?}"
    );
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        1,
        "the crossing made no summary call"
    );
    assert!(strict.over_window.lock().unwrap().is_empty());
    let metrics = proxy.state.metrics.render();
    assert!(
        metrics.contains("handoff_prepared_adopted_total 1"),
        "{metrics}"
    );
    // The timeline (what the web view reads) shows both.
    let timeline = proxy.timeline("zero").await;
    let events = timeline["events"].as_array().unwrap();
    let compaction = events.iter().find(|e| e["type"] == "compaction").unwrap();
    assert_eq!(
        compaction["prepared"]["messages"],
        prepared.prepared.as_ref().unwrap().messages
    );
    let adopt = events.iter().find(|e| e["type"] == "adopt").unwrap();
    assert_eq!(adopt["id"], prepared.id.as_str());
}

/// True once `mock` has seen an agent request whose view starts with a handoff.
fn compacted_view_sent(mock: &mock_upstream::MockUpstream) -> bool {
    agent_requests(mock).last().is_some_and(|sent| {
        sent["messages"][1]["content"]
            .as_str()
            .is_some_and(|t| t.starts_with("Continue from the compacted state"))
    })
}

/// The `over` of every decision logged for `id`.
async fn decisions_over(proxy: &Harness, id: &str) -> Vec<Option<String>> {
    let log = proxy.log(id).await;
    decisions(&log).iter().map(|d| d.over.clone()).collect()
}

#[tokio::test(start_paused = true)]
async fn a_request_crossing_the_trigger_while_its_preparation_runs_is_sent_without_waiting() {
    let (strict, mock) = strict(Duration::from_secs(3)).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    let mut n = 0;
    // Quick turns, no pause: the preparation is still running when the trigger comes;
    // each turn is timed on the paused clock, which only a wait for the 3 s summary
    // moves by seconds.
    let mut slowest = Duration::ZERO;
    while !compacted_view_sent(&mock) {
        assert!(n < 40, "never compacted");
        let started = tokio::time::Instant::now();
        turn(
            &proxy,
            "nowait",
            &mut messages,
            (n, 100),
            Duration::from_millis(500),
        )
        .await;
        slowest = slowest.max(started.elapsed().saturating_sub(Duration::from_millis(500)));
        n += 1;
    }
    assert!(
        slowest < Duration::from_secs(1),
        "a turn waited {slowest:?}"
    );
    assert_eq!(strict.summaries.load(Ordering::SeqCst), 1, "one summary");
    let records = proxy.records("nowait").await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].reason, Reason::Prepared);
    let metrics = proxy.state.metrics.render();
    assert!(
        !metrics.contains("handoff_prepared_waited_total 1"),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("handoff_sent_while_preparing_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
    // The log says which requests went over the trigger without waiting.
    let over = decisions_over(&proxy, "nowait").await;
    assert!(
        over.iter().flatten().any(|o| o == "sent_while_preparing"),
        "{over:?}"
    );
    assert!(strict.over_window.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_request_over_the_input_budget_while_its_preparation_runs_waits_and_makes_no_second_call()
{
    let (strict, mock) = strict(Duration::from_secs(3)).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    let mut n = 0;
    // Turns until the preparation starts, then one that no view fits without it.
    while !proxy
        .state
        .metrics
        .render()
        .contains("handoff_prepared_total{outcome=\"started\"} 1")
    {
        assert!(n < 40, "never prepared");
        turn(&proxy, "wait", &mut messages, (n, 150), Duration::ZERO).await;
        n += 1;
    }
    let started = tokio::time::Instant::now();
    turn(&proxy, "wait", &mut messages, (n, 1000), Duration::ZERO).await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "it waited for the summary: {:?}",
        started.elapsed()
    );
    assert!(compacted_view_sent(&mock));
    let records = proxy.records("wait").await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0].reason, Reason::Prepared);
    let metrics = proxy.state.metrics.render();
    assert!(
        metrics.contains("handoff_prepared_waited_total 1"),
        "{metrics}"
    );
    // Its view, still over the trigger once the handoff was adopted, fits the input
    // budget: sent, and the next compaction is prepared rather than waited for.
    assert!(
        metrics.contains("handoff_prepared_total{outcome=\"started\"} 2"),
        "{metrics}"
    );
    assert!(strict.over_window.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_preparation_whose_summary_fails_falls_back_to_extract_and_is_adopted() {
    let (strict, mock) = strict(Duration::from_secs(3)).await;
    strict.set_summary_mode(SummaryMode::ServerError);
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    let mut n = 0;
    while proxy.records("fails").await.is_empty() {
        assert!(n < 40, "nothing prepared");
        turn(
            &proxy,
            "fails",
            &mut messages,
            (n, 150),
            Duration::from_secs(5),
        )
        .await;
        n += 1;
    }
    wait_for_records(&proxy, "fails", 1).await;
    let record = &proxy.records("fails").await[0];
    assert_eq!(record.reason, Reason::Prepared);
    assert_eq!(record.strategy, "extract");
    assert_eq!(record.attempts[0].outcome, "failed");
    for _ in 0..40 {
        if !adopt_lines(&proxy.log("fails").await).is_empty() {
            break;
        }
        turn(&proxy, "fails", &mut messages, (n, 150), Duration::ZERO).await;
        n += 1;
    }
    let adopted = adopt_lines(&proxy.log("fails").await);
    assert_eq!(
        adopted.len(),
        1,
        "the fallback's handoff is adopted at the trigger"
    );
    assert_eq!(proxy.records("fails").await.len(), 1);
    drop(mock);
}

/// A fast agent (200-token turns, a request every half second) with `prepare_at`, until two
/// compactions: the slowest turn (less its pauses) and the records.
async fn fast_agent(prepare_at: &str) -> (Duration, Vec<crate::base::record::CompactionRecord>) {
    let config = CONFIG.replace("prepare_at = 0.8", &format!("prepare_at = {prepare_at}"));
    let (strict, mock) = strict(Duration::from_secs(3)).await;
    let proxy = Harness::start(&mock.url(), &config).await;
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    let mut slowest = Duration::ZERO;
    let mut n = 0;
    while proxy.records("fast").await.len() < 2 {
        assert!(n < 60, "fewer than two compactions");
        let (started, sent) = (tokio::time::Instant::now(), agent_requests(&mock).len());
        turn(
            &proxy,
            "fast",
            &mut messages,
            (n, 200),
            Duration::from_millis(500),
        )
        .await;
        // Each request of the turn (tool calls answered) is followed by the pause.
        let requests = u32::try_from(agent_requests(&mock).len() - sent).unwrap();
        let paused = Duration::from_millis(500) * requests;
        slowest = slowest.max(started.elapsed().saturating_sub(paused));
        n += 1;
    }
    assert!(strict.over_window.lock().unwrap().is_empty());
    (slowest, proxy.records("fast").await)
}

#[tokio::test(start_paused = true)]
async fn with_prepare_at_auto_a_fast_agent_starts_sooner_and_waits_no_longer_than_a_fixed_share() {
    let (fixed, fixed_records) = fast_agent("0.8").await;
    let (auto, records) = fast_agent("\"auto\"").await;
    let seen = |records: &[crate::base::record::CompactionRecord]| -> Vec<_> {
        records
            .iter()
            .map(|r| (r.reason, r.tokens_before, r.tokens_after))
            .collect()
    };
    // At 0.8 the agent outgrows the input budget before the 3 s summary is written.
    assert!(
        fixed >= Duration::from_millis(400),
        "at 0.8: {fixed:?} {:?}",
        seen(&fixed_records)
    );
    // Auto starts before the fixed mark, from the pace it measured. It never stacks a
    // preparation on one still waiting for its trigger (that would summarise a prefix
    // the upstream never read, and compact twice for once), so a conversation this
    // fast against a summariser this slow still meets the trigger before the second
    // one lands: it waits no longer than at the fixed share, and never past max_wait.
    assert!(
        auto <= fixed && auto < Duration::from_secs(2),
        "auto waited {auto:?}, 0.8 {fixed:?}: {:?}",
        seen(&records)
    );
    assert!(
        records.iter().all(|r| r.reason == Reason::Prepared),
        "every compaction was prepared: {:?}",
        seen(&records)
    );
    assert!(
        records[0].tokens_before < (3318.0 * 0.8) as u64,
        "{:?}",
        seen(&records)
    );
}
