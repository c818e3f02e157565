//! A `kill -9` during a preparation leaves nothing half-made to adopt, and the next
//! crossing after the restart compacts: the one zero-wait contract that needs a process
//! (the rest run in-process, on paused time: `src/testing/compaction/zero_wait.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::Arc;
use std::time::Duration;

use mock_upstream::strict::Strict;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use support::scenario::{agent_turn, big_user, options, paced, records};
use support::Proxy;

const SUMMARY_DELAY: Duration = Duration::from_secs(3);

/// The agent's model: the upstream's own time for a turn.
const TURN_DELAY: Duration = Duration::from_secs(1);

async fn slow_summaries(window: u64) -> (Arc<Strict>, MockUpstream) {
    let strict = Strict::new(window);
    let mock = paced(&strict, TURN_DELAY, SUMMARY_DELAY).await;
    (strict, mock)
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
    // The compaction the crossing started commits once its summary lands.
    let deadline = std::time::Instant::now() + SUMMARY_DELAY * 4;
    while records(&proxy, "killed").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "compacted after the restart"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.assert_verified(&[]);
}
