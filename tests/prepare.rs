//! Zero-wait compaction on the real binary, in real time: a 20-turn agent on an 8k
//! model that answers in 1 s, against a summariser that takes 3 s a call. With preparation no
//! request waits for a summary; without it the compacting requests take the
//! summariser's 3 s. The same facts reach
//! the model, for at most one more summary call per compaction. And a `kill -9` during
//! a preparation leaves nothing half-made to adopt.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mock_upstream::strict::Strict;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use support::scenario::{agent_requests, agent_turn, big_user, options, paced, records};
use support::Proxy;

const SUMMARY_DELAY: Duration = Duration::from_secs(3);

/// The agent's model: the upstream's own time for a turn.
const TURN_DELAY: Duration = Duration::from_secs(1);

async fn slow_summaries(window: u64) -> (Arc<Strict>, MockUpstream) {
    let strict = Strict::new(window);
    let mock = paced(&strict, TURN_DELAY, SUMMARY_DELAY).await;
    (strict, mock)
}

/// What a session showed: each request's latency, the last view, the records.
struct Session {
    latencies: Vec<Duration>,
    last_view: String,
    records: Vec<Value>,
    summary_calls: usize,
}

/// One user turn of about `tokens` tokens; each request's latency goes to `latencies`.
async fn turn(
    proxy: &Proxy,
    id: &str,
    messages: &mut Vec<Value>,
    (n, tokens): (usize, usize),
    latencies: &mut Vec<Duration>,
) {
    latencies.extend(agent_turn(proxy, id, messages, big_user(n, tokens)).await);
}

async fn session(prepare_at: &str, turns: usize) -> Session {
    let (strict, mock) = slow_summaries(8192).await;
    // Inline compactions wait for their summary, however long it takes: what preparing
    // saves is measured against that, not against compaction.max_wait's stand-in.
    let extra = format!("[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = {prepare_at}\nmax_wait = \"60s\"\n");
    let proxy = Proxy::start_with(&mock.url(), options(8192, &extra));
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut latencies = Vec::new();
    for n in 0..turns {
        turn(&proxy, "agent", &mut messages, (n, 450), &mut latencies).await;
    }
    // A preparation still running ends before the records are read.
    tokio::time::sleep(SUMMARY_DELAY + Duration::from_secs(1)).await;
    assert!(strict.over_window.lock().unwrap().is_empty());
    Session {
        latencies,
        last_view: agent_requests(&mock).pop().unwrap().json().to_string(),
        records: records(&proxy, "agent"),
        summary_calls: strict.summaries.load(Ordering::SeqCst),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_preparation_no_request_waits_for_a_summary_and_without_it_some_do() {
    // Prepared at 0.7 of the trigger: about four turns, and seconds, before it. The two
    // sessions are apart (each its own mock and proxy) and mostly wait: run together.
    let (prepared, inline) = tokio::join!(session("0.7", 20), session("0", 20));
    let slowest = |s: &Session| s.latencies.iter().max().copied().unwrap();
    // Each request takes the upstream's own 0.5 s, and handoff's time on top.
    assert!(
        slowest(&prepared) < TURN_DELAY + SUMMARY_DELAY / 2,
        "a request waited for a summary: {:?}",
        slowest(&prepared)
    );
    assert!(
        slowest(&inline) >= SUMMARY_DELAY + TURN_DELAY,
        "{:?}",
        slowest(&inline)
    );
    let waited = inline
        .latencies
        .iter()
        .filter(|l| **l >= SUMMARY_DELAY)
        .count();
    assert_eq!(
        waited,
        inline.records.len(),
        "each inline compaction made one request wait"
    );
    assert!(
        prepared.records.iter().all(|r| r["reason"] == "prepared"),
        "{:?}",
        prepared.records
    );
    assert!(
        prepared.summary_calls <= inline.summary_calls + prepared.records.len(),
        "{} summary calls prepared, {} inline",
        prepared.summary_calls,
        inline.summary_calls
    );
    // The same facts reach the model: the oldest turns, through the handoffs.
    for early in ["FACT-000", "FACT-001", "FACT-002"] {
        assert!(
            prepared.last_view.contains(early),
            "{early} was lost with preparation"
        );
        assert!(inline.last_view.contains(early), "{early} was lost inline");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_a_preparation_leaves_nothing_half_made_and_the_next_crossing_compacts() {
    let (_strict, mock) = slow_summaries(4096).await;
    let extra = "[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = 0.5\n";
    let mut proxy = Proxy::start_with(&mock.url(), options(4096, extra));
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut n = 0;
    // Until a summary call is on its way: the preparation is running.
    let summarising = |mock: &MockUpstream| {
        mock.requests()
            .iter()
            .any(|r| mock_upstream::strict::is_summary(&r.json()))
    };
    let mut latencies = Vec::new();
    while !summarising(&mock) {
        assert!(n < 20, "nothing was prepared");
        turn(&proxy, "killed", &mut messages, (n, 300), &mut latencies).await;
        n += 1;
    }
    proxy.kill9();
    assert!(
        records(&proxy, "killed").is_empty(),
        "nothing was committed"
    );
    let data_dir = proxy.data_dir();
    let proxy = Proxy::start_with(
        &mock.url(),
        support::ProxyOptions {
            data_dir: Some(data_dir),
            ..options(4096, extra)
        },
    );
    // The next requests go on; the one that crosses the trigger compacts.
    for _ in 0..20 {
        if records(&proxy, "killed")
            .iter()
            .any(|r| r["reason"] == "threshold" || r["reason"] == "prepared")
        {
            break;
        }
        turn(&proxy, "killed", &mut messages, (n, 300), &mut latencies).await;
        n += 1;
    }
    tokio::time::sleep(SUMMARY_DELAY + Duration::from_secs(1)).await;
    assert!(
        !records(&proxy, "killed").is_empty(),
        "compacted after the restart"
    );
    proxy.assert_verified(&[]);
}
