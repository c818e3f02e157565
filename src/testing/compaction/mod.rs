//! The compaction service on the in-process harness, against the strict provider
//! (which enforces its window and OpenAI's tool pairing): the plan, the loop that
//! keeps only the newest unit, the rescue of an over-long tool result, and the single
//! flight. Time is paused, so a slow summariser costs nothing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod audit_views;
mod edges;
mod failures;
mod folding;
mod margin;
mod max_wait;
mod prepare;
mod zero_wait;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mock_upstream::strict::Strict;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

use crate::base::line::Entry;
use crate::dialect::pair::CONTINUATION;
use crate::testing::Harness;

/// A 4k model whose summaries run on a 16k one, compacting inline.
const CONFIG: &str = "[models.\"strict\"]\ncontext_window = 4096\n[models.\"strict-16k\"]\ncontext_window = 16384\n[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = 0.0\nmax_wait = \"60s\"\n";

/// The strict provider, its summaries answered after `summary_delay`.
pub(super) async fn strict(summary_delay: Duration) -> (Arc<Strict>, MockUpstream) {
    let strict = Strict::new(4096);
    let answering = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| {
        let reply = answering.answer(request);
        if mock_upstream::strict::is_summary(&request.json()) && !summary_delay.is_zero() {
            reply.delayed(summary_delay)
        } else {
            reply
        }
    })
    .await;
    (strict, mock)
}

pub(super) fn user(n: usize, tokens: usize) -> Value {
    let filler: Vec<String> = (0..tokens / 2).map(|i| format!("w{i}")).collect();
    json!({"role": "user", "content": format!("FACT-{n:03} {}", filler.join(" "))})
}

/// A history of `turns` user turns of about `tokens` tokens, each answered.
pub(super) fn history(turns: usize, tokens: usize) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..turns {
        messages.push(user(n, tokens));
        messages.push(json!({"role": "assistant", "content": format!("noted {n}")}));
    }
    messages
}

/// The decision lines of `log`, in order.
pub(super) fn decisions(
    log: &crate::store::ConversationLog,
) -> Vec<&crate::base::line::DecisionLine> {
    log.lines
        .iter()
        .filter_map(|line| match &line.entry {
            crate::base::line::Entry::Decision(decision) => Some(decision),
            _ => None,
        })
        .collect()
}

/// The requests the agent made (not the summaries), as JSON.
pub(super) fn agent_requests(mock: &MockUpstream) -> Vec<Value> {
    mock.requests()
        .iter()
        .map(|r| r.json())
        .filter(|body| !mock_upstream::strict::is_summary(body))
        .collect()
}

/// Asserts that `sent` is the pinned system message, the handoff pair, then the
/// newest messages of `asked` verbatim.
pub(super) fn assert_compacted_view(sent: &[Value], asked: &[Value]) {
    assert_eq!(sent[0], asked[0], "the system message stays pinned");
    assert_eq!(sent[1]["role"], "user");
    assert_eq!(sent[1]["content"], CONTINUATION);
    assert_eq!(sent[2]["role"], "assistant");
    let tail = &sent[3..];
    assert!(!tail.is_empty());
    assert_eq!(
        tail,
        &asked[asked.len() - tail.len()..],
        "the recent part is verbatim"
    );
}

#[tokio::test(start_paused = true)]
async fn a_view_over_the_trigger_is_cut_at_a_unit_boundary_and_fits_the_window() {
    let (strict, mock) = strict(Duration::ZERO).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = history(0, 0);
    let mut compacted_at = None;
    for n in 0..12 {
        messages.push(user(n, 500));
        let mut answer = proxy.chat("plan", "strict", &messages).await;
        assert_eq!(answer.status, 200, "turn {n}: {}", answer.text());
        let mut reply = answer.json()["choices"][0]["message"].clone();
        // The strict agent calls a tool now and then: answer it, as an agent would.
        while let Some(call) = reply["tool_calls"][0]["id"].as_str().map(str::to_owned) {
            messages.push(reply);
            messages.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}));
            answer = proxy.chat("plan", "strict", &messages).await;
            assert_eq!(answer.status, 200, "turn {n}: {}", answer.text());
            reply = answer.json()["choices"][0]["message"].clone();
        }
        messages.push(reply);
        if !proxy.records("plan").await.is_empty() {
            compacted_at = Some(n);
            break;
        }
    }
    assert!(
        compacted_at.is_some(),
        "no compaction in 12 turns of 500 tokens"
    );
    assert!(strict.over_window.lock().unwrap().is_empty());
    assert!(strict.broken_pairs.lock().unwrap().is_empty());
    let sent = agent_requests(&mock).pop().unwrap();
    let asked = &messages[..messages.len() - 1];
    assert_compacted_view(sent["messages"].as_array().unwrap(), asked);
    let record = &proxy.records("plan").await[0];
    assert_eq!(record.strategy, "summarize");
    assert!(record.tokens_after < record.tokens_before);
    // Threshold: 0.9 of the input budget (4096 less the 409 reserved for the reply).
    assert!(record.tokens_after <= 3318, "{}", record.tokens_after);
    assert_eq!(strict.summaries.load(Ordering::SeqCst), 1);
}

#[tokio::test(start_paused = true)]
async fn a_newest_unit_too_big_for_the_aim_keeps_only_itself_and_is_sent() {
    let (strict, mock) = strict(Duration::ZERO).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = history(4, 100);
    // Over the trigger with the pair, but within the input budget of 3687.
    messages.push(user(99, 2900));
    let answer = proxy.chat("last", "strict", &messages).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let sent = agent_requests(&mock).pop().unwrap();
    let sent = sent["messages"].as_array().unwrap();
    assert_eq!(sent.len(), 4, "system, the pair, the newest turn: {sent:?}");
    assert_compacted_view(sent, &messages);
    assert!(strict.over_window.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn an_over_long_tool_result_is_shortened_in_the_view_and_kept_whole_in_the_log() {
    let (strict, mock) = strict(Duration::ZERO).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let long: String = (0..6000).map(|i| format!("line{i} ")).collect();
    let messages = vec![
        json!({"role": "system", "content": "be brief"}),
        json!({"role": "user", "content": "read the log"}),
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"app.log\"}"}}]}),
        json!({"role": "tool", "tool_call_id": "c1", "content": long}),
    ];
    let answer = proxy.chat("rescue", "strict", &messages).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let sent = agent_requests(&mock).pop().unwrap();
    let result = sent["messages"].as_array().unwrap().last().unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(result.len() < long.len() / 4, "{} bytes", result.len());
    assert!(result.starts_with("line0 ") && result.ends_with("line5999 "));
    assert!(strict.over_window.lock().unwrap().is_empty());
    let log = proxy.log("rescue").await;
    let kept = log.lines.iter().any(|line| match &line.entry {
        Entry::Message(message) => message.message.get().len() > long.len(),
        _ => false,
    });
    assert!(kept, "the original tool result is logged whole");
    let noted = log
        .lines
        .iter()
        .any(|line| matches!(&line.entry, Entry::Rescue(rescue) if rescue.shortened.len() == 1));
    assert!(noted, "the rescue is noted in the log");
}

#[tokio::test(start_paused = true)]
async fn two_requests_over_the_trigger_make_one_summary_and_both_get_its_view() {
    let (strict, mock) = strict(Duration::from_secs(3)).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let messages = history(8, 500);
    let started = tokio::time::Instant::now();
    let (first, second) = tokio::join!(
        proxy.chat("flight", "strict", &messages),
        proxy.chat("flight", "strict", &messages),
    );
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(second.status, 200, "{}", second.text());
    assert!(
        started.elapsed() >= Duration::from_secs(3),
        "both waited for the summary"
    );
    assert_eq!(
        strict.summaries.load(Ordering::SeqCst),
        1,
        "one summary call"
    );
    assert_eq!(proxy.records("flight").await.len(), 1);
    let agents = agent_requests(&mock);
    assert_eq!(agents.len(), 2);
    assert_eq!(
        agents[0]["messages"], agents[1]["messages"],
        "one view for both"
    );
    assert_compacted_view(agents[0]["messages"].as_array().unwrap(), &messages);
}

#[tokio::test(start_paused = true)]
async fn the_plan_keeps_room_for_every_user_message_the_handoff_must_carry() {
    // Extract only, on a 4k model: the handoff budget is 409 tokens; the user's
    // messages to compact are about 800 (under a quarter of the input budget), and the
    // recent part the plan would keep leaves a handoff grown to half the trigger too
    // little room for them.
    let config = "[models.\"strict\"]\ncontext_window = 4096\n[compaction]\nstrategy = \"extract\"\nprepare_at = 0.0\n";
    let (strict, mock) = strict(Duration::ZERO).await;
    let proxy = Harness::start(&mock.url(), config).await;
    let mut messages = history(0, 0);
    let filler: Vec<String> = (0..75).map(|i| format!("r{i}")).collect();
    for n in 0..18 {
        messages.push(user(n, 40));
        messages.push(
            json!({"role": "assistant", "content": format!("noted {n}: {}", filler.join(" "))}),
        );
    }
    messages.push(user(99, 40));
    let answer = proxy.chat("users", "strict", &messages).await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(strict.over_window.lock().unwrap().is_empty());
    let records = proxy.records("users").await;
    assert_eq!(records.len(), 1, "one compaction");
    // Every user message whole, in the handoff or in the recent part.
    let sent = agent_requests(&mock).pop().unwrap().to_string();
    for n in (0..18).chain([99]) {
        let text = user(n, 40)["content"].as_str().unwrap().to_owned();
        assert!(sent.contains(&text), "FACT-{n:03} not whole: {sent}");
    }
    let handoff = records[0].handoff_text();
    assert!(!handoff.contains("user message(s) left out"), "{handoff}");
}
