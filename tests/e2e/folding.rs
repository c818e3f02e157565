//! Summaries that never give up, with a real client: the fact agent (the openai SDK)
//! keeps its tool facts through continued summary calls, every decision uses one
//! calibrated count, the deterministic fallback keeps the edges of tool results, and
//! `handoff eval` replays a live run. The folds themselves are tested in-process
//! (`src/testing/compaction/folding.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use crate::support::scenario::{agent_requests, inline_compaction, options, records, run_client};
use crate::support::Proxy;
use mock_upstream::strict::Strict;
use mock_upstream::{AgentStyle, MockUpstream};
use serde_json::{json, Value};

/// The strict provider, playing an agent that answers briefly after tool results and
/// writes handoffs of a realistic length (about 1k tokens).
async fn strict_agent(strict: Arc<Strict>) -> MockUpstream {
    strict.set_style(AgentStyle {
        brief_answers: true,
        ..Default::default()
    });
    strict.set_summary_padding(1100);
    MockUpstream::with(move |req| strict.answer(req)).await
}

/// Runs the fact agent through `proxy` with tool results of about `words` words (1200
/// words make about 4k tokens); returns the facts and the last view the upstream was
/// sent (the agent's final request).
async fn run_fact_agent(
    proxy: &Proxy,
    mock: &MockUpstream,
    turns: usize,
    words: usize,
) -> (Value, String) {
    let got = run_client(
        proxy,
        "openai_fact_agent.py",
        &[&turns.to_string(), &words.to_string(), "strict-16k"],
    )
    .await;
    let last = agent_requests(mock).last().unwrap().json();
    (got, last["messages"].to_string())
}

fn recall(facts: &Value, view: &str) -> f64 {
    let facts: Vec<&str> = facts
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    let kept = facts.iter().filter(|f| view.contains(*f)).count();
    kept as f64 / facts.len() as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_22_turn_agent_keeps_its_tool_facts_with_no_fallback() {
    let strict = Strict::new(16_384);
    let mock = strict_agent(Arc::clone(&strict)).await;
    let proxy = Proxy::start_with(&mock.url(), inline_compaction(options(16_384, "")));

    // Tool results of about 1.1k tokens, too short to be shortened, and handoffs of
    // about 1.5k: the summary input of a compaction passes the summary model's
    // allowance, as it did in the run that filed this (14,470 > 13,927 tokens).
    let (got, view) = run_fact_agent(&proxy, &mock, 22, 330).await;

    let conversation = proxy.conversations()[0]["id"].as_str().unwrap().to_owned();
    let records = records(&proxy, &conversation);
    assert!(records.len() >= 3, "{} compactions", records.len());
    for record in &records {
        assert_eq!(
            record["strategy"], "summarize",
            "no extract fallback: {record}"
        );
        assert_eq!(record["attempts"].as_array().unwrap().len(), 1, "{record}");
    }
    let share = recall(&got["facts"], &view);
    let calls: Vec<u64> = records
        .iter()
        .map(|r| r["attempts"][0]["calls"].as_u64().unwrap())
        .collect();
    eprintln!(
        "summarize kept {:.0}% of the tool facts; summary calls per compaction: {calls:?}",
        share * 100.0
    );
    // Rendered as text, a compaction's summary input would pass the summary model's
    // allowance and fold; the summary model is the conversation's own, so each call
    // continues the conversation instead: one call, its prefix read from the cache.
    assert!(
        calls.iter().all(|&c| c == 1),
        "one continued call per compaction: {calls:?}"
    );
    let continued = mock
        .requests()
        .iter()
        .map(|r| r.json())
        .filter(mock_upstream::strict::is_summary)
        .all(|body| mock_upstream::strict::asks_continued_summary(&body["messages"]));
    assert!(continued, "every summary call continues the conversation");
    assert!(
        share >= 0.9,
        "only {:.0}% of the tool facts are in the final view",
        share * 100.0
    );
    assert!(strict.over_window.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extract_alone_keeps_most_tool_result_edges() {
    let strict = Strict::new(16_384);
    let mock = strict_agent(Arc::clone(&strict)).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        options(16_384, "[compaction]\nchain = [\"extract\"]\n"),
    );

    // Tool results of about 1.3k tokens: a compaction every few turns.
    let (got, view) = run_fact_agent(&proxy, &mock, 22, 400).await;

    let conversation = proxy.conversations()[0]["id"].as_str().unwrap().to_owned();
    assert!(records(&proxy, &conversation).len() >= 3);
    let share = recall(&got["edge_facts"], &view);
    eprintln!("extract kept {:.0}% of the edge facts", share * 100.0);
    assert!(
        share >= 0.6,
        "only {:.0}% of the edge facts survive extract",
        share * 100.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_counting_one_and_a_half_tiktoken_never_rejects_a_request() {
    let strict = Strict::scaled(16_384, 1.5);
    let mock = strict_agent(Arc::clone(&strict)).await;
    let proxy = Proxy::start_with(&mock.url(), inline_compaction(options(16_384, "")));

    let (got, _) = run_fact_agent(&proxy, &mock, 20, 400).await;

    let over = strict.over_window.lock().unwrap().clone();
    assert!(
        over.is_empty(),
        "the upstream rejected {} request(s): {over:?}",
        over.len()
    );
    let conversation = proxy.conversations()[0]["id"].as_str().unwrap().to_owned();
    let records = records(&proxy, &conversation);
    assert!(records.len() >= 2, "{} compactions", records.len());
    for record in &records {
        assert_eq!(
            record["reason"], "threshold",
            "every compaction is proactive: {record}"
        );
    }
    assert!(got["requests"].as_u64().unwrap() >= 40);
}

/// Runs `handoff eval ARGS --config <proxy's config> --json`; returns the report.
fn eval(proxy: &Proxy, args: &[&str]) -> Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_handoff"))
        .arg("eval")
        .args(args)
        .arg("--config")
        .arg(proxy.config_path())
        .arg("--json")
        .current_dir(proxy.dir())
        .env_remove("HANDOFF_CONFIG")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "handoff eval: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_replays_a_live_run_to_the_same_figures_and_writes_nothing() {
    for chain in ["extract", "summarize,extract"] {
        let strict = Strict::new(4096);
        let mock = strict_agent(Arc::clone(&strict)).await;
        let proxy = Proxy::start_with(
            &mock.url(),
            inline_compaction(options(
                4096,
                &format!(
                    "[compaction]\nchain = {:?}\n[prices.\"strict\"]\ninput = 1.0\noutput = 2.0\n",
                    chain.split(',').collect::<Vec<_>>()
                ),
            )),
        );
        let mut messages = vec![json!({"role": "system", "content": "be brief"})];
        for n in 0..14 {
            messages.push(crate::support::scenario::big_user(n, 400));
            let got = crate::support::scenario::chat(&proxy, "live", &messages).await;
            assert_eq!(got.status, 200, "{}", got.text());
            messages.push(got.json()["choices"][0]["message"].clone());
            if let Some(call) = messages.last().unwrap()["tool_calls"][0]["id"].as_str() {
                messages.push(json!({"role": "tool", "tool_call_id": call, "content": format!("FACT-r{n:02} found")}));
                let got = crate::support::scenario::chat(&proxy, "live", &messages).await;
                messages.push(got.json()["choices"][0]["message"].clone());
            }
        }
        let live = records(&proxy, "live");
        assert!(live.len() >= 2, "{chain}: {} live compactions", live.len());
        let before = crate::support::read_tree(&proxy.data_dir());

        let report = eval(
            &proxy,
            &["--upstream", &mock.url(), "--probe", "FACT-[0-9a-z]+"],
        );

        assert_eq!(
            crate::support::read_tree(&proxy.data_dir()),
            before,
            "the data dir is untouched"
        );
        let replayed = &report["conversations"][0];
        assert_eq!(replayed["name"], "live");
        let figures: Vec<(u64, u64)> = replayed["compactions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["tokens_before"].as_u64().unwrap(),
                    c["tokens_after"].as_u64().unwrap(),
                )
            })
            .collect();
        let live_figures: Vec<(u64, u64)> = live
            .iter()
            .map(|r| {
                (
                    r["tokens_before"].as_u64().unwrap(),
                    r["tokens_after"].as_u64().unwrap(),
                )
            })
            .collect();
        eprintln!("{chain}: live {live_figures:?}, eval {figures:?}");
        assert_eq!(
            figures, live_figures,
            "{chain}: eval and the live run compact alike"
        );
        let strategies: Vec<&Value> = live.iter().map(|r| &r["strategy"]).collect();
        let replayed_strategies: Vec<&Value> = replayed["compactions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| &c["strategy"])
            .collect();
        assert_eq!(replayed_strategies, strategies, "{chain}");
        assert!(replayed["recall"]["matches"].as_u64().unwrap() >= 14);
        assert_eq!(report["total"]["compactions"], live.len());
        // The chain's cost: its summary calls' usage at the configured prices.
        let usage = &report["total"]["usage"];
        let tokens = |field: &str| usage[field].as_f64().unwrap_or(0.0);
        let expected = (tokens("prompt_tokens") + 2.0 * tokens("completion_tokens")) / 1e6;
        let usd = report["total"]["summary_usd"].as_f64().unwrap();
        assert!((usd - expected).abs() < 1e-12, "{chain}: {usd} for {usage}");
        assert_eq!(usd > 0.0, chain.starts_with("summarize"), "{chain}: {usd}");
    }
}

#[test]
fn eval_replays_a_conversation_file_as_the_readme_shows() {
    let file = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/conversations/bfcl_multi_turn_long_context_120.json");
    let dir = tempfile::tempdir().unwrap();
    let run = |json: bool| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_handoff"));
        command
            .args(["eval", "--file"])
            .arg(&file)
            .args([
                "--chain",
                "extract",
                "--window",
                "8192",
                "--probe",
                "[0-9]{2,}",
            ])
            .current_dir(dir.path())
            .env_remove("HANDOFF_CONFIG");
        if json {
            command.arg("--json");
        }
        command.output().unwrap()
    };
    let table = run(false);
    assert!(
        table.status.success(),
        "{}",
        String::from_utf8_lossy(&table.stderr)
    );
    let table = String::from_utf8_lossy(&table.stdout);
    // docs/compaction.md's worked example, line for line, but for the seconds per compaction
    // (a debug build's time is not the document's).
    let readme = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/compaction.md"),
    )
    .unwrap();
    let seconds = regex::Regex::new(r"[0-9]+\\\.[0-9]").unwrap();
    for line in table.lines() {
        let escaped = regex::escape(line.trim_end());
        let pattern = seconds.replace_all(&escaped, r"[0-9]+\.[0-9]");
        let pattern = regex::Regex::new(&pattern).unwrap();
        assert!(
            pattern.is_match(&readme),
            "docs/compaction.md lacks: {line}"
        );
    }
    let report: Value = serde_json::from_slice(&run(true).stdout).unwrap();
    let conversation = &report["conversations"][0];
    assert_eq!(conversation["requests"], 5);
    assert_eq!(conversation["compactions"][0]["strategy"], "extract");
    // Request 2's newest unit (a 20k-token tool result) is over the 7,373-token input
    // budget: rescued (shortened in the view), not refused.
    assert_eq!(
        conversation["errors"].as_array().map_or(0, Vec::len),
        0,
        "{conversation}"
    );
    assert_eq!(report["total"]["compactions"], 1);
    // Every compacted fact the final view lost is listed, with the compaction that lost it.
    let compacted = &conversation["compacted"];
    let missing: u64 = ["user", "identifiers", "outcomes"]
        .iter()
        .map(|class| {
            compacted[class]["matches"].as_u64().unwrap()
                - compacted[class]["kept"].as_u64().unwrap()
        })
        .sum();
    let lost = conversation["lost"].as_array().cloned().unwrap_or_default();
    assert_eq!(lost.len() as u64, missing, "{lost:?}");
    assert!(lost.iter().all(|l| l["compaction"] == 1), "{lost:?}");
    assert!(
        dir.path().read_dir().unwrap().next().is_none(),
        "eval wrote nothing"
    );
}
