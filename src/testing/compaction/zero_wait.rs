//! Zero-wait with the defaults (`prepare_at = "auto"`, `max_wait = "2s"`,
//! `fold_concurrency = 4`) on the in-process harness, time paused, so every latency is
//! the virtual time a request took: a fast tool-calling agent on a 16k model that
//! answers at once, about 1,300 tokens of tool output a turn and 0.3 s between turns,
//! its summaries on a 4k model (each span folded into parts) taking 4 s a call, 30 s,
//! or failing; and an 8k agent answered in 1 s, with and without preparation.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mock_upstream::strict::{Strict, SummaryMode};
use mock_upstream::{AgentStyle, MockUpstream};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::{agent_requests, decisions, user};
use crate::base::line::Entry;
use crate::base::record::{CompactionRecord, Reason};
use crate::testing::Harness;

/// The agent's model: a 16k window, answered at once; its summaries on the 4k model.
const MODEL: &str = "strict-16k";

/// The models, and summaries on the 4k one: a span of the 16k conversation is folded.
const SUMMARIES_ON_4K: &str = "[models.\"strict\"]\ncontext_window = 4096\n[models.\"strict-16k\"]\ncontext_window = 16384\n[compaction]\nsummary_model = \"strict\"\n";

/// The client's pause between turns.
const PAUSE: Duration = Duration::from_millis(300);

/// The longest a request may take: `max_wait` (2 s, the default) and half a second.
const MAX_WAIT_AND_A_HALF: Duration = Duration::from_millis(2_500);

/// Long enough that the handoffs fill their budget and begin to drop old tool outcomes:
/// in 30 turns neither session loses a fact, and the comparison could not fail.
const LONG_SESSION: usize = 60;

/// The strict provider: its agent answers after `turn`, its summaries after `summary`.
async fn paced(strict: &Arc<Strict>, turn: Duration, summary: Duration) -> MockUpstream {
    let answering = Arc::clone(strict);
    MockUpstream::with(move |request| {
        let reply = answering.answer(request);
        let wait = match mock_upstream::strict::is_summary(&request.json()) {
            true => summary,
            false => turn,
        };
        match wait.is_zero() {
            true => reply,
            false => reply.delayed(wait),
        }
    })
    .await
}

/// A tool result of about 1,300 tokens that states one fact on its first line.
fn tool_result(n: usize) -> String {
    let filler: Vec<String> = (0..590).map(|i| format!("r{i}")).collect();
    format!(
        "FACT-{n:03}-result found\n{}\nend of record {n}",
        filler.join(" ")
    )
}

/// One turn of `model`: `user`, then the tool calls the model makes, each answered by
/// `result`, until it answers; each request's latency, in virtual time.
async fn turn(
    proxy: &Harness,
    (id, model): (&str, &str),
    messages: &mut Vec<Value>,
    user: Value,
    result: &dyn Fn() -> String,
) -> Vec<Duration> {
    messages.push(user);
    let mut latencies = Vec::new();
    loop {
        let started = Instant::now();
        let got = proxy.chat(id, model, messages).await;
        latencies.push(started.elapsed());
        assert_eq!(got.status, 200, "{}", got.text());
        let reply = got.json()["choices"][0]["message"].clone();
        let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
        messages.push(reply);
        match call {
            Some(call) => {
                messages.push(json!({"role": "tool", "tool_call_id": call, "content": result()}))
            }
            None => return latencies,
        }
    }
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

/// A session of the fast agent, as its client and the upstream saw it.
struct Session {
    strict: Arc<Strict>,
    mock: MockUpstream,
    proxy: Harness,
    latencies: Vec<Duration>,
    turns: usize,
}

impl Session {
    /// Plays `turns` of the agent's turns against a fresh proxy whose summaries are `summaries`.
    async fn play(summaries: Summaries, turns: usize) -> Self {
        let strict = Strict::new(4096);
        strict.set_style(AgentStyle {
            brief_answers: true,
            ..AgentStyle::default()
        });
        let delay = match summaries {
            Summaries::Taking(delay) => delay,
            Summaries::Down => Duration::ZERO,
        };
        if let Summaries::Down = summaries {
            strict.set_summary_mode(SummaryMode::ServerError);
        }
        let mock = paced(&strict, Duration::ZERO, delay).await;
        let proxy = Harness::start(&mock.url(), SUMMARIES_ON_4K).await;
        let mut messages = vec![json!({"role": "system", "content": "be brief"})];
        let mut latencies = Vec::new();
        for n in 0..turns {
            let asked =
                json!({"role": "user", "content": format!("FACT-{n:03}: look up record {n}")});
            let result = move || tool_result(n);
            let id = ("agent", MODEL);
            latencies.extend(turn(&proxy, id, &mut messages, asked, &result).await);
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
        let last = agent_requests(&self.mock).pop().unwrap().to_string();
        facts_kept(&last, self.turns)
    }

    /// The slowest request the client saw.
    fn slowest(&self) -> Duration {
        self.latencies.iter().max().copied().unwrap()
    }
}

/// The ids of the stand-ins `log` holds.
fn stand_ins(log: &crate::store::ConversationLog) -> BTreeSet<String> {
    log.lines
        .iter()
        .filter_map(|line| match &line.entry {
            Entry::StandIn(stand_in) => Some(stand_in.record.id.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn a_slow_summariser_keeps_what_the_fallback_keeps() {
    let down = Session::play(Summaries::Down, LONG_SESSION).await;
    let slow = Session::play(Summaries::Taking(Duration::from_secs(30)), LONG_SESSION).await;
    let ((fallback, all), (stood_in, _)) =
        (down.facts_in_final_request(), slow.facts_in_final_request());
    // The same strategies over the same originals, replaced on the same rule: the two
    // final handoffs differ only where a cut fell, which the summary's landing moves by
    // a unit (one tool outcome more or less in a full ledger), never by a run of them.
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
    let log = slow.proxy.log("agent").await;
    let stand_ins = stand_ins(&log);
    let sent_on_them = decisions(&log)
        .iter()
        .filter(|d| d.compaction.as_ref().is_some_and(|c| stand_ins.contains(c)))
        .count();
    assert!(
        !stand_ins.is_empty() && sent_on_them >= 3 * stand_ins.len(),
        "{} stand-ins, {sent_on_them} requests sent on them",
        stand_ins.len()
    );
}

#[tokio::test(start_paused = true)]
async fn a_fast_agent_never_waits_for_its_summaries_and_keeps_its_facts() {
    let session = Session::play(Summaries::Taking(Duration::from_secs(4)), 30).await;
    // The model answers at once: every request's time is handoff's. A preparation is
    // never stacked on one still waiting for its trigger, so a request may wait for
    // the running summary, never past max_wait (then a stand-in goes).
    let slowest = session.slowest();
    assert!(slowest < MAX_WAIT_AND_A_HALF, "a request took {slowest:?}");
    // The preparation still running ends (its 4 s calls) before the counts are read.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let records = session.proxy.records("agent").await;
    let stand_ins = stand_ins(&session.proxy.log("agent").await);
    assert!(
        records.len() + stand_ins.len() >= 2,
        "{} records, {} stand-ins",
        records.len(),
        stand_ins.len()
    );
    let summarized: Vec<&CompactionRecord> = records
        .iter()
        .filter(|r| r.strategy == "summarize")
        .collect();
    assert!(!summarized.is_empty(), "no summary was ever adopted");
    // Each summary is one call when its history fits one, else a fold: its parts at
    // once, then a merge; no call is wasted but those of a run overtaken before it
    // committed.
    let calls: u64 = records
        .iter()
        .flat_map(|r| r.attempts.iter())
        .filter(|a| a.strategy == "summarize")
        .map(|a| u64::from(a.calls.unwrap_or(1)))
        .sum();
    for record in &summarized {
        let folded = record.attempts[0].calls.unwrap_or(1);
        assert!(
            (1..=5).contains(&folded) && folded != 2,
            "one call, or a fold of 2-4 parts and a merge: {record:?}"
        );
    }
    let made = session.strict.summaries.load(Ordering::SeqCst) as u64;
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
    assert!(session.strict.over_window.lock().unwrap().is_empty());
    assert!(session.strict.broken_pairs.lock().unwrap().is_empty());
}

/// The upstream's own time for the 8k agent's turn, and its summariser's for a call.
const TURN_DELAY: Duration = Duration::from_secs(1);
const SUMMARY_DELAY: Duration = Duration::from_secs(3);

/// What a session of the 8k agent showed: each request's latency, the last view, the
/// records, the summary calls made.
struct Prepared {
    latencies: Vec<Duration>,
    last_view: String,
    records: Vec<CompactionRecord>,
    summary_calls: usize,
}

/// 20 turns of the 8k agent, compacting with `prepare_at`.
async fn eight_k_session(prepare_at: &str, turns: usize) -> Prepared {
    let strict = Strict::new(8192);
    let mock = paced(&strict, TURN_DELAY, SUMMARY_DELAY).await;
    // Inline compactions wait for their summary, however long it takes: what preparing
    // saves is measured against that, not against compaction.max_wait's stand-in.
    let config = format!("[models.\"strict\"]\ncontext_window = 8192\n[models.\"strict-16k\"]\ncontext_window = 16384\n[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = {prepare_at}\nmax_wait = \"60s\"\n");
    let proxy = Harness::start(&mock.url(), &config).await;
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    let mut latencies = Vec::new();
    for n in 0..turns {
        let id = ("agent", "strict");
        let ok = || "ok".to_owned();
        latencies.extend(turn(&proxy, id, &mut messages, user(n, 450), &ok).await);
    }
    // A preparation still running ends before the records are read.
    tokio::time::sleep(SUMMARY_DELAY + Duration::from_secs(1)).await;
    assert!(strict.over_window.lock().unwrap().is_empty());
    Prepared {
        latencies,
        last_view: agent_requests(&mock).pop().unwrap().to_string(),
        records: proxy.records("agent").await,
        summary_calls: strict.summaries.load(Ordering::SeqCst),
    }
}

#[tokio::test(start_paused = true)]
async fn with_preparation_no_request_waits_for_a_summary_and_without_it_some_do() {
    // Prepared at 0.7 of the trigger: about four turns, and seconds, before it.
    let prepared = eight_k_session("0.7", 20).await;
    let inline = eight_k_session("0", 20).await;
    let slowest = |s: &Prepared| s.latencies.iter().max().copied().unwrap();
    // Each request takes the upstream's own second, and handoff's time on top.
    assert!(
        slowest(&prepared) < TURN_DELAY + SUMMARY_DELAY / 2,
        "a request waited for a summary: {:?}",
        slowest(&prepared)
    );
    assert!(
        slowest(&inline) >= SUMMARY_DELAY + TURN_DELAY,
        "{:?}",
        slowest(&inline)
    );
    let waited = inline
        .latencies
        .iter()
        .filter(|l| **l >= SUMMARY_DELAY)
        .count();
    assert_eq!(
        waited,
        inline.records.len(),
        "each inline compaction made one request wait"
    );
    assert!(
        prepared
            .records
            .iter()
            .all(|r| r.reason == Reason::Prepared),
        "{:?}",
        prepared.records
    );
    assert!(
        prepared.summary_calls <= inline.summary_calls + prepared.records.len(),
        "{} summary calls prepared, {} inline",
        prepared.summary_calls,
        inline.summary_calls
    );
    // The same facts reach the model: the oldest turns, through the handoffs.
    for early in ["FACT-000", "FACT-001", "FACT-002"] {
        assert!(
            prepared.last_view.contains(early),
            "{early} was lost with preparation"
        );
        assert!(inline.last_view.contains(early), "{early} was lost inline");
    }
}
