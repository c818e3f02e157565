//! An early send keeps a margin: a view over the trigger sent without waiting for its
//! running compaction must fit the input budget by its estimate *and* the estimate's
//! error bound, so that an upstream counting more than handoff estimates never refuses
//! a view handoff chose to send. Time is paused; the summary never lands meanwhile.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use mock_upstream::strict::{text_tokens, Strict};
use mock_upstream::{MockUpstream, Reply};
use serde_json::{json, Value};

use super::{decisions, user};
use crate::base::calibration::MarginFrom;
use crate::base::line::DecisionLine;
use crate::testing::Harness;

/// The 4k model, summaries on a 16k one that take far longer than the test, prepared
/// at half the trigger; a request waits for its running compaction rather than take a
/// stand-in, so every view sent is one handoff chose.
const CONFIG: &str = "[models.\"strict\"]\ncontext_window = 4096\n[models.\"strict-16k\"]\ncontext_window = 16384\n[compaction]\nstrategy = \"summarize\"\nsummary_model = \"strict-16k\"\nprepare_at = 0.5\nmax_wait = \"600s\"\n";

/// The window the upstream enforces.
const WINDOW: u64 = 4096;

/// Output the client reserves on each request: the input budget is the window less it.
const MAX_TOKENS: u64 = 64;

/// An upstream that counts each tool result three times over (its tokenizer splits
/// them finer than the rest), enforces its window by that count and reports it: the
/// newest turn always weighs more than the conversation's ratio says, so handoff's
/// calibrated estimate of the next view falls short of the upstream's count. What
/// it refused, by its count, is kept.
struct Heavy {
    strict: Arc<Strict>,
    refused: Mutex<Vec<u64>>,
    /// Each agent request's count, in order.
    counted: Mutex<Vec<u64>>,
}

impl Heavy {
    fn count(body: &Value) -> u64 {
        let tool_text: u64 = (body["messages"].as_array().into_iter().flatten())
            .filter(|m| m["role"] == "tool")
            .filter_map(|m| m["content"].as_str())
            .map(text_tokens)
            .sum();
        Strict::count(body) + 2 * tool_text
    }

    fn answer(&self, request: &mock_upstream::Recorded) -> Reply {
        let body = request.json();
        if mock_upstream::strict::is_summary(&body) {
            return self
                .strict
                .answer(request)
                .delayed(Duration::from_secs(3600));
        }
        let count = Self::count(&body);
        self.counted.lock().unwrap().push(count);
        if count + MAX_TOKENS > WINDOW {
            self.refused.lock().unwrap().push(count);
            return Reply::error(
                400,
                "context_length_exceeded",
                &format!("This model's maximum context length is {WINDOW} tokens. However, your messages resulted in {count} tokens."),
            );
        }
        match self.strict.answer(request) {
            Reply::Json { status, mut body } => {
                body["usage"] = json!({"prompt_tokens": count, "completion_tokens": 5, "total_tokens": count + 5});
                Reply::Json { status, body }
            }
            other => other,
        }
    }
}

/// One request of conversation `id` reserving [`MAX_TOKENS`] of output.
async fn send(proxy: &Harness, id: &str, messages: &[Value]) -> Value {
    let body = json!({"model": "strict", "messages": messages, "max_tokens": MAX_TOKENS});
    let answer = proxy
        .post(
            "/v1/chat/completions",
            &[
                (crate::base::id::CONVERSATION_HEADER, id),
                ("authorization", "Bearer sk-test"),
            ],
            body.to_string().as_bytes(),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer.json()["choices"][0]["message"].clone()
}

/// A tool result of about 40 tokens.
fn tool_result(n: usize) -> String {
    let words: Vec<String> = (0..30).map(|i| format!("v{i}")).collect();
    format!("FACT-{n:03}-result {}", words.join(" "))
}

#[tokio::test(start_paused = true)]
async fn a_view_sent_while_its_compaction_runs_keeps_room_for_an_estimate_that_falls_short() {
    let heavy = Arc::new(Heavy {
        strict: Strict::new(WINDOW),
        refused: Mutex::default(),
        counted: Mutex::default(),
    });
    let answering = Arc::clone(&heavy);
    let mock = MockUpstream::with(move |request| answering.answer(request)).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    // Turns of 150 tokens up to half the trigger (the preparation starts), then small
    // ones, each request a few dozen tokens over the last, until one is sent with a
    // handoff: every size from the trigger to where handoff stops sending early.
    let mut n = 0;
    loop {
        assert!(n < 400, "never compacted");
        messages.push(user(n, if n < 8 { 150 } else { 2 }));
        loop {
            let reply = send(&proxy, "margin", &messages).await;
            let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
            messages.push(reply);
            match call {
                Some(call) => messages
                    .push(json!({"role": "tool", "tool_call_id": call, "content": tool_result(n)})),
                None => break,
            }
        }
        n += 1;
        let log = proxy.log("margin").await;
        if decisions(&log).iter().any(|d| d.compaction.is_some()) {
            break;
        }
    }
    let log = proxy.log("margin").await;
    let early: Vec<&DecisionLine> = decisions(&log)
        .into_iter()
        .filter(|d| d.over.as_deref() == Some("sent_while_preparing"))
        .collect();
    assert!(!early.is_empty(), "no view was sent while preparing");
    // The scenario is the one it claims: a calibrated estimate fell short of the
    // upstream's count by 1.5% or more (each tool result weighs more than the ratio).
    let counted = heavy.counted.lock().unwrap().clone();
    let all = decisions(&log);
    let short = (all.iter().zip(&counted))
        .map(|(d, count)| (*count as f64 - d.estimate.unwrap() as f64) / *count as f64)
        .fold(0.0, f64::max);
    assert!(
        short >= 0.015,
        "the estimates fell short by {short} at most"
    );
    // Every early view named the margin it kept, and kept it: measured from the
    // conversation's calibration spread.
    for decision in &early {
        let margin = decision.margin.expect("the margin is on the decision line");
        assert_eq!(margin.from, MarginFrom::Spread, "{decision:?}");
        assert_eq!(
            margin.tokens,
            (decision.input_budget * u64::from(margin.per_mille)).div_ceil(1000)
        );
        assert!(decision.estimate.unwrap() + margin.tokens <= decision.input_budget);
    }
    // The upstream never refused a view for its size.
    assert_eq!(*heavy.refused.lock().unwrap(), Vec::<u64>::new());
    assert!(all.iter().all(|d| d.retries == 0));
}
