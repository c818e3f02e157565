//! Strategy plugins for real use: named chains, exec plugins in any language, per-model,
//! per-route and per-request selection, and hot reload under load.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::client::{self, request};
use crate::support::scenario::*;
use mock_upstream::strict::SummaryMode;
use serde_json::{json, Value};

fn repo(path: &str) -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(path)
        .display()
        .to_string()
}

/// A strategy section running `tests/plugins/misbehave.py MODE`.
fn misbehaving(name: &str, mode: &str) -> String {
    format!(
        "[compaction.strategies.{name}]\nkind = \"exec\"\ncommand = [\"python3\", {:?}, \"{mode}\"]\ntimeout = \"2s\"\nmax_output_bytes = 1048576\n",
        repo("tests/plugins/misbehave.py")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_exec_plugin_writes_the_handoff() {
    let (strict, mock) = strict_mock(4096).await;
    let extra = format!(
        "[compaction]\nchain = [\"keywords\", \"extract\"]\n[compaction.strategies.keywords]\nkind = \"exec\"\ncommand = [\"python3\", {:?}]\ntimeout = \"10s\"\n",
        repo("examples/plugins/keyword_handoff.py")
    );
    let proxy = crate::support::Proxy::start_with(&mock.url(), options(4096, &extra));
    drive_until_compaction(&proxy, "exec", 500, 20).await;
    let record = &records(&proxy, "exec")[0];
    assert_eq!(record["strategy"], "keywords", "{record}");
    assert_eq!(record["chain"], json!(["keywords", "extract"]));
    let handoff = record["handoff"]["content"].as_str().unwrap();
    assert!(
        handoff.contains("Handoff (keyword plugin)") && handoff.contains("FACT-000"),
        "{handoff}"
    );
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        0,
        "no model was called"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn misbehaving_plugins_are_clean_failed_attempts() {
    for (mode, expect) in [
        ("hang", "no summary within"),
        ("crash", "plugin exploded"),
        ("garbage", "not a protocol answer"),
        ("huge", "larger than 1048576 bytes"),
        ("error", "the plugin declined"),
        // Stopped at its limit, not left blocked on a full pipe until the timeout.
        ("chatty", "larger than 1048576 bytes"),
    ] {
        let (_strict, mock) = strict_mock(4096).await;
        let extra = format!(
            "[compaction]\nchain = [\"bad\", \"extract\"]\n{}",
            misbehaving("bad", mode)
        );
        let proxy = crate::support::Proxy::start_with(&mock.url(), options(4096, &extra));
        // drive_until_compaction asserts that every turn, the compacting one too, got a 200.
        drive_until_compaction(&proxy, "bad", 500, 20).await;
        let record = &records(&proxy, "bad")[0];
        assert_eq!(record["strategy"], "extract", "{mode}: {record}");
        let attempt = &record["attempts"][0];
        assert_eq!(attempt["strategy"], "bad");
        assert_eq!(attempt["outcome"], "failed");
        assert!(
            attempt["error"].as_str().unwrap().contains(expect),
            "{mode}: {attempt}"
        );
        if mode == "chatty" {
            assert_ne!(attempt["reason"], "timeout", "{attempt}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_an_exec_plugin_forks_dies_with_it() {
    let (_strict, mock) = strict_mock(4096).await;
    let pid_file = tempfile::NamedTempFile::new().unwrap();
    let extra = format!(
        "[compaction]\nchain = [\"forky\", \"extract\"]\n[compaction.strategies.forky]\nkind = \"exec\"\ncommand = [\"python3\", {:?}, \"fork\", {:?}]\ntimeout = \"10s\"\n",
        repo("tests/plugins/misbehave.py"),
        pid_file.path().display().to_string()
    );
    let proxy = crate::support::Proxy::start_with(&mock.url(), options(4096, &extra));
    drive_until_compaction(&proxy, "forky", 500, 20).await;
    assert_eq!(records(&proxy, "forky")[0]["strategy"], "forky");
    let pid = std::fs::read_to_string(pid_file.path()).unwrap();
    let stat = format!("/proc/{}/stat", pid.trim());
    for _ in 0..100 {
        let state = std::fs::read_to_string(&stat).unwrap_or_default();
        // Gone, or a zombie for init to reap: not running either way.
        if state.is_empty() || state.contains(") Z") {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("the plugin's child {} outlived it", pid.trim());
}

/// True once `pid` no longer runs: gone, or a zombie for init to reap.
fn stopped(pid: &str) -> bool {
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    state.is_empty() || state.contains(") Z")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_exec_plugin_and_what_it_forked_die_with_a_killed_handoff() {
    let (_strict, mock) = strict_mock(4096).await;
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("pids");
    let extra = format!(
        "[compaction]\nchain = [\"hung\", \"extract\"]\n[compaction.strategies.hung]\nkind = \"exec\"\ncommand = [\"python3\", {:?}, \"hang-fork\", {:?}]\ntimeout = \"600s\"\n",
        repo("tests/plugins/misbehave.py"),
        pid_file.display().to_string()
    );
    let mut proxy = crate::support::Proxy::start_with(&mock.url(), options(4096, &extra));
    let url = format!("{}/v1/chat/completions", proxy.url());
    // Turns until the plugin runs; the turn that started it waits on it (and panics,
    // unseen, once the proxy is killed).
    let driver = tokio::spawn(async move {
        let mut messages = vec![json!({"role": "system", "content": "be brief"})];
        for n in 0..20 {
            messages.push(big_user(n, 500));
            let body = json!({"model": "strict", "messages": messages}).to_string();
            let headers = [
                ("content-type", "application/json"),
                ("x-handoff-conversation-id", "hung"),
                ("authorization", "Bearer sk-x"),
            ];
            let got = client::send_within(
                request("POST", &url, &headers, body),
                false,
                Duration::from_secs(600),
            )
            .await;
            let reply = got.json()["choices"][0]["message"].clone();
            let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
            messages.push(reply);
            if let Some(call) = call {
                messages.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}));
            }
        }
    });
    let mut pids = String::new();
    for _ in 0..1000 {
        pids = std::fs::read_to_string(&pid_file).unwrap_or_default();
        if !pids.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let pids: Vec<String> = pids.split_whitespace().map(str::to_owned).collect();
    assert_eq!(
        pids.len(),
        2,
        "the plugin never ran: {:?}",
        records(&proxy, "hung")
    );
    assert!(
        !stopped(&pids[0]) && !stopped(&pids[1]),
        "both run before the kill"
    );
    proxy.kill9();
    driver.abort();
    for _ in 0..250 {
        if pids.iter().all(|pid| stopped(pid)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!(
        "the plugin {} or its child {} outlived a killed handoff",
        pids[0], pids[1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_three_strategy_chain_records_every_attempt() {
    let (strict, mock) = strict_mock(4096).await;
    strict.set_summary_mode(SummaryMode::Length);
    let extra = format!(
        "[compaction]\nsummary_model = \"strict-16k\"\nchain = [\"crashy\", \"summarize\", \"extract\"]\n{}",
        misbehaving("crashy", "crash")
    );
    let proxy = crate::support::Proxy::start_with(&mock.url(), options(4096, &extra));
    drive_until_compaction(&proxy, "three", 500, 20).await;
    let record = &records(&proxy, "three")[0];
    let attempts = record["attempts"].as_array().unwrap();
    let outcomes: Vec<(String, String)> = attempts
        .iter()
        .map(|a| {
            (
                a["strategy"].as_str().unwrap().to_owned(),
                a["outcome"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("crashy".into(), "failed".into()),
            ("summarize".into(), "failed".into()),
            ("extract".into(), "ok".into())
        ]
    );
    assert_eq!(attempts[1]["reason"], "finish_reason");
    assert!(
        attempts[1]["usage"].is_object(),
        "the discarded summary's usage is kept"
    );
    assert_eq!(record["chain"], json!(["crashy", "summarize", "extract"]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_strategy_header_is_honoured_only_for_allowed_names() {
    let (strict, mock) = strict_mock(4096).await;
    let extra =
        "[compaction]\nsummary_model = \"strict-16k\"\nrequest_override_allow = [\"extract\"]\n";
    let proxy = crate::support::Proxy::start_with(&mock.url(), options(4096, extra));
    let mut messages = vec![];
    for n in 0..8 {
        messages.push(big_user(n, 500));
        messages.push(json!({"role": "assistant", "content": "ok"}));
    }
    messages.push(big_user(8, 500));
    let send = |strategy: &'static str, messages: Vec<Value>| {
        let url = format!("{}{CHAT}", proxy.url());
        async move {
            client::send(request(
                "POST",
                &url,
                &[
                    ("x-handoff-conversation-id", "hdr"),
                    ("x-handoff-strategy", strategy),
                ],
                json!({"model": "strict", "messages": messages}).to_string(),
            ))
            .await
        }
    };
    let refused = send("summarize", messages.clone()).await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.json()["error"]["code"], "strategy_not_allowed");
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("allowed: [extract]"));

    let got = send("extract", messages).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let record = &records(&proxy, "hdr")[0];
    assert_eq!(record["chain"], json!(["extract"]));
    assert_eq!(strict.summaries.load(Ordering::SeqCst), 0);
    let forwarded = agent_requests(&mock).pop().unwrap();
    assert!(
        !forwarded.headers.contains_key("x-handoff-strategy"),
        "proxy headers stay in the proxy"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn models_and_routes_choose_their_chain_and_upstream() {
    let (strict, mock) = strict_mock(4096).await;
    let (routed_strict, routed) = strict_mock(4096).await;
    let extra = format!(
        "[models.\"strict\".compaction]\nchain = [\"extract\"]\n[models.\"rt-4k\"]\ncontext_window = 4096\n[compaction]\nsummary_model = \"strict-16k\"\n[[routes]]\nmatch = \"rt-*\"\nupstream = {:?}\nchain = [\"quick\", \"extract\"]\n[compaction.strategies.quick]\nkind = \"summarize\"\nmodel = \"strict-16k\"\nhandoff_tokens = 50\n",
        routed.url()
    );
    let proxy = crate::support::Proxy::start_with(&mock.url(), options(4096, &extra));

    drive_until_compaction(&proxy, "per-model", 500, 20).await;
    assert_eq!(records(&proxy, "per-model")[0]["chain"], json!(["extract"]));
    assert_eq!(strict.summaries.load(Ordering::SeqCst), 0);
    assert!(routed.requests().is_empty(), "only rt-* models are routed");

    // The same conversation shape on a routed model goes to the other upstream.
    let mut messages = vec![];
    for n in 0..8 {
        messages.push(big_user(n, 500));
        messages.push(json!({"role": "assistant", "content": "ok"}));
    }
    messages.push(big_user(8, 500));
    let got = client::send(request(
        "POST",
        &format!("{}{CHAT}", proxy.url()),
        &[("x-handoff-conversation-id", "per-route")],
        json!({"model": "rt-4k", "messages": messages}).to_string(),
    ))
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let record = &records(&proxy, "per-route")[0];
    assert_eq!(record["chain"], json!(["quick", "extract"]));
    assert_eq!(record["strategy"], "quick");
    assert_eq!(
        routed_strict.summaries.load(Ordering::SeqCst),
        1,
        "the route's upstream wrote the summary"
    );
    let summary_request = routed
        .requests()
        .into_iter()
        .find(|r| mock_upstream::strict::is_summary(&r.json()))
        .unwrap();
    assert_eq!(
        summary_request.json()["max_tokens"],
        50,
        "the strategy's own handoff budget"
    );
    assert_eq!(
        summary_request.json()["model"],
        "strict-16k",
        "the strategy's own model"
    );
}

fn chain_config(chain: &str) -> String {
    let base = options(4096, "").extra_toml;
    format!("{base}[compaction]\nsummary_model = \"strict-16k\"\nchain = {chain}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_reload_under_load_switches_chains_without_failing_a_request() {
    let (_strict, mock) = strict_mock(4096).await;
    let proxy = Arc::new(crate::support::Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: chain_config("[\"summarize\", \"extract\"]"),
            ..ProxyOptions::default()
        },
    ));
    let config_url = format!("{}/handoff/config", proxy.url());
    let reloads =
        |url: String| async move { client::send(request("GET", &url, &[], "")).await.json() };

    // A steady stream of small requests for the whole test.
    let stop = Arc::new(AtomicBool::new(false));
    let served = Arc::new(AtomicUsize::new(0));
    let background = {
        let (proxy, stop, served) = (Arc::clone(&proxy), Arc::clone(&stop), Arc::clone(&served));
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let got = chat(
                    &proxy,
                    &format!("steady-{n}"),
                    &[json!({"role": "user", "content": "ping"})],
                )
                .await;
                assert_eq!(
                    got.status,
                    200,
                    "a request failed during reloads: {}",
                    got.text()
                );
                served.fetch_add(1, Ordering::SeqCst);
            }
        })
    };

    let chains = [
        ("[\"extract\"]", json!(["extract"])),
        (
            "[\"summarize\", \"extract\"]",
            json!(["summarize", "extract"]),
        ),
    ];
    for round in 0..10 {
        if round == 5 {
            proxy.write_raw_config("[compaction\nchain = broken");
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            loop {
                let status = reloads(config_url.clone()).await;
                if status["reload"]["last_error"].is_string() {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the invalid file was not reported: {status}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            // The previous chain stays in force.
            let (_, previous) = &chains[(round - 1) % 2];
            let id = format!("reload-{round}");
            drive_until_compaction(&proxy, &id, 500, 20).await;
            assert_eq!(&records(&proxy, &id)[0]["chain"], previous);
            continue;
        }
        let (toml, chain) = &chains[round % 2];
        let before = reloads(config_url.clone()).await["loaded_at"].clone();
        proxy.rewrite_config(&mock.url(), &chain_config(toml));
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let status = reloads(config_url.clone()).await;
            // A new snapshot, with the chain just written, and the error (if any) cleared.
            if status["loaded_at"] != before && status["config"]["compaction"]["chain"] == *chain {
                assert!(status["reload"]["last_error"].is_null(), "{status}");
                assert!(status["reload"]["reloads"].as_u64().unwrap() >= 1);
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "reload {round} did not happen: {status}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let id = format!("reload-{round}");
        drive_until_compaction(&proxy, &id, 500, 20).await;
        assert_eq!(
            &records(&proxy, &id)[0]["chain"],
            chain,
            "round {round} used another chain"
        );
    }
    stop.store(true, Ordering::SeqCst);
    background.await.unwrap();
    assert!(served.load(Ordering::SeqCst) > 10);
}

use crate::support::ProxyOptions;
