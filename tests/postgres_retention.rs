//! Retention, holds and erasure on the shared PostgreSQL store, with two replicas:
//! what one process removes, the others forget, and a conversation continued after
//! its erasure starts anew on any replica.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::time::Duration;

use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use support::postgres::Postgres;
use support::scenario::{chat, echo_mock, options};
use support::Proxy;

fn replica(mock: &MockUpstream, db: &Postgres, store: &str) -> Proxy {
    Proxy::start_with(&mock.url(), options(8192, &db.store_toml(store)))
}

/// One more turn of `history` through `proxy`.
async fn turn(proxy: &Proxy, id: &str, history: &mut Vec<Value>, text: &str) {
    history.push(json!({"role": "user", "content": text}));
    let got = chat(proxy, id, history).await;
    assert_eq!(got.status, 200, "{}", got.text());
    history.push(got.json()["choices"][0]["message"].clone());
}

fn stdout_json(output: &std::process::Output) -> Value {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_on_one_replica_is_forgotten_by_the_other_and_leaves_no_row() {
    let db = Postgres::start();
    let mock = echo_mock().await;
    let (a, b) = (replica(&mock, &db, ""), replica(&mock, &db, ""));
    let marker = "PG-ERASE-ME-51c0";
    let mut history = Vec::new();
    // Both replicas hold the conversation in their caches.
    for n in 0..4 {
        let proxy = if n % 2 == 0 { &a } else { &b };
        turn(proxy, "secret", &mut history, &format!("{marker} turn {n}")).await;
    }
    let mut other = Vec::new();
    turn(&a, "other", &mut other, "KEEP").await;
    assert!(db.dump().contains(marker));

    // Through the CLI, straight to the database: no replica is asked.
    let erased = stdout_json(&a.audit(&["erase", "--conversation", "secret", "--json"]));
    assert_eq!(erased["erased"], json!(["secret"]));
    assert!(!db.dump().contains(marker), "no row keeps the marker");
    assert_eq!(
        db.count("SELECT count(*) FROM handoff_tombstones WHERE tombstone LIKE '%\"erase\"%'"),
        1
    );
    assert!(!db
        .sql("SELECT tombstone FROM handoff_tombstones")
        .contains(marker));
    assert!(
        !a.logs().contains(marker) && !b.logs().contains(marker),
        "no log line names the content"
    );
    // The replicas follow the tombstones within a second.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    turn(&b, "secret", &mut history, "after the erasure").await;
    assert_eq!(a.replay("secret", None), history, "logged again, whole");
    assert_eq!(a.replay("other", None), other);
    a.assert_verified(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_on_postgres_prunes_idle_conversations_and_keeps_held_ones() {
    let db = Postgres::start();
    let mock = echo_mock().await;
    let proxy = replica(
        &mock,
        &db,
        "retention = \"2s\"\nupkeep_interval = \"300ms\"",
    );
    let (mut idle, mut kept, mut live) = (Vec::new(), Vec::new(), Vec::new());
    turn(&proxy, "idle", &mut idle, "IDLE").await;
    turn(&proxy, "kept", &mut kept, "KEPT").await;
    let held = stdout_json(&proxy.audit(&["hold", "kept", "--json"]));
    assert_eq!(held["held"], json!(true));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while std::time::Instant::now() < deadline {
        turn(&proxy, "live", &mut live, "LIVE").await;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let rows = |id: &str| {
        db.count(&format!(
            "SELECT count(*) FROM handoff_lines WHERE conversation = '{id}'"
        ))
    };
    assert_eq!(rows("idle"), 0, "pruned");
    assert_eq!(
        db.count("SELECT count(*) FROM handoff_summaries WHERE conversation = 'idle'"),
        0,
        "its listing counts go with it"
    );
    assert!(rows("kept") > 0, "held");
    assert!(rows("live") > 0, "written to");
    assert_eq!(proxy.replay("live", None), live);
    let stats = stdout_json(&proxy.store(&["stats", "--json"]));
    let tenant = &stats["tenants"][0];
    assert_eq!(tenant["conversations"], 2);
    assert_eq!(tenant["held"], 1);
    assert_eq!(
        tenant["requests"].as_u64().unwrap(),
        1 + live.len() as u64 / 2
    );
    assert!(tenant["bytes_stored"].as_u64().unwrap() > 0);
    proxy.assert_verified(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_lands_after_the_erasure_leaves_no_row() {
    let db = Postgres::start();
    let mock = MockUpstream::with(|_| {
        mock_upstream::Reply::chat_text("late").delayed(Duration::from_millis(1500))
    })
    .await;
    let proxy = replica(&mock, &db, "");
    let marker = "PG-ERASE-ME-in-flight";
    let in_flight = support::scenario::turn_in_flight(&proxy, &mock, "in-flight", marker).await;
    assert!(db.dump().contains(marker));
    let erased = stdout_json(&proxy.audit(&["erase", "--conversation", "in-flight", "--json"]));
    assert_eq!(erased["erased"], json!(["in-flight"]));

    let answered = in_flight.await.unwrap();
    assert_eq!(answered.status, 200, "{}", answered.text());
    proxy.wait_for_log("its reply is not logged", Duration::from_secs(10));
    assert_eq!(
        db.count("SELECT count(*) FROM handoff_conversations WHERE conversation = 'in-flight'"),
        0,
        "the reply brought the erased conversation back"
    );
    assert!(!db.dump().contains("late"), "no row holds the reply");
    assert!(!db.dump().contains(marker));
}
