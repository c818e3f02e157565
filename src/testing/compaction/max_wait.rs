//! `compaction.max_wait` on the in-process harness, time paused, against the strict
//! provider whose summaries take 30 s: the request that crosses the trigger waits
//! `max_wait`, is sent with extract's stand-in (logged, never committed), the requests
//! after it do not wait again, and the summary is adopted once it lands.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::Ordering;
use std::time::Duration;

use serde_json::Value;

use super::{agent_requests, assert_compacted_view, decisions, strict, user};
use crate::base::line::{Entry, StandInLine};
use crate::base::record::Reason;
use crate::testing::Harness;

/// The 4k model, summaries on a 16k one, nothing prepared: every compaction is one a
/// request needs now.
const CONFIG: &str = "[models.\"strict\"]\ncontext_window = 4096\n[models.\"strict-16k\"]\ncontext_window = 16384\n[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = 0.0\nmax_wait = \"2s\"\n";

/// One user turn of `tokens` tokens and the model's answer (the strict agent answers
/// with text or one tool call, which gets an `ok`); the longest request, in virtual time.
async fn turn(proxy: &Harness, messages: &mut Vec<Value>, (n, tokens): (usize, usize)) -> Duration {
    messages.push(user(n, tokens));
    let mut slowest = Duration::ZERO;
    loop {
        let started = tokio::time::Instant::now();
        let answer = proxy.chat("slow", "strict", messages).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(answer.status, 200, "turn {n}: {}", answer.text());
        let reply = answer.json()["choices"][0]["message"].clone();
        let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
        messages.push(reply);
        match call {
            Some(call) => messages
                .push(serde_json::json!({"role": "tool", "tool_call_id": call, "content": "ok"})),
            None => return slowest,
        }
    }
}

fn stand_ins(log: &crate::store::ConversationLog) -> Vec<StandInLine> {
    log.lines
        .iter()
        .filter_map(|line| match &line.entry {
            Entry::StandIn(stand_in) => Some(stand_in.clone()),
            _ => None,
        })
        .collect()
}

/// The compaction each logged decision says its view was sent with.
fn sent_with(log: &crate::store::ConversationLog) -> Vec<Option<String>> {
    decisions(log)
        .iter()
        .map(|d| d.compaction.clone())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn past_max_wait_a_request_is_sent_with_a_stand_in_and_the_summary_is_adopted_when_it_lands()
{
    let (strict, mock) = strict(Duration::from_secs(30)).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    let mut n = 0;
    // Turns until one crosses the trigger and waits on the summary.
    let crossing = loop {
        assert!(n < 40, "never compacted");
        let slowest = turn(&proxy, &mut messages, (n, 150)).await;
        n += 1;
        if !stand_ins(&proxy.log("slow").await).is_empty() {
            break slowest;
        }
    };
    assert!(
        crossing >= Duration::from_secs(2) && crossing < Duration::from_millis(2500),
        "the crossing request waited max_wait, no longer: {crossing:?} {:?}",
        stand_ins(&proxy.log("slow").await)[0].waited_ms
    );
    let log = proxy.log("slow").await;
    let stand_in = &stand_ins(&log)[0];
    assert_eq!(stand_in.record.strategy, "extract");
    assert_eq!(stand_in.record.attempts[0].strategy, "summarize");
    assert_eq!(stand_in.record.attempts[0].outcome, "pending");
    assert!(stand_in.waited_ms >= 2000, "{}", stand_in.waited_ms);
    assert!(
        proxy.records("slow").await.is_empty(),
        "a stand-in is never committed"
    );
    // The view it was sent with: the pinned system message, the stand-in pair, the recent
    // part verbatim; and its decision names the stand-in.
    let sent = agent_requests(&mock).pop().unwrap();
    let asked = &messages[..messages.len() - 1];
    assert_compacted_view(sent["messages"].as_array().unwrap(), asked);
    assert_eq!(
        sent_with(&log).last().unwrap().as_deref(),
        Some(stand_in.record.id.as_str())
    );
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        1,
        "one summary running"
    );
    // While it runs, the next turns do not wait for it.
    for _ in 0..2 {
        let slowest = turn(&proxy, &mut messages, (n, 150)).await;
        n += 1;
        assert!(slowest < Duration::from_millis(500), "waited {slowest:?}");
    }
    // It lands (30 s after it started), is committed, and the next request adopts it.
    tokio::time::sleep(Duration::from_secs(30)).await;
    let records = proxy.records("slow").await;
    assert_eq!(records.len(), 1, "the summary is committed when it lands");
    assert_eq!(records[0].strategy, "summarize");
    assert_eq!(records[0].reason, Reason::Threshold);
    let slowest = turn(&proxy, &mut messages, (n, 150)).await;
    assert!(slowest < Duration::from_millis(500), "waited {slowest:?}");
    let log = proxy.log("slow").await;
    assert_eq!(
        sent_with(&log).last().unwrap().as_deref(),
        Some(records[0].id.as_str()),
        "the summary's handoff is sent once it landed"
    );
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        1,
        "never a second summary"
    );
    let metrics = proxy.state.metrics.render();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("handoff_stand_ins_total ") && !l.ends_with(" 0")),
        "{metrics}"
    );
    assert!(strict.over_window.lock().unwrap().is_empty());
    // The audit shows the stand-in next to the request it served.
    let timeline = proxy.timeline("slow").await;
    let events = timeline["events"].as_array().unwrap();
    let shown = events.iter().find(|e| e["type"] == "stand_in").unwrap();
    assert_eq!(shown["id"], stand_in.record.id.as_str());
    assert_eq!(shown["strategy"], "extract");
}

#[tokio::test(start_paused = true)]
async fn a_summary_faster_than_max_wait_is_waited_for_and_no_stand_in_is_made() {
    let (strict, mock) = strict(Duration::from_secs(1)).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    let mut n = 0;
    while proxy.records("slow").await.is_empty() {
        assert!(n < 40, "never compacted");
        turn(&proxy, &mut messages, (n, 150)).await;
        n += 1;
    }
    let records = proxy.records("slow").await;
    assert_eq!(records[0].strategy, "summarize");
    let log = proxy.log("slow").await;
    assert!(stand_ins(&log).is_empty());
    assert_eq!(
        sent_with(&log).last().unwrap().as_deref(),
        Some(records[0].id.as_str()),
        "the request that crossed waited for its summary"
    );
    assert_eq!(strict.summaries.load(Ordering::SeqCst), 1);
}
