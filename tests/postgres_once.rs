//! Each compaction made once across replicas: four replicas (separate processes) on one
//! PostgreSQL serve four agent conversations turn by turn, round robin; one replica is
//! killed with SIGKILL while it holds a compaction lease, and the database is restarted
//! at once. Every summary call the provider saw is then accounted for: by the committed
//! record that holds it, or by an orphaned claim, named by its lease.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mock_upstream::strict::{is_summary, Strict};
use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use support::client::{request, try_send, Whole};
use support::postgres::Postgres;
use support::scenario::{big_user, options, CHAT};
use support::Proxy;

/// Summaries on the 16k model; claims expire 3 s after their last renewal.
const CONFIG: &str = "[compaction]\nsummary_model = \"strict-16k\"\nsummary_timeout = \"20s\"\n";

/// How long each summary call takes: long enough for the kill to land inside one.
const SUMMARY_TAKES: Duration = Duration::from_millis(1500);

const REPLICAS: usize = 4;
const CONVERSATIONS: usize = 4;
const TURNS: usize = 18;

/// The pid in a lease's holder, `{host}-{pid}-{nonce}-{claim}`.
fn pid_of(holder: &str) -> Option<u32> {
    holder.rsplit('-').nth(2)?.parse().ok()
}

/// One request of conversation `id` to `proxy`; `None` when it is down or stalled.
async fn try_chat(proxy: &Proxy, id: &str, messages: &[Value]) -> Option<Whole> {
    let body = json!({"model": "strict", "messages": messages}).to_string();
    let headers = [
        ("content-type", "application/json"),
        ("x-handoff-conversation-id", id),
        ("authorization", "Bearer sk-x"),
    ];
    let sent = request("POST", &format!("{}{CHAT}", proxy.url()), &headers, body);
    try_send(sent, Duration::from_secs(60)).await
}

/// Sends `messages` until a replica answers 200, starting at replica `first` and moving
/// on past one that is down (killed) or answers 503 (the database restarting).
async fn answered(replicas: &[Proxy], id: &str, messages: &[Value], first: usize) -> Value {
    for attempt in 0..120 {
        let proxy = &replicas[(first + attempt) % replicas.len()];
        match try_chat(proxy, id, messages).await {
            Some(got) if got.status == 200 => return got.json()["choices"][0]["message"].clone(),
            Some(got) => assert_eq!(got.status, 503, "{id}: {}", got.text()),
            None => {}
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("{id}: no replica answered");
}

/// An agent conversation of [`TURNS`] turns, each request to the next replica.
async fn converse(replicas: Arc<Vec<Proxy>>, id: String, offset: usize) {
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut sent = offset;
    for n in 0..TURNS {
        messages.push(big_user(n, 300));
        loop {
            let reply = answered(&replicas, &id, &messages, sent).await;
            sent += 1;
            let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
            messages.push(reply);
            match call {
                Some(call) => {
                    messages.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}))
                }
                None => break,
            }
        }
    }
}

/// Waits for a live compaction lease of one of `replicas` whose summary call is under
/// way (a call is counted on the lease before it is made); the index of its replica
/// and its holder.
async fn holding_a_lease(db: &Postgres, replicas: &[Proxy]) -> (usize, String) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        assert!(Instant::now() < deadline, "no replica ever held a lease");
        let calling =
            db.sql("SELECT holder FROM handoff_leases WHERE expires_at > now() AND calls > 0");
        let held = calling.lines().find_map(|holder| {
            let pid = pid_of(holder)?;
            let replica = replicas.iter().position(|r| r.pid() == pid)?;
            Some((replica, holder.to_owned()))
        });
        if let Some(held) = held {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until no compaction lease is live: every run has ended (a dead replica's claim
/// expires 3 s after its last renewal and is taken over, or stays named on its row).
async fn runs_ended(db: &Postgres) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while db.count("SELECT count(*) FROM handoff_leases WHERE expires_at > now()") > 0 {
        assert!(Instant::now() < deadline, "a compaction never ended");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_replicas_under_a_kill_and_a_database_restart_account_for_every_summary_call() {
    let db = Arc::new(Postgres::start());
    let strict = Strict::new(4096);
    let answering = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| {
        let reply = answering.answer(request);
        if is_summary(&request.json()) {
            reply.delayed(SUMMARY_TAKES)
        } else {
            reply
        }
    })
    .await;
    let store = db.store_toml("lease_ttl = \"3s\"\n");
    let replicas: Arc<Vec<Proxy>> = Arc::new(
        (0..REPLICAS)
            .map(|_| Proxy::start_with(&mock.url(), options(4096, &format!("{CONFIG}{store}"))))
            .collect(),
    );
    let conversations: Vec<_> = (0..CONVERSATIONS)
        .map(|k| tokio::spawn(converse(Arc::clone(&replicas), format!("once-{k}"), k)))
        .collect();

    // A replica is killed while it holds a claim, and the database restarts at once.
    let (killed, orphaned) = holding_a_lease(&db, &replicas).await;
    let status = std::process::Command::new("kill")
        .args(["-9", &replicas[killed].pid().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let restarting = Arc::clone(&db);
    tokio::task::spawn_blocking(move || restarting.ctl_restart_immediate())
        .await
        .unwrap();

    for conversation in conversations {
        conversation.await.unwrap();
    }
    runs_ended(&db).await;

    let made = strict.summaries.load(Ordering::SeqCst) as u64;
    let records: Vec<Value> = db
        .sql("SELECT record FROM handoff_compactions ORDER BY seq")
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let recorded: u64 = records
        .iter()
        .filter_map(|r| r["summary_calls"].as_u64())
        .sum();
    let took_over: Vec<&Value> = records.iter().filter_map(|r| r.get("took_over")).collect();
    let taken_over_calls: u64 = took_over.iter().filter_map(|t| t["calls"].as_u64()).sum();
    // Claims not taken over since: each row names its holder and keeps its calls.
    let waiting: u64 = db
        .sql("SELECT coalesce(sum(calls), 0) FROM handoff_leases")
        .trim()
        .parse()
        .unwrap();
    eprintln!(
        "ONCE-ROW {made} summary calls, {} committed compactions holding {recorded}, {} orphans taken over holding {taken_over_calls}, {waiting} on claims",
        records.len(),
        took_over.len()
    );
    assert!(
        made > 0 && recorded > 0,
        "{made} calls, {recorded} recorded"
    );
    assert!(
        made <= recorded + taken_over_calls + waiting,
        "{made} summary calls; {recorded} in {} records, {taken_over_calls} in orphans taken over ({took_over:?}), {waiting} on claims",
        records.len()
    );
    // The killed replica's claim is named: taken over by a record, or still on its row.
    let named = took_over.iter().any(|t| t["holder"] == orphaned.as_str())
        || !db
            .sql(&format!(
                "SELECT 1 FROM handoff_leases WHERE holder = '{orphaned}'"
            ))
            .trim()
            .is_empty();
    assert!(named, "the killed replica's claim {orphaned} is named");
    // And the replica that took an orphan over said so, naming it.
    let logs: String = (replicas.iter().enumerate())
        .filter(|(i, _)| *i != killed)
        .map(|(_, r)| r.logs())
        .collect();
    for orphan in &took_over {
        let holder = orphan["holder"].as_str().unwrap();
        assert!(
            logs.contains("took over an orphaned compaction lease") && logs.contains(holder),
            "{holder} is named in the logs"
        );
    }
    // No span compacted twice: each conversation's records form one chain, none built
    // on a basis (a compaction, or the originals) another record was built on.
    let forks = db.sql(
        "SELECT conversation, record::json -> 'source' ->> 'previous_compaction', count(*)
           FROM handoff_compactions GROUP BY 1, 2 HAVING count(*) > 1",
    );
    assert_eq!(forks.trim(), "", "spans compacted twice");
    assert!(strict.over_window.lock().unwrap().is_empty());
    assert!(strict.broken_pairs.lock().unwrap().is_empty());
}
