//! kill -9 while retention prunes, while cold conversations are compressed, and while
//! conversations are erased, with a live conversation written to all along. After
//! every restart:
//! - `audit verify` is clean;
//! - each conversation is whole (replays as it was sent) or gone, never half;
//! - every acknowledged turn of the live conversation is kept;
//! - nothing a crash left in `upkeep/` survives the restart.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::support::scenario::{chat, echo_mock, options};
use crate::support::Proxy;
use serde_json::{json, Value};

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The conversation `n` as the client sends it, and its replies, after `turns` turns.
fn expected(n: usize, turns: usize) -> Vec<Value> {
    (0..turns)
        .flat_map(|t| {
            let text = format!("C{n} turn {t} {}", "filler ".repeat(40));
            [
                json!({"role": "user", "content": text}),
                json!({"role": "assistant", "content": format!("you said: {text}")}),
            ]
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_nine_mid_prune_compression_or_erasure_leaves_every_conversation_whole_or_gone() {
    let rounds: u64 = env_or("UPKEEP_CRASH_ROUNDS", 9);
    let conversations: usize = env_or("UPKEEP_CRASH_CONVERSATIONS", 120);
    let mock = echo_mock().await;
    let data = tempfile::tempdir().unwrap();
    let start = |store: &str| {
        let mut opts = options(8192, store);
        opts.data_dir = Some(data.path().to_owned());
        opts.rust_log = "warn,handoff::server=info".into();
        Proxy::start_with(&mock.url(), opts)
    };
    let mut proxy = start("");
    for n in 0..conversations {
        let mut history = Vec::new();
        for turn in expected(n, 2).chunks(2) {
            history.push(turn[0].clone());
            let got = chat(&proxy, &format!("c{n}"), &history).await;
            assert_eq!(got.status, 200);
            history.push(turn[1].clone());
        }
    }
    let mut live: Vec<Value> = Vec::new();
    let seed: u64 = env_or("UPKEEP_CRASH_SEED", 0x5eed);
    let mut random = seed;
    let mut next = |n: u64| {
        random = random
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (random >> 33) % n
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    for round in 0..rounds {
        // Rounds compress, erase, then prune (all conversations are past 1 s).
        let store = match round % 3 {
            0 => "[store]\ncompress_after = \"1s\"\nupkeep_interval = \"50ms\"",
            2 => "[store]\nretention = \"1s\"\nupkeep_interval = \"50ms\"",
            _ => "",
        };
        proxy.kill9();
        proxy = start(store);
        let eraser = (round % 3 == 1).then(|| {
            let url = proxy.url();
            let first = next(conversations as u64) as usize;
            // The kill cuts one of these requests: its task panics there, and is
            // aborted below; nothing waits on it.
            tokio::spawn(async move {
                for n in first..conversations {
                    let erase = format!("{url}/handoff/erase?conversation=c{n}");
                    crate::support::client::send(crate::support::client::request(
                        "POST",
                        &erase,
                        &[],
                        "",
                    ))
                    .await;
                }
            })
        });
        let until = std::time::Instant::now() + Duration::from_millis(next(900));
        while std::time::Instant::now() < until {
            live.push(json!({"role": "user", "content": format!("live {}", live.len())}));
            let got = chat(&proxy, "live", &live).await;
            assert_eq!(got.status, 200, "round {round}");
            live.push(got.json()["choices"][0]["message"].clone());
        }
        proxy.kill9();
        if let Some(eraser) = eraser {
            eraser.abort();
        }
        // A checker: no upkeep (the defaults), so nothing moves while it reads.
        proxy = start("");
        let leftovers = || {
            std::fs::read_dir(data.path().join("upkeep"))
                .map(|d| d.count())
                .unwrap_or(0)
        };
        let found = leftovers();
        let deadline = std::time::Instant::now() + Duration::from_secs(3);
        while leftovers() > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "upkeep/ is swept at start"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        proxy.assert_verified(&[]);
        let mut present = 0;
        for n in 0..conversations {
            let id = format!("c{n}");
            if proxy.conversation_dir(&id).exists() {
                assert_eq!(
                    proxy.replay(&id, None),
                    expected(n, 2),
                    "round {round}: {id} is whole"
                );
                present += 1;
            }
        }
        if !live.is_empty() {
            assert_eq!(
                proxy.replay("live", None),
                live,
                "round {round}: the live one is whole"
            );
        }
        let compressed = (0..conversations)
            .filter(|n| {
                proxy
                    .conversation_dir(&format!("c{n}"))
                    .join("messages.jsonl.zst")
                    .is_file()
            })
            .count();
        eprintln!(
            "round {round}: {present} of {conversations} conversations left, {compressed} compressed, {found} upkeep leftovers swept at start"
        );
    }
}
