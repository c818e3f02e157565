//! The shared PostgreSQL store: several replicas (separate processes and data dirs)
//! on one real database, compacting once, surviving a crash and a database restart,
//! and a disk data dir moved into the database.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mock_upstream::strict::Strict;
use mock_upstream::{MockUpstream, Recorded, Reply};
use serde_json::{json, Value};
use support::postgres::Postgres;
use support::scenario::{agent_requests, agent_turn, big_user, chat, fact_history, options};
use support::{canonical, read_tree, Proxy};

/// Summaries by a 16k model, with time to finish.
const SUMMARY_16K: &str =
    "[compaction]\nsummary_model = \"strict-16k\"\nsummary_timeout = \"20s\"\n";

fn is_summary(request: &Recorded) -> bool {
    mock_upstream::strict::is_summary(&request.json())
}

/// A strict provider whose first `slow` summary calls wait `delay` first.
async fn strict_with_slow_summaries(
    window: u64,
    slow: usize,
    delay: Duration,
) -> (Arc<Strict>, MockUpstream) {
    let strict = Strict::new(window);
    let responder = Arc::clone(&strict);
    let seen = AtomicUsize::new(0);
    let mock = MockUpstream::with(move |req| {
        let answer = responder.answer(req);
        if is_summary(req) && seen.fetch_add(1, Ordering::SeqCst) < slow {
            return Reply::Delayed {
                delay,
                then: Box::new(answer),
            };
        }
        answer
    })
    .await;
    (strict, mock)
}

/// A replica on `db`: its own process and data dir.
fn replica(mock: &MockUpstream, db: &Postgres, extra: &str) -> Proxy {
    replica_with(mock, db, "", extra)
}

/// A replica with `compaction` keys after [`SUMMARY_16K`]'s and `store` keys after the
/// database's.
fn replica_with(mock: &MockUpstream, db: &Postgres, compaction: &str, store: &str) -> Proxy {
    Proxy::start_with(
        &mock.url(),
        options(
            4096,
            &format!("{SUMMARY_16K}{compaction}{}", db.store_toml(store)),
        ),
    )
}

/// Every request waits for the one summary: no stand-in past `compaction.max_wait`.
const WAIT_FOR_SUMMARIES: &str = "max_wait = \"60s\"\n";

fn compactions(db: &Postgres) -> u64 {
    db.count("SELECT count(*) FROM handoff_compactions")
}

/// Handoff texts of every committed compaction.
fn handoffs(db: &Postgres) -> Vec<String> {
    db.sql("SELECT record FROM handoff_compactions ORDER BY seq")
        .lines()
        .map(|line| {
            let record: Value = serde_json::from_str(line).unwrap();
            record["handoff"]["content"].as_str().unwrap().to_owned()
        })
        .collect()
}

/// The figures a listing reads from the database's summaries are those the logs give:
/// `GET /handoff/conversations` and `audit list` against each conversation's own page.
async fn assert_listing_matches_logs(proxy: &Proxy) {
    let get = |path: String| async move {
        support::client::send(support::client::request("GET", &path, &[], ""))
            .await
            .json()
    };
    let page = get(format!("{}/handoff/conversations?limit=500", proxy.url())).await;
    let listed = page["data"].as_array().unwrap().clone();
    assert!(!listed.is_empty(), "{page}");
    assert_eq!(
        proxy.conversations(),
        listed,
        "audit list and the admin API list alike"
    );
    for summary in &listed {
        let (id, tenant) = (&summary["id"], &summary["tenant"]);
        let mut own = get(format!(
            "{}/handoff/conversations/{}?tenant={}",
            proxy.url(),
            id.as_str().unwrap(),
            tenant.as_str().unwrap()
        ))
        .await;
        own.as_object_mut().unwrap().remove("branch_tips");
        assert_eq!(summary, &own, "listed counts of {id} differ from its log");
    }
}

/// Appends `got`'s reply to `messages`, and a result for the tool it calls, if any;
/// true when it called one.
fn answer(messages: &mut Vec<Value>, got: &support::client::Whole) -> bool {
    let reply = got.json()["choices"][0]["message"].clone();
    let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
    messages.push(reply);
    if let Some(call) = &call {
        messages.push(json!({"role": "tool", "tool_call_id": call, "content": "done"}));
    }
    call.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_listing_counts_what_the_logs_hold_and_a_recount_agrees() {
    let db = Postgres::start();
    let (_strict, mock) = strict_with_slow_summaries(4096, 0, Duration::ZERO).await;
    let proxy = replica(&mock, &db, "");
    // Several new messages at once (one run row), two models, an edited turn (a second
    // branch), a repeat (its reply a third), and compactions.
    let mut messages = vec![
        json!({"role": "system", "content": "be brief"}),
        json!({"role": "user", "content": "first"}),
        json!({"role": "assistant", "content": "noted"}),
        json!({"role": "user", "content": "second"}),
    ];
    for (n, model) in ["strict", "strict-16k", "strict"].iter().enumerate() {
        let got = support::scenario::chat_as(&proxy, "counted", model, &messages).await;
        assert_eq!(got.status, 200, "turn {n}: {}", got.text());
        answer(&mut messages, &got);
        messages.push(json!({"role": "user", "content": format!("turn {n}")}));
    }
    let mut edited = messages[..4].to_vec();
    edited.push(json!({"role": "user", "content": "second, edited"}));
    assert_eq!(chat(&proxy, "counted", &edited).await.status, 200);
    assert_eq!(chat(&proxy, "counted", &edited).await.status, 200);
    let mut long = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..30 {
        if compactions(&db) >= 2 {
            break;
        }
        long.push(big_user(n, 300));
        let got = chat(&proxy, "compacted", &long).await;
        assert_eq!(got.status, 200, "turn {n}: {}", got.text());
        if answer(&mut long, &got) {
            long.push(json!({"role": "assistant", "content": "ok"}));
        }
    }
    assert!(compactions(&db) >= 2);
    assert_listing_matches_logs(&proxy).await;
    let listed = proxy.conversations();
    let counted = listed.iter().find(|c| c["id"] == "counted").unwrap();
    // The last reply of the first line, and one per answer to the edited turn (its
    // repeat logs no request message, but a second reply beside the first).
    assert_eq!(counted["branches"], 3, "{counted}");
    assert_eq!(counted["models"], json!(["strict", "strict-16k"]));

    // The migration counts logs written before it the same way.
    let before = proxy.conversations();
    db.sql("DELETE FROM handoff_summaries");
    db.sql("SELECT handoff_recount(NULL, NULL)");
    assert_eq!(proxy.conversations(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_share_one_conversation_and_its_compactions() {
    let db = Postgres::start();
    let (strict, mock) = strict_with_slow_summaries(4096, 0, Duration::ZERO).await;
    let replicas = [replica(&mock, &db, ""), replica(&mock, &db, "")];

    // Turns alternate between replicas, and a tool result goes to the other replica
    // than the call it answers: every echo crosses processes.
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut sent = 0;
    for n in 0..24 {
        messages.push(big_user(n, 300));
        let got = chat(&replicas[sent % 2], "shared", &messages).await;
        sent += 1;
        assert_eq!(got.status, 200, "turn {n}: {}", got.text());
        let reply = got.json()["choices"][0]["message"].clone();
        if let Some(call) = reply["tool_calls"][0]["id"].as_str() {
            // Echoed as SDKs do, in another form of the same message: only the replica
            // that logged the reply knows that form until the other reads the database.
            let mut echo = reply.clone();
            echo["content"] = json!("");
            messages.push(echo);
            messages.push(
                json!({"role": "tool", "tool_call_id": call, "content": format!("result {n}")}),
            );
            let got = chat(&replicas[sent % 2], "shared", &messages).await;
            sent += 1;
            assert_eq!(got.status, 200, "turn {n} tool: {}", got.text());
            messages.push(got.json()["choices"][0]["message"].clone());
        } else {
            messages.push(reply);
        }
    }
    let committed = compactions(&db);
    assert!(
        committed >= 2,
        "the conversation compacted {committed} times"
    );
    assert!(strict.broken_pairs.lock().unwrap().is_empty());
    assert!(strict.over_window.lock().unwrap().is_empty());

    // Between compactions each view extends the one before; where it does not, the
    // later view carries a handoff that a replica committed.
    let texts = handoffs(&db);
    let views: Vec<Vec<Value>> = agent_requests(&mock)
        .iter()
        .map(|r| {
            r.json()["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(canonical)
                .collect()
        })
        .collect();
    let mut breaks = 0;
    for pair in views.windows(2) {
        let (before, after) = (&pair[0], &pair[1]);
        if after.len() > before.len() && after[..before.len()] == before[..] {
            continue;
        }
        breaks += 1;
        assert!(
            after
                .iter()
                .any(|m| texts.iter().any(|t| m["content"] == json!(t))),
            "a view that does not extend the previous one carries no committed handoff"
        );
    }
    assert!(
        breaks >= 1 && breaks as u64 <= committed,
        "{breaks} breaks for {committed} compactions"
    );

    // One conversation, one branch, replayed exactly from either replica.
    for proxy in &replicas {
        let listed = proxy.conversations();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(
            listed[0]["branches"], 1,
            "echoes across replicas must not fork"
        );
        // The replay is the last request as the client sent it, its echoes of the
        // replies included, then the reply to it.
        let replayed: Vec<Value> = proxy.replay("shared", None).iter().map(canonical).collect();
        let expected: Vec<Value> = messages.iter().map(canonical).collect();
        assert_eq!(replayed, expected);
        proxy.assert_verified(&[]);
        // Each request's decision is in the database, whichever replica decided it:
        // the timeline draws the proxy's numbers, next to the provider's count.
        let timeline = support::client::send(support::client::request(
            "GET",
            &format!(
                "{}/handoff/conversations/shared/timeline?limit=2000",
                proxy.url()
            ),
            &[],
            "",
        ))
        .await
        .json();
        let requests: Vec<&Value> = timeline["chart"].as_array().unwrap().iter().collect();
        assert_eq!(requests.len(), sent);
        for (figures, body) in requests.iter().zip(agent_requests(&mock)) {
            assert_eq!(figures["estimated"], false, "{figures}");
            assert_eq!(figures["trigger"], timeline["trigger_tokens"]);
            assert_eq!(figures["provider_tokens"], Strict::count(&body.json()));
        }
        // The database is the system of record: no conversation under data_dir.
        let files: Vec<_> = read_tree(&proxy.data_dir())
            .into_iter()
            .map(|(path, _)| path)
            .collect();
        assert!(files.is_empty(), "written under data_dir: {files:?}");
        assert_listing_matches_logs(proxy).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_identical_requests_over_two_replicas_compact_once() {
    let db = Postgres::start();
    let (strict, mock) = strict_with_slow_summaries(4096, 1, Duration::from_secs(2)).await;
    let replicas = Arc::new([
        replica_with(&mock, &db, WAIT_FOR_SUMMARIES, ""),
        replica_with(&mock, &db, WAIT_FOR_SUMMARIES, ""),
    ]);
    let messages = fact_history(json!({"role": "assistant", "content": "noted"}));

    let mut tasks = Vec::new();
    for n in 0..16 {
        let (replicas, messages) = (Arc::clone(&replicas), messages.clone());
        tasks.push(tokio::spawn(async move {
            chat(&replicas[n % 2], "burst", &messages).await
        }));
    }
    for task in tasks {
        let got = task.await.unwrap();
        assert_eq!(got.status, 200, "{}", got.text());
    }
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        1,
        "one summary call"
    );
    assert_eq!(compactions(&db), 1, "one compaction");
    assert!(strict.over_window.lock().unwrap().is_empty());
    let handoff = &handoffs(&db)[0];
    for request in agent_requests(&mock) {
        assert!(
            request
                .json()
                .to_string()
                .contains(&json!(handoff).to_string()[1..20]),
            "every request went with the one handoff"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_mid_summary_is_taken_over_after_its_lease_expires() {
    let db = Postgres::start();
    let (_strict, mock) = strict_with_slow_summaries(4096, 1, Duration::from_secs(30)).await;
    // Long enough that the retry, on a loaded machine, still finds the lease held.
    let lease = "lease_ttl = \"6s\"\n";
    let mut first = replica_with(&mock, &db, WAIT_FOR_SUMMARIES, lease);
    let second = replica_with(&mock, &db, WAIT_FOR_SUMMARIES, lease);
    let messages = fact_history(json!({"role": "assistant", "content": "noted"}));

    // A raw connection: the request dies with its replica, and that is expected.
    let body = json!({"model": "strict", "messages": messages}).to_string();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\nauthorization: Bearer sk-x\r\nx-handoff-conversation-id: crash\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    let mut doomed = tokio::net::TcpStream::connect(first.addr()).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut doomed, format!("{head}{body}").as_bytes())
        .await
        .unwrap();
    // The first replica holds the lease and waits on its summary call.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !mock.requests().iter().any(is_summary) {
        assert!(std::time::Instant::now() < deadline, "no summary call");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        db.count("SELECT count(*) FROM handoff_leases WHERE expires_at > now()"),
        1
    );
    first.kill9();
    let mut answer = Vec::new();
    let _ = tokio::io::AsyncReadExt::read_to_end(&mut doomed, &mut answer).await;
    assert!(answer.is_empty(), "the killed replica answered nothing");

    let got = chat(&second, "crash", &messages).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(
        second
            .logs()
            .contains("another replica holds the compaction lease"),
        "the retry waited for the dead replica's lease"
    );
    assert_eq!(compactions(&db), 1, "exactly one compaction");
    assert_eq!(
        db.count("SELECT max(epoch) FROM handoff_leases"),
        2,
        "the second replica claimed with a higher epoch"
    );
    assert_eq!(mock.requests().iter().filter(|r| is_summary(r)).count(), 2);
    // The record holds its own call and names the dead replica's claim, with its call.
    let record: Value =
        serde_json::from_str(&db.sql("SELECT record FROM handoff_compactions")).unwrap();
    assert_eq!(record["summary_calls"], 1);
    assert_eq!(record["took_over"]["epoch"], 1);
    assert_eq!(record["took_over"]["calls"], 1);
    let orphan = record["took_over"]["holder"].as_str().unwrap();
    assert!(second.logs().contains(orphan), "the takeover is logged");
    second.assert_verified(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_restart_gives_503_then_service_resumes_and_nothing_acknowledged_is_lost() {
    let db = Postgres::start();
    let mock = MockUpstream::with(|_| Reply::chat_text("ok")).await;
    let proxy = Proxy::start_with(&mock.url(), options(1_000_000, &db.store_toml("")));
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut acknowledged = Vec::new();
    let mut turn = 0;
    let mut ask = |messages: &mut Vec<Value>| {
        turn += 1;
        messages.push(json!({"role": "user", "content": format!("turn {turn}")}));
        messages.clone()
    };

    for _ in 0..5 {
        let request = ask(&mut messages);
        let got = chat(&proxy, "restart", &request).await;
        assert_eq!(got.status, 200, "{}", got.text());
        messages.push(got.json()["choices"][0]["message"].clone());
        acknowledged.push(request.last().unwrap().clone());
    }

    // Light load across an immediate restart: whatever was acknowledged is kept.
    db.ctl_restart_immediate();
    db.ctl_stop_immediate();
    let request = ask(&mut messages);
    let got = chat(&proxy, "restart", &request).await;
    assert_eq!(got.status, 503, "{}", got.text());
    assert_eq!(
        got.json()["error"]["type"],
        "storage_error",
        "{}",
        got.text()
    );
    messages.pop();
    db.ctl_start();

    let mut resumed = false;
    for _ in 0..20 {
        let request = ask(&mut messages);
        let got = chat(&proxy, "restart", &request).await;
        if got.status == 200 {
            messages.push(got.json()["choices"][0]["message"].clone());
            acknowledged.push(request.last().unwrap().clone());
            resumed = true;
            break;
        }
        assert_eq!(got.status, 503, "{}", got.text());
        messages.pop();
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(resumed, "requests succeed again once the database is back");
    proxy.assert_kept("restart", &acknowledged);
}

/// A config beside `disk`'s whose store is `db`, for `store copy --to-config`.
fn postgres_config(disk: &Proxy, mock: &MockUpstream, db: &Postgres) -> std::path::PathBuf {
    let config = disk.dir().join("postgres.toml");
    std::fs::write(
        &config,
        support::render_config(&mock.url(), &disk.dir().join("unused"), &db.store_toml("")),
    )
    .unwrap();
    config
}

/// `handoff store copy` of `disk`'s data dir into the store of `config`, with `extra`.
fn store_copy(disk: &Proxy, config: &std::path::Path, extra: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(["store", "copy", "--from-data-dir"])
        .arg(disk.data_dir())
        .arg("--to-config")
        .arg(config)
        .args(extra)
        .output()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_copy_moves_a_data_dir_into_the_database_idempotently() {
    let (_strict, mock) = strict_with_slow_summaries(4096, 0, Duration::ZERO).await;
    let disk = Proxy::start_with(
        &mock.url(),
        support::scenario::inline_compaction(options(4096, SUMMARY_16K)),
    );
    let history = support::scenario::drive_until_compaction(&disk, "moved", 300, 30).await;
    let disk_replay = disk.replay("moved", None);
    let db = Postgres::start();
    let config = postgres_config(&disk, &mock, &db);
    let copy = || {
        let out = store_copy(&disk, &config, &[]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(copy().contains("copied 1 conversation(s)"));
    assert!(
        copy().contains("copied 0 conversation(s)"),
        "a second copy writes nothing"
    );
    assert_eq!(compactions(&db), 1);

    let audit = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_handoff"))
            .arg("audit")
            .args(args)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap()
    };
    let verify = audit(&["verify"]);
    assert!(
        verify.status.success(),
        "{}",
        String::from_utf8_lossy(&verify.stdout)
    );
    let replay: Vec<Value> = serde_json::from_slice(&audit(&["replay", "moved"]).stdout).unwrap();
    assert_eq!(replay, disk_replay);
    assert_eq!(replay.len(), history.len());
    let listed: Vec<Value> = String::from_utf8_lossy(&audit(&["list", "--json"]).stdout)
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    let on_disk = disk.conversations();
    assert_eq!(
        listed, on_disk,
        "a copied conversation is counted as on disk"
    );

    // A replica on the database continues the conversation with the copied handoff.
    let replica = replica(&mock, &db, "");
    let mut messages = history.clone();
    messages.push(json!({"role": "user", "content": "and now?"}));
    let got = chat(&replica, "moved", &messages).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let last = agent_requests(&mock).pop().unwrap().json().to_string();
    let handoff = &handoffs(&db)[0];
    assert!(
        last.contains(&json!(handoff).to_string()[1..20]),
        "the copied handoff is used"
    );
}

/// A log that does not verify stops a copy before anything is written: a copy that
/// kept what reads as lines and dropped the rest would keep lines a client planted
/// in an old log and drop the real ones. `--allow-problems` copies it, and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_copy_refuses_a_log_that_does_not_verify() {
    let mock = MockUpstream::with(|_| Reply::chat_text("fine")).await;
    let disk = Proxy::start(&mock.url());
    for id in ["sound", "torn"] {
        let got = chat(&disk, id, &[json!({"role": "user", "content": id})]).await;
        assert_eq!(got.status, 200, "{}", got.text());
    }
    // A line of an old log torn by a planted break: its pieces read as nothing.
    let torn = disk.conversation_dir("torn").join("messages.jsonl");
    let mut text = std::fs::read_to_string(&torn).unwrap();
    text.push_str("{\"v\":1,\"at\":\"t\",\"kind\":\"message\",\"pad\":[\n\"x\"]}\n");
    std::fs::write(&torn, text).unwrap();

    let db = Postgres::start();
    let config = postgres_config(&disk, &mock, &db);
    let copy = |extra: &[&str]| store_copy(&disk, &config, extra);
    let refused = copy(&[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success(), "{stderr}");
    assert!(stderr.contains("/torn: line"), "names the log: {stderr}");
    assert!(!stderr.contains("/sound"), "{stderr}");
    assert_eq!(
        db.count("SELECT count(*) FROM handoff_conversations"),
        0,
        "nothing copied"
    );

    let allowed = copy(&["--allow-problems"]);
    let stdout = String::from_utf8_lossy(&allowed.stdout);
    assert!(
        allowed.status.success(),
        "{}",
        String::from_utf8_lossy(&allowed.stderr)
    );
    assert!(stdout.contains("copied 2 conversation(s)"), "{stdout}");
    assert!(
        stdout.contains("1 that did not verify, 2 unreadable line(s) skipped"),
        "{stdout}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_api_key_reaches_the_database() {
    let db = Postgres::start();
    let (_strict, mock) = strict_with_slow_summaries(4096, 0, Duration::ZERO).await;
    let proxy = replica(&mock, &db, "");
    let key = "sk-live-0123456789abcdefPGDUMP";
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..16 {
        messages.push(big_user(n, 300));
        let got = support::scenario::post_chat(
            &proxy,
            &[
                ("authorization", &format!("Bearer {key}")),
                ("x-api-key", key),
            ],
            &json!({"model": "strict", "messages": messages}),
        )
        .await;
        assert_eq!(got.status, 200, "{}", got.text());
        let reply = got.json()["choices"][0]["message"].clone();
        messages.push(reply.clone());
        if let Some(call) = reply["tool_calls"][0]["id"].as_str() {
            messages.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}));
        }
    }
    assert!(compactions(&db) >= 1, "summaries ran with the key");
    let dump = db.dump();
    assert!(dump.contains("handoff_lines"), "the dump has the log");
    for needle in [key, "0123456789abcdefPGDUMP", "Bearer"] {
        assert!(!dump.contains(needle), "{needle} is in the pg_dump");
    }
    assert!(!proxy.logs().contains(key));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_that_must_cut_twice_commits_both_pairs_under_one_lease() {
    let db = Postgres::start();
    let strict = Strict::new(4096);
    // Handoffs far longer than the budget planned for: after the first pair the view
    // is still over the trigger, and the run cuts again under the same lease.
    strict.set_summary_padding(1600);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |req| responder.answer(req)).await;
    // Inline: the request over the trigger runs the compaction itself (preparing, it
    // would be sent as it is while the run goes on). A quarter of the budget recent, so
    // the long handoff leaves the view over the trigger.
    let proxy = replica_with(&mock, &db, "prepare_at = 0\nkeep_recent = 0.25\n", "");
    let mut messages = fact_history(json!({"role": "assistant", "content": "noted"}));
    messages.pop();
    for n in 6..9 {
        messages.push(big_user(n, 500));
        messages.push(json!({"role": "assistant", "content": "noted"}));
    }
    messages.push(json!({"role": "user", "content": "what were the facts?"}));
    let got = chat(&proxy, "twice", &messages).await;
    let records = compactions(&db);
    assert_eq!(got.status, 200, "{} ({records} records)", got.text());
    assert_eq!(records, 2, "two pairs for one request");
    assert_eq!(
        db.count("SELECT max(epoch) FROM handoff_leases"),
        1,
        "under one claim"
    );
    proxy.assert_verified(&[]);
    assert_listing_matches_logs(&proxy).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstream_objects_keep_their_owner_on_every_replica() {
    let db = Postgres::start();
    let mock = MockUpstream::with(|request| {
        if request.method == "POST" && request.target == "/v1/files" {
            return Reply::json(
                json!({"id": "file-shared1", "object": "file", "purpose": "batch"}),
            );
        }
        Reply::json(json!({"id": "file-shared1", "object": "file"}))
    })
    .await;
    let sha = |key: &str| {
        use sha2::Digest;
        sha2::Sha256::digest(key.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    let toml = format!(
        "[upstream]\napi_key_env = \"SHARED_KEY_FOR_TEST\"\n\
         [[auth.keys]]\nname = \"team-a\"\nsha256 = \"{}\"\n\
         [[auth.keys]]\nname = \"team-b\"\nsha256 = \"{}\"\n{}",
        sha("hk-pg-team-a-1111"),
        sha("hk-pg-team-b-2222"),
        db.store_toml("")
    );
    let start = || {
        Proxy::start_with(
            &mock.url(),
            support::ProxyOptions {
                extra_toml: toml.clone(),
                env: vec![(
                    "SHARED_KEY_FOR_TEST".into(),
                    "sk-shared-upstream-3333".into(),
                )],
                ..Default::default()
            },
        )
    };
    let (one, two) = (start(), start());
    let upload = support::client::send(support::client::request(
        "POST",
        &format!("{}/v1/files", one.url()),
        &[
            ("authorization", "Bearer hk-pg-team-a-1111"),
            ("content-type", "multipart/form-data; boundary=B"),
        ],
        "--B\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--B--\r\n",
    ))
    .await;
    assert_eq!(upload.status, 200, "{}", upload.text());
    let fetch = |proxy: &Proxy, key: &str| {
        support::client::send(support::client::request(
            "GET",
            &format!("{}/v1/files/file-shared1", proxy.url()),
            &[("authorization", &format!("Bearer {key}"))],
            "",
        ))
    };
    assert_eq!(
        fetch(&two, "hk-pg-team-a-1111").await.status,
        200,
        "the owner, on the other replica"
    );
    assert_eq!(fetch(&two, "hk-pg-team-b-2222").await.status, 404);
    assert_eq!(
        db.count("SELECT count(*) FROM handoff_objects WHERE tenant = 'team-a'"),
        1
    );
}

/// One user turn on `proxy`; true when the view sent for it opened with the pair.
async fn turn_on(proxy: &Proxy, mock: &MockUpstream, messages: &mut Vec<Value>, n: usize) -> bool {
    agent_turn(proxy, "shared", messages, big_user(n, 150)).await;
    agent_requests(mock).last().is_some_and(|sent| {
        sent.json()["messages"][1]["content"]
            .as_str()
            .is_some_and(|text| text.starts_with("Continue from the compacted state"))
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compaction_prepared_on_one_replica_is_adopted_on_another() {
    let db = Postgres::start();
    let (strict, mock) = strict_with_slow_summaries(4096, 0, Duration::ZERO).await;
    // A fixed mark: with "auto", B (which has not seen the conversation grow) may judge
    // A's record prepared too early and prepare again on top of it.
    let fixed = "prepare_at = 0.8\n";
    let a = replica_with(&mock, &db, fixed, "");
    let b = replica_with(&mock, &db, fixed, "");
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut n = 0;
    // On A, up to the mark: the compaction is prepared there, and nothing is adopted.
    while compactions(&db) == 0 {
        assert!(n < 40, "nothing was prepared on A");
        assert!(
            !turn_on(&a, &mock, &mut messages, n).await,
            "adopted before the trigger"
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let record: Value = serde_json::from_str(
        db.sql("SELECT record FROM handoff_compactions")
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(record["reason"], "prepared", "{record}");
    // On B, until the trigger is crossed: B adopts what A prepared, without a summary.
    let mut adopted = false;
    while !adopted {
        assert!(n < 80, "B never crossed the trigger");
        adopted = turn_on(&b, &mock, &mut messages, n).await;
        n += 1;
    }
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        1,
        "one summary, on A"
    );
    assert_eq!(compactions(&db), 1);
    assert_eq!(
        db.count("SELECT count(*) FROM handoff_lines WHERE kind = 'adopt'"),
        1,
        "B logged the adoption"
    );
    let last = agent_requests(&mock).pop().unwrap().json().to_string();
    assert!(last.contains(&json!(record["handoff"]["content"]).to_string()[1..40]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_body_shape_writes_more_than_one_and_a_half_times_its_size_in_postgres() {
    let db = Postgres::start();
    let mock =
        MockUpstream::with(|request| support::shapes::reply_for(request.target.as_str())).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        support::ProxyOptions {
            extra_toml: db.store_toml(""),
            ..Default::default()
        },
    );
    // Every table's heap, TOAST and indexes, after a checkpoint of what the last
    // request wrote.
    let stored = || {
        db.count(
            "SELECT sum(pg_total_relation_size(c.oid))::bigint FROM pg_class c \
             WHERE c.relkind = 'r' AND c.relname LIKE 'handoff_%'",
        )
    };
    let mut report = Vec::new();
    for (n, (shape, path, body)) in support::shapes::amplifying_bodies().into_iter().enumerate() {
        let before = stored();
        let key = format!("sk-client-shape-{n}");
        let got = support::client::send(support::client::request(
            "POST",
            &format!("{}{path}", proxy.url()),
            &[
                ("content-type", "application/json"),
                ("authorization", &format!("Bearer {key}")),
                ("x-api-key", &key),
            ],
            body.clone(),
        ))
        .await;
        assert_eq!(got.status, 200, "{shape}: {}", got.text());
        let written = stored().saturating_sub(before);
        report.push((shape, body.len(), written));
    }
    let table: Vec<String> = report
        .iter()
        .map(|(shape, body, written)| {
            format!(
                "{shape}: {body} bytes of body stored {written} ({:.2}x)",
                *written as f64 / *body as f64
            )
        })
        .collect();
    eprintln!("{}", table.join("\n"));
    assert!(
        report
            .iter()
            .all(|(_, body, written)| *written as f64 <= 1.5 * *body as f64),
        "past 1.5 bytes stored per byte of body:\n{}",
        table.join("\n")
    );
}

/// Two replicas take turns serving a client that re-sends each tool call compacted
/// and its turn without a reminder: the database keeps each form once, and any
/// request is rebuilt byte for byte from either replica.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_sent_forms_over_two_replicas_replay_as_the_client_sent_them() {
    let db = Postgres::start();
    let mock = support::forms::spaced_tool_caller().await;
    let replicas = [replica(&mock, &db, ""), replica(&mock, &db, "")];
    let mut messages: Vec<String> =
        vec![r#"{"role":"user","content":"List the files.\n\nReply in English."}"#.into()];
    let mut sent = Vec::new();
    for n in 0..6 {
        sent.push(messages.clone());
        support::forms::turn(&replicas[n % 2].url(), "forms-pg", &mut messages).await;
        if n == 0 {
            // From now on the turn goes without the reminder, as aider sends it.
            messages[0] = r#"{"role":"user","content":"List the files."}"#.into();
        }
    }
    // Written once each: as form lines, or (shorter) inside the request that sent them.
    let forms = db.count("SELECT count(*) FROM handoff_lines WHERE kind = 'form'")
        + db.count(
            "SELECT coalesce(sum(json_array_length(line::json -> 'inline_forms')), 0)::int8
             FROM handoff_lines WHERE kind = 'request'",
        );
    assert_eq!(forms, 6, "the turn once, each of five calls once");
    for (n, request) in sent.iter().enumerate() {
        let number = (n + 1).to_string();
        let replay =
            replicas[(n + 1) % 2].replay_raw(&["replay", "forms-pg", "--request", &number]);
        assert_eq!(replay[..request.len()], request[..], "request {number}");
    }
    replicas[0].assert_verified(&["forms-pg"]);
    assert_listing_matches_logs(&replicas[1]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn while_one_replica_prepares_another_sends_a_view_that_fits_without_waiting() {
    let db = Postgres::start();
    // The first summary takes 10 s: A's preparation is running all along.
    let (strict, mock) = strict_with_slow_summaries(4096, 1, Duration::from_secs(10)).await;
    let a = replica(&mock, &db, "");
    let b = replica(&mock, &db, "");
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut n = 0;
    // On A, until its preparation has called the summariser.
    while !mock.requests().iter().any(is_summary) {
        assert!(n < 40, "nothing was prepared on A");
        turn_on(&a, &mock, &mut messages, n).await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // On B, past the trigger while A still summarises: each turn is sent at once.
    let crossed = |db: &Postgres| {
        db.count(
            "SELECT count(*) FROM handoff_lines WHERE kind = 'decision' \
             AND line LIKE '%\"over\":\"sent_while_preparing\"%'",
        )
    };
    while crossed(&db) == 0 {
        assert!(n < 80, "B never crossed the trigger");
        let started = std::time::Instant::now();
        turn_on(&b, &mock, &mut messages, n).await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "B waited for A's summary: {:?}",
            started.elapsed()
        );
        n += 1;
    }
    assert_eq!(compactions(&db), 0, "A's summary has not landed yet");
    assert_eq!(strict.summaries.load(Ordering::SeqCst), 1, "B started none");
    let metrics = b.metrics().await;
    assert!(
        metrics.contains("handoff_sent_while_preparing_total 1"),
        "{metrics}"
    );
    assert!(strict.over_window.lock().unwrap().is_empty());
}

/// A compaction handle one replica minted (serving the Responses API's compaction for
/// an upstream without it) is opened by another replica, and by a fresh one after
/// both stopped: the secret that seals it lives in the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_one_replica_minted_opens_on_another_and_after_a_restart() {
    use support::handles::{go_on, mint, SERVED};
    let db = Postgres::start();
    let strict = mock_upstream::responses::StrictResponses::new(6000);
    strict.set_native(false);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| responder.answer(request)).await;
    let start = || {
        Proxy::start_with(
            &mock.url(),
            support::ProxyOptions {
                extra_toml: format!("{SERVED}{}", db.store_toml("")),
                ..Default::default()
            },
        )
    };
    let (one, two) = (start(), start());
    let item = mint(&one).await;
    let read = |what: &str| {
        let last = mock.requests().last().unwrap().json();
        let input = last["input"].to_string();
        assert!(
            input.contains("FACT-000") && input.contains("FACT-003"),
            "{what}: {input}"
        );
        assert!(
            !input.contains("handoff-compaction.v1."),
            "{what}: a handle went upstream"
        );
    };
    let got = go_on(&two, &item).await;
    assert_eq!(got.status, 200, "{}", got.text());
    read("on the other replica");
    drop((one, two));
    let three = start();
    let got = go_on(&three, &item).await;
    assert_eq!(got.status, 200, "{}", got.text());
    read("after a restart");
    assert!(strict.refused.lock().unwrap().is_empty());
}
