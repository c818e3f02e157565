//! The official openai Python SDK as a real client, through the real binary.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::support::scenario::run_client;
use crate::support::Proxy;
use mock_upstream::{MockUpstream, Reply};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_sdk_works_streamed_and_not_and_sees_cuts() {
    let mock = MockUpstream::with(|req| {
        let json = req.json();
        if req.headers.contains_key("x-mock-cut") {
            Reply::chat_stream(&["partial", "more"], Duration::from_millis(5)).cut_at(2)
        } else if json["stream"] == true {
            Reply::chat_stream(&["Hel", "lo", "!"], Duration::from_millis(5))
        } else {
            Reply::chat_text("Hello!")
        }
    })
    .await;
    let proxy = Proxy::start(&mock.url());

    let got = run_client(&proxy, "openai_roundtrip.py", &[]).await;

    assert_eq!(got["plain"], "Hello!");
    assert_eq!(got["finish"], "stop");
    assert_eq!(got["streamed"], "Hello!");
    assert!(
        got["cut_error"].is_string(),
        "the SDK did not notice the cut: {got}"
    );

    let seen = mock.requests();
    assert_eq!(seen.len(), 3);
    assert_eq!(seen[0].headers["authorization"], "Bearer sk-sdk-test-key");
    assert_eq!(
        seen[0].json()["x_unknown"],
        7,
        "unknown body fields must reach the upstream"
    );
    assert_eq!(seen[1].json()["stream"], true);
}
