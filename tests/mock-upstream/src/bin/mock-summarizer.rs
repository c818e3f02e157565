//! The strict mock provider as a server, for `handoff eval` runs (`benches/eval.sh`)
//! and the zero-wait benchmark (`benches/zero_wait.sh`): it writes handoffs that keep
//! every `FACT-…` and every word with a digit it is shown in the history (ids,
//! numbers, amounts), as a perfect summariser of tool output would, so an evaluation
//! measures what reaches the summariser, not a model's writing.
//! Usage: `mock-summarizer 127.0.0.1:18100 [SUMMARY_DELAY_SECS [TURN_DELAY_SECS]]`; it
//! prints `listening on ADDR`. With delays, each summary call is answered that much
//! later, as a real summariser over a long history would, and each agent turn after
//! its own (the model's time for a turn); by default both are answered at once.
//! With `MOCK_SUMMARIZER_LOG=PATH` it appends a line per request to PATH,
//! `{"summary": true, "prompt_tokens": N}`, and with `MOCK_SUMMARIZER_LAST=PATH` it keeps
//! the body of the last request that was not a summary call there: what a benchmark
//! counts the provider's calls and the final request's facts from. With
//! `MOCK_SUMMARIZER_DOWN=1` every summary call fails (HTTP 500).

use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

use mock_upstream::strict::{is_summary, Strict, SummaryMode};
use mock_upstream::MockUpstream;
use serde_json::json;

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| ([127, 0, 0, 1], 0).into());
    let mut seconds =
        || Duration::from_secs_f64(args.next().and_then(|d| d.parse().ok()).unwrap_or(0.0));
    let delay = seconds();
    let turn = seconds();
    // No window of its own: handoff's windows are the ones under test.
    let strict = Strict::new(u64::MAX / 4);
    strict.set_keep_digit_words(true);
    // MOCK_SUMMARIZER_DOWN=1: every summary call fails, as a summariser that is down.
    if std::env::var("MOCK_SUMMARIZER_DOWN").is_ok_and(|down| down == "1") {
        strict.set_summary_mode(SummaryMode::ServerError);
    }
    // An agent's answer after a tool result is a line, not the result again.
    strict.set_style(mock_upstream::AgentStyle {
        brief_answers: true,
        ..mock_upstream::AgentStyle::default()
    });
    let responder = Arc::clone(&strict);
    let log = std::env::var_os("MOCK_SUMMARIZER_LOG");
    let last = std::env::var_os("MOCK_SUMMARIZER_LAST");
    let mock = MockUpstream::serve_on(addr, move |req| {
        let reply = responder.answer(req);
        let body = req.json();
        let summary = is_summary(&body);
        if let Some(log) = &log {
            let line = json!({"summary": summary, "prompt_tokens": Strict::count(&body)});
            let appended = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .and_then(|mut file| writeln!(file, "{line}"));
            if let Err(err) = appended {
                eprintln!("mock-summarizer: cannot log the request: {err}");
            }
        }
        if let (Some(last), false) = (&last, summary) {
            if let Err(err) = std::fs::write(last, &req.body) {
                eprintln!("mock-summarizer: cannot keep the last request: {err}");
            }
        }
        let wait = if summary { delay } else { turn };
        if wait.is_zero() {
            reply
        } else {
            reply.delayed(wait)
        }
    })
    .await;
    println!("listening on {}", mock.addr());
    let _ = tokio::signal::ctrl_c().await;
}
