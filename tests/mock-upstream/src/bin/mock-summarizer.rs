//! The strict mock provider as a server, for `handoff eval` runs (`benches/eval.sh`):
//! it writes handoffs that keep every `FACT-…` and every word with a digit it is shown
//! in the history (ids, numbers, amounts), as a perfect summariser of tool output would,
//! so an evaluation measures what reaches the summariser, not a model's writing.
//! Usage: `mock-summarizer 127.0.0.1:18100`; it prints `listening on ADDR`.

use std::sync::Arc;

use mock_upstream::strict::Strict;
use mock_upstream::MockUpstream;

#[tokio::main]
async fn main() {
    let addr = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| ([127, 0, 0, 1], 0).into());
    // No window of its own: handoff's windows are the ones under test.
    let strict = Strict::new(u64::MAX / 4);
    strict.set_keep_digit_words(true);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::serve_on(addr, move |req| responder.answer(req)).await;
    println!("listening on {}", mock.addr());
    let _ = tokio::signal::ctrl_c().await;
}
