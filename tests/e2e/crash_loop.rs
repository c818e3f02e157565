//! The crash loop: kill -9 at random points while compactions run (a slow `summarize`,
//! then `extract`), restart, and check the log after each restart:
//! - `audit verify` is clean (an uncommitted record is a note, not damage);
//! - only committed compactions are adopted: the view's handoff is always one of them;
//! - the view is the one before the kill, unless a compaction was committed.
//!
//! CI runs a few rounds; `scripts/crash-loop.sh ROUNDS` runs the long version.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::scenario::{big_user, chat, options};
use crate::support::Proxy;
use mock_upstream::strict::Strict;
use mock_upstream::{MockUpstream, Reply};
use serde_json::{json, Value};

/// A small deterministic generator, so a failing run can be replayed by its seed.
struct Lcg(AtomicU64);

impl Lcg {
    fn below(&self, n: u64) -> u64 {
        let next = self
            .0
            .load(Ordering::Relaxed)
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0.store(next, Ordering::Relaxed);
        (next >> 33) % n.max(1)
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn view(proxy: &Proxy) -> Value {
    let out = proxy.audit(&["view", "crash"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The committed compactions' handoff texts, from `audit show`'s records.
fn committed(proxy: &Proxy) -> Vec<String> {
    let dir = proxy.conversation_dir("crash");
    let boundaries: Vec<String> = std::fs::read_to_string(dir.join("messages.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|l| l["kind"] == "compact_boundary")
        .map(|l| l["compact_id"].as_str().unwrap().to_owned())
        .collect();
    std::fs::read_to_string(dir.join("compactions.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|r| boundaries.iter().any(|b| r["id"] == json!(b)))
        .map(|r| {
            r["handoff"]["content"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_at_random_points_never_breaks_the_log() {
    let rounds: u64 = env_or("CRASH_LOOP_ROUNDS", 6);
    let seed: u64 = env_or("CRASH_LOOP_SEED", 0x5eed);
    eprintln!("crash loop: {rounds} rounds, seed {seed} (CRASH_LOOP_SEED to replay)");
    let random = Arc::new(Lcg(AtomicU64::new(seed)));

    // A summary takes 0–400 ms, so kills land before, during and after it.
    let strict = Strict::new(4096);
    let (responder, delays) = (Arc::clone(&strict), Arc::clone(&random));
    let mock = MockUpstream::with(move |req| {
        let answer = responder.answer(req);
        let summary = mock_upstream::strict::is_summary(&req.json());
        if summary {
            return Reply::Delayed {
                delay: Duration::from_millis(delays.below(400)),
                then: Box::new(answer),
            };
        }
        answer
    })
    .await;
    let data = tempfile::tempdir().unwrap();
    let start = || {
        let mut opts = options(
            4096,
            "[compaction]\nsummary_model = \"strict-16k\"\nsummary_timeout = \"5s\"\n",
        );
        opts.data_dir = Some(data.path().to_owned());
        opts.rust_log = "warn,handoff::server=info".into();
        Proxy::start_with(&mock.url(), opts)
    };
    let mut proxy = start();
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let (mut kept, mut advanced) = (0, 0);
    for round in 0..rounds {
        // A turn, and its tool round if the model calls one.
        messages.push(big_user(round as usize, 120));
        let got = chat(&proxy, "crash", &messages).await;
        assert_eq!(got.status, 200, "round {round}: {}", got.text());
        let reply = got.json()["choices"][0]["message"].clone();
        messages.push(reply.clone());
        if let Some(call) = reply["tool_calls"][0]["id"].as_str() {
            messages.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}));
            let got = chat(&proxy, "crash", &messages).await;
            assert_eq!(got.status, 200, "round {round}: {}", got.text());
            messages.push(got.json()["choices"][0]["message"].clone());
        }

        let before = view(&proxy);
        let before_committed = committed(&proxy).len();
        // A compaction now, killed at a random moment.
        // A raw request: it dies with the process, and that is the point.
        let mut compaction = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(
            &mut compaction,
            b"POST /handoff/conversations/crash/compact HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-length: 0\r\n\r\n",
        )
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_millis(random.below(450))).await;
        proxy.kill9();
        drop(compaction);
        proxy = start();

        proxy.assert_verified(&[]);
        let handoffs = committed(&proxy);
        let after = view(&proxy);
        // Only committed records shape the view.
        let shown = after.to_string();
        for record in
            std::fs::read_to_string(proxy.conversation_dir("crash").join("compactions.jsonl"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        {
            let text = record["handoff"]["content"].as_str().unwrap_or_default();
            if !text.is_empty() && shown.contains(&json!(text).to_string()) {
                assert!(
                    handoffs.iter().any(|h| h == text),
                    "an uncommitted record shapes the view"
                );
            }
        }
        if handoffs.len() == before_committed {
            assert_eq!(
                after, before,
                "round {round}: the view changed without a commit"
            );
            kept += 1;
        } else {
            advanced += 1;
        }
    }
    let records =
        std::fs::read_to_string(proxy.conversation_dir("crash").join("compactions.jsonl"))
            .unwrap_or_default()
            .lines()
            .count();
    let adopted = committed(&proxy).len();
    eprintln!(
        "crash loop: {rounds} kills; {advanced} landed after a commit, {kept} before one; \
         {adopted} compactions committed, {} records left uncommitted by a kill (never adopted)",
        records - adopted
    );
}
