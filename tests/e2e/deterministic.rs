//! The deterministic handoff keeps what matters. When the summariser is down (or every
//! summary is refused), `extract` and the ledger are the only handoff a user gets:
//! every compacted user message, and the first and last line of every compacted tool
//! result, must still reach the model.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use crate::support::scenario::{agent_requests, options, records, run_client};
use crate::support::Proxy;
use mock_upstream::strict::{Strict, SummaryMode};
use mock_upstream::{AgentStyle, MockUpstream};
use serde_json::Value;

/// The strict provider playing an agent that answers briefly after tool results, whose
/// summary calls all fail with a 500.
async fn agent_without_summariser(strict: Arc<Strict>) -> MockUpstream {
    strict.set_style(AgentStyle {
        brief_answers: true,
        ..Default::default()
    });
    strict.set_summary_mode(SummaryMode::ServerError);
    MockUpstream::with(move |req| strict.answer(req)).await
}

fn strings(list: &Value) -> Vec<String> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_summariser_down_every_edge_fact_and_user_message_reaches_the_last_request() {
    let strict = Strict::new(16_384);
    let mock = agent_without_summariser(Arc::clone(&strict)).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        options(16_384, "[compaction]\nsummary_timeout = \"5s\"\n"),
    );
    let got = run_client(&proxy, "openai_fact_agent.py", &["22", "400", "strict-16k"]).await;
    let last = agent_requests(&mock).pop().unwrap().json()["messages"].to_string();

    let conversation = proxy.conversations()[0]["id"].as_str().unwrap().to_owned();
    let records = records(&proxy, &conversation);
    assert!(records.len() >= 4, "{} compactions", records.len());
    for record in &records {
        assert_eq!(
            record["strategy"], "extract",
            "the summariser is down: {record}"
        );
    }
    let edges = strings(&got["edge_facts"]);
    let lost: Vec<&String> = edges
        .iter()
        .filter(|f| !last.contains(f.as_str()))
        .collect();
    let users: Vec<String> = (0..22)
        .map(|turn| format!("question {turn}: look up record {turn}"))
        .collect();
    let users_lost: Vec<&String> = users
        .iter()
        .filter(|u| !last.contains(u.as_str()))
        .collect();
    eprintln!(
        "edge facts kept {}/{}; lost {lost:?}; user messages lost {users_lost:?}",
        edges.len() - lost.len(),
        edges.len()
    );
    assert!(users_lost.is_empty(), "user messages lost: {users_lost:?}");
    assert!(lost.is_empty(), "edge facts lost: {lost:?}\n{last}");
    assert!(strict.over_window.lock().unwrap().is_empty());
}
