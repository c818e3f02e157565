//! Zero-wait on the real binary, in real time, against a fast tool-calling agent: a
//! 16k model that answers at once, about 1,300 tokens of tool output a turn, 0.3 s
//! between turns; summaries on a 4k model (so each span is folded into parts) that
//! take 4 s a call, or 30 s. The defaults are under test: `prepare_at = "auto"`,
//! `max_wait = "2s"`, `fold_concurrency = 4`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use mock_upstream::strict::{Strict, SummaryMode};
use mock_upstream::{AgentStyle, MockUpstream};
use serde_json::{json, Value};
use support::scenario::{agent_requests, chat_as, log_lines, of_kind, options, paced, records};
use support::Proxy;

/// The agent's model: a 16k window, answered at once.
const MODEL: &str = "strict-16k";

/// The client's pause between turns.
const PAUSE: Duration = Duration::from_millis(300);

/// Summaries on the 4k model: a span of the 16k conversation is folded into parts.
const SUMMARIES_ON_4K: &str = "[compaction]\nsummary_model = \"strict\"\n";

async fn agent_with_summaries_of(delay: Duration) -> (Arc<Strict>, MockUpstream) {
    let strict = Strict::new(4096);
    strict.set_style(AgentStyle {
        brief_answers: true,
        ..AgentStyle::default()
    });
    let mock = paced(&strict, Duration::ZERO, delay).await;
    (strict, mock)
}

/// A tool result of about 1,300 tokens that states one fact on its first line.
fn tool_result(n: usize) -> String {
    let filler: Vec<String> = (0..590).map(|i| format!("r{i}")).collect();
    format!(
        "FACT-{n:03}-result found\n{}\nend of record {n}",
        filler.join(" ")
    )
}

/// One turn: the user's question (its fact), the tool call, its result, the answer;
/// each request's latency is pushed to `latencies`.
async fn turn(proxy: &Proxy, id: &str, messages: &mut Vec<Value>, n: usize) -> Vec<Duration> {
    messages.push(json!({"role": "user", "content": format!("FACT-{n:03}: look up record {n}")}));
    let mut latencies = Vec::new();
    loop {
        let started = Instant::now();
        let got = chat_as(proxy, id, MODEL, messages).await;
        latencies.push(started.elapsed());
        assert_eq!(got.status, 200, "turn {n}: {}", got.text());
        let reply = got.json()["choices"][0]["message"].clone();
        let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
        messages.push(reply);
        match call {
            Some(call) => messages
                .push(json!({"role": "tool", "tool_call_id": call, "content": tool_result(n)})),
            None => return latencies,
        }
    }
}

/// One request on another conversation: the tokenizer loaded and the connection to
/// the mock opened before the timed turns.
async fn warm_up(proxy: &Proxy) {
    let hello = [json!({"role": "user", "content": "hello"})];
    assert_eq!(chat_as(proxy, "warm-up", MODEL, &hello).await.status, 200);
}

/// The facts (`FACT-007`, `FACT-007-result`) of the first `turns` turns that `text`
/// still carries, out of all of them.
fn facts_kept(text: &str, turns: usize) -> (usize, usize) {
    let words: BTreeSet<&str> = text
        .split(|c: char| c.is_whitespace() || c == '"' || c == ':' || c == '\\')
        .collect();
    let all: Vec<String> = (0..turns)
        .flat_map(|n| [format!("FACT-{n:03}"), format!("FACT-{n:03}-result")])
        .collect();
    let kept = all.iter().filter(|f| words.contains(f.as_str())).count();
    (kept, all.len())
}

/// How the summariser of a session answers.
#[derive(Clone, Copy)]
enum Summaries {
    /// Good summaries, each call after this long.
    Taking(Duration),
    /// Every summary call fails at once: the chain's deterministic end commits.
    Down,
}

/// A session of the agent, as its client and the upstream saw it.
struct Session {
    strict: Arc<Strict>,
    mock: MockUpstream,
    proxy: Proxy,
    latencies: Vec<Duration>,
    turns: usize,
}

impl Session {
    /// Plays `turns` of the agent's turns against a fresh proxy whose summaries are `summaries`.
    async fn play(summaries: Summaries, turns: usize) -> Self {
        let delay = match summaries {
            Summaries::Taking(delay) => delay,
            Summaries::Down => Duration::ZERO,
        };
        let (strict, mock) = agent_with_summaries_of(delay).await;
        if let Summaries::Down = summaries {
            strict.set_summary_mode(SummaryMode::ServerError);
        }
        let proxy = Proxy::start_with(&mock.url(), options(4096, SUMMARIES_ON_4K));
        warm_up(&proxy).await;
        let mut messages = vec![json!({"role": "system", "content": "be brief"})];
        let mut latencies = Vec::new();
        for n in 0..turns {
            latencies.extend(turn(&proxy, "agent", &mut messages, n).await);
            tokio::time::sleep(PAUSE).await;
        }
        Self {
            strict,
            mock,
            proxy,
            latencies,
            turns,
        }
    }

    /// The facts of every turn the final request to the model carried, and how many
    /// there are.
    fn facts_in_final_request(&self) -> (usize, usize) {
        let last = agent_requests(&self.mock).pop().unwrap().json().to_string();
        facts_kept(&last, self.turns)
    }

    /// The slowest request the client saw.
    fn slowest(&self) -> Duration {
        self.latencies.iter().max().copied().unwrap()
    }
}

/// The longest a request may take: `max_wait` (2 s, the default) and half a second.
const MAX_WAIT_AND_A_HALF: Duration = Duration::from_millis(2_500);

/// Long enough that the handoffs fill their budget and begin to drop old tool outcomes:
/// in 30 turns neither session loses a fact, and the comparison could not fail.
const LONG_SESSION: usize = 60;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_summariser_keeps_what_the_fallback_keeps() {
    let down = Session::play(Summaries::Down, LONG_SESSION).await;
    let slow = Session::play(Summaries::Taking(Duration::from_secs(30)), LONG_SESSION).await;
    let ((fallback, all), (stood_in, _)) =
        (down.facts_in_final_request(), slow.facts_in_final_request());
    // The same strategies over the same originals, replaced on the same rule: the two
    // final handoffs differ only where a cut fell, which a real-time run moves by a
    // unit (one tool outcome more or less in a full ledger), never by a run of them.
    assert!(
        stood_in + 1 >= fallback,
        "of {all} facts, 30 s summaries kept {stood_in}, the summariser down {fallback}"
    );
    for session in [&down, &slow] {
        assert!(
            session.slowest() < MAX_WAIT_AND_A_HALF,
            "{:?}",
            session.slowest()
        );
        assert!(session.strict.over_window.lock().unwrap().is_empty());
        assert!(session.strict.broken_pairs.lock().unwrap().is_empty());
    }
    // A stand-in is taken turn after turn, as a committed handoff is, until the view on
    // it crosses the trigger: far fewer stand-ins than requests sent on them.
    let lines = log_lines(&slow.proxy, "agent");
    let stand_ins: BTreeSet<String> = of_kind(&lines, "stand_in")
        .iter()
        .filter_map(|s| s["record"]["id"].as_str().map(str::to_owned))
        .collect();
    let sent_on_them = of_kind(&lines, "decision")
        .iter()
        .filter(|d| {
            d["compaction"]
                .as_str()
                .is_some_and(|c| stand_ins.contains(c))
        })
        .count();
    assert!(
        !stand_ins.is_empty() && sent_on_them >= 3 * stand_ins.len(),
        "{} stand-ins, {sent_on_them} requests sent on them",
        stand_ins.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fast_agent_never_waits_for_its_summaries_and_keeps_its_facts() {
    let session = Session::play(Summaries::Taking(Duration::from_secs(4)), 30).await;
    let Session {
        strict,
        mock: _,
        proxy,
        ..
    } = &session;
    // The model answers at once: every request's time is handoff's. A preparation is
    // never stacked on one still waiting for its trigger, so a request may wait for
    // the running summary, never past max_wait (then a stand-in goes).
    let slowest = session.slowest();
    assert!(slowest < MAX_WAIT_AND_A_HALF, "a request took {slowest:?}");
    // The preparation still running ends before the counts are read.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let records = records(proxy, "agent");
    let lines = log_lines(proxy, "agent");
    let stand_ins = of_kind(&lines, "stand_in");
    assert!(
        records.len() + stand_ins.len() >= 2,
        "{} records, {} stand-ins",
        records.len(),
        stand_ins.len()
    );
    let summarized: Vec<&Value> = records
        .iter()
        .filter(|r| r["strategy"] == "summarize")
        .collect();
    assert!(!summarized.is_empty(), "no summary was ever adopted");
    // Each summary is one call when its history fits one, else a fold: its parts at
    // once, then a merge; no call is wasted but those of a run overtaken before it
    // committed.
    let calls: u64 = records
        .iter()
        .flat_map(|r| r["attempts"].as_array().unwrap().iter())
        .filter(|a| a["strategy"] == "summarize")
        .map(|a| a["calls"].as_u64().unwrap_or(1))
        .sum();
    for record in &summarized {
        let folded = record["attempts"][0]["calls"].as_u64().unwrap_or(1);
        assert!(
            (1..=5).contains(&folded) && folded != 2,
            "one call, or a fold of 2-4 parts and a merge: {record}"
        );
    }
    let made = strict.summaries.load(Ordering::SeqCst) as u64;
    assert!(
        made <= calls + 5,
        "{made} summary calls, {calls} in records"
    );
    // What reaches the model at the end: the facts of every turn, through handoffs.
    let (kept, all) = session.facts_in_final_request();
    assert!(
        kept * 100 >= all * 95,
        "{kept} of {all} facts in the final request"
    );
    assert!(strict.over_window.lock().unwrap().is_empty());
    assert!(strict.broken_pairs.lock().unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn past_max_wait_extract_stands_in_and_the_summary_lands_without_a_wait() {
    let (strict, mock) = agent_with_summaries_of(Duration::from_secs(30)).await;
    let proxy = Proxy::start_with(&mock.url(), options(4096, SUMMARIES_ON_4K));
    warm_up(&proxy).await;
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut latencies = Vec::new();
    let mut n = 0;
    // A burst of turns until two requests went out with a stand-in.
    while of_kind(&log_lines(&proxy, "burst"), "stand_in").len() < 2 {
        assert!(n < 40, "no stand-in after {n} turns");
        latencies.extend(turn(&proxy, "burst", &mut messages, n).await);
        tokio::time::sleep(PAUSE).await;
        n += 1;
    }
    let slowest = latencies.iter().max().copied().unwrap();
    assert!(
        slowest < Duration::from_millis(2_500),
        "a request waited past max_wait: {slowest:?}"
    );
    let lines = log_lines(&proxy, "burst");
    let stand_in = &of_kind(&lines, "stand_in")[0];
    assert_eq!(stand_in["record"]["strategy"], "extract");
    assert_eq!(stand_in["record"]["attempts"][0]["outcome"], "pending");
    let decisions = of_kind(&lines, "decision");
    assert!(
        decisions
            .iter()
            .any(|d| d["compaction"] == stand_in["record"]["id"]),
        "a request was sent with the stand-in"
    );
    // The user reads; the summary lands and is committed; the next turn is sent at once
    // (the summariser was measured slower than max_wait) with it, or, the burst having
    // outgrown it, with the stand-in chain, which covers more.
    let deadline = Instant::now() + Duration::from_secs(60);
    let summary = loop {
        let found = records(&proxy, "burst")
            .into_iter()
            .find(|r| r["strategy"] == "summarize");
        if let Some(found) = found {
            break found;
        }
        assert!(Instant::now() < deadline, "the summary never landed");
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let after = turn(&proxy, "burst", &mut messages, n).await;
    assert!(
        after.iter().all(|l| *l < Duration::from_millis(500)),
        "{after:?}"
    );
    let lines = log_lines(&proxy, "burst");
    let sent = of_kind(&lines, "decision").last().unwrap()["compaction"].clone();
    // On the summary itself; on the chain's extract built on it, when the span since
    // the summary needs more calls than compaction.max_summary_calls allows; or on the
    // stand-in chain, when the view on the summary is over the trigger.
    let built_on = |record: &Value| {
        record["id"] == sent && record["source"]["previous_compaction"] == summary["id"]
    };
    let stand_ins = of_kind(&lines, "stand_in");
    let on_the_chain = stand_ins.iter().any(|s| s["record"]["id"] == sent);
    let sent_well =
        sent == summary["id"] || records(&proxy, "burst").iter().any(built_on) || on_the_chain;
    assert!(
        sent_well,
        "the next request is sent with the landed summary ({}), or the stand-in chain: {sent}",
        summary["id"]
    );
    // A stand-in on the chain covers more than the summary: taking the summary would have
    // needed a stand-in on it, which keeps less.
    if on_the_chain {
        let stand_in = stand_ins
            .iter()
            .find(|s| s["record"]["id"] == sent)
            .unwrap();
        let covered = |r: &Value| r["source"]["end_exclusive"].as_u64().unwrap();
        assert!(covered(&stand_in["record"]) > covered(&summary));
    }
    assert!(strict.over_window.lock().unwrap().is_empty());
}
