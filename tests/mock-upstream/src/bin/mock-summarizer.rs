//! The strict mock provider as a server, for `handoff eval` runs (`benches/eval.sh`)
//! and the zero-wait benchmark (`benches/zero_wait.sh`): it writes handoffs that keep
//! every `FACT-…` and every word with a digit it is shown in the history (ids,
//! numbers, amounts), as a perfect summariser of tool output would, so an evaluation
//! measures what reaches the summariser, not a model's writing.
//! Usage: `mock-summarizer 127.0.0.1:18100 [SUMMARY_DELAY_SECS [TURN_DELAY_SECS]]`; it
//! prints `listening on ADDR`. With delays, each summary call is answered that much
//! later, as a real summariser over a long history would, and each agent turn after
//! its own (the model's time for a turn); by default both are answered at once.

use std::sync::Arc;
use std::time::Duration;

use mock_upstream::strict::{Strict, SUMMARY_PROMPT_START};
use mock_upstream::MockUpstream;

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
    // An agent's answer after a tool result is a line, not the result again.
    strict.set_style(mock_upstream::AgentStyle {
        brief_answers: true,
        ..mock_upstream::AgentStyle::default()
    });
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::serve_on(addr, move |req| {
        let reply = responder.answer(req);
        let summary = req.json()["messages"][0]["content"]
            .as_str()
            .is_some_and(|system| system.starts_with(SUMMARY_PROMPT_START));
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
