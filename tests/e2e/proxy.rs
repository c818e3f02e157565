//! The transparent proxy, end to end: the real binary between a client and the mock,
//! for what needs the process (its listener, h2c, signals, its logs). Bad bodies, a
//! failing upstream and what passes through unchanged are tested in-process
//! (`src/pipeline/tracked/tests.rs`, `src/relay_tests.rs`, `src/testing/passthrough.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::support::client::{self, request};
use crate::support::{Proxy, ProxyOptions};
use mock_upstream::{chat_completion, MockUpstream, Reply};
use serde_json::json;

const CHAT: &str = "/v1/chat/completions";

fn chat_body() -> serde_json::Value {
    json!({
        "model": "gpt-4o",
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hi", "x_unknown_message_field": [1, 2]}
        ],
        "x_unknown_top_field": {"keep": true}
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_cross_except_hop_by_hop_and_host_is_rewritten() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Proxy::start(&mock.url());

    let got = client::send(request(
        "POST",
        &format!("{}{CHAT}", proxy.url()),
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer sk-live-abc"),
            ("anthropic-beta", "tools-2024-04-04"),
            ("openai-organization", "org-42"),
            ("connection", "keep-alive, x-hop-secret"),
            ("x-hop-secret", "must-not-cross"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic abc"),
            ("te", "trailers"),
        ],
        chat_body().to_string(),
    ))
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(
        got.headers["x-mock-upstream"], "1",
        "response headers come back"
    );

    let seen = &mock.requests()[0];
    assert_eq!(seen.headers["authorization"], "Bearer sk-live-abc");
    assert_eq!(seen.headers["anthropic-beta"], "tools-2024-04-04");
    assert_eq!(seen.headers["openai-organization"], "org-42");
    assert_eq!(seen.headers["host"], mock.addr().to_string());
    for hop in ["x-hop-secret", "keep-alive", "proxy-authorization", "te"] {
        assert!(!seen.headers.contains_key(hop), "{hop} crossed the proxy");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_frames_keep_upstream_spacing() {
    let gap = Duration::from_millis(150);
    let mock = MockUpstream::replying(Reply::chat_stream(&["a", "b", "c", "d"], gap)).await;
    let proxy = Proxy::start(&mock.url());
    let mut body = chat_body();
    body["stream"] = json!(true);

    let got = client::stream(
        request(
            "POST",
            &format!("{}{CHAT}", proxy.url()),
            &[("content-type", "application/json")],
            body.to_string(),
        ),
        None,
    )
    .await;

    assert_eq!(got.status, 200);
    assert_eq!(got.headers["x-accel-buffering"], "no");
    assert!(got.error.is_none(), "{:?}", got.error);
    assert!(got.text().ends_with("data: [DONE]\n\n"));
    // 8 upstream frames 150 ms apart: a buffering proxy delivers them in one burst.
    assert!(
        got.frames.len() >= 6,
        "frames were merged: {}",
        got.frames.len()
    );
    let gaps: Vec<Duration> = got.frames.windows(2).map(|w| w[1].0 - w[0].0).collect();
    let spaced = gaps.iter().filter(|g| **g >= gap / 2).count();
    assert!(
        spaced >= gaps.len() - 1,
        "frames arrived in bursts: {gaps:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_drops_the_upstream_stream() {
    let deltas: Vec<String> = (0..200).map(|i| format!("t{i}")).collect();
    let deltas: Vec<&str> = deltas.iter().map(String::as_str).collect();
    let mock = MockUpstream::replying(Reply::chat_stream(&deltas, Duration::from_millis(20))).await;
    let proxy = Proxy::start(&mock.url());
    let mut body = chat_body();
    body["stream"] = json!(true);

    let got = client::stream(
        request(
            "POST",
            &format!("{}{CHAT}", proxy.url()),
            &[],
            body.to_string(),
        ),
        Some(3),
    )
    .await;
    assert_eq!(got.frames.len(), 3);
    drop(got);

    // The upstream notices within a few frames, not after all 200.
    mock.wait_for_aborted_stream(Duration::from_secs(3)).await;
    assert_eq!(mock.aborted_streams(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2c_clients_are_served() {
    let mock = MockUpstream::replying(Reply::chat_text("over h2")).await;
    let proxy = Proxy::start(&mock.url());
    let got = client::send_with(
        request(
            "POST",
            &format!("{}{CHAT}", proxy.url()),
            &[("content-type", "application/json")],
            chat_body().to_string(),
        ),
        true,
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(got.json()["choices"][0]["message"]["content"], "over h2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_in_flight_streams_finish_then_exits_zero() {
    let mock = MockUpstream::replying(Reply::chat_stream(
        &["a", "b", "c", "d", "e"],
        Duration::from_millis(100),
    ))
    .await;
    let mut proxy = Proxy::start(&mock.url());
    let mut body = chat_body();
    body["stream"] = json!(true);
    let url = format!("{}{CHAT}", proxy.url());

    let in_flight = tokio::spawn(client::stream(
        request("POST", &url, &[], body.to_string()),
        None,
    ));
    mock.wait_for_requests(1, Duration::from_secs(5)).await;
    proxy.signal("TERM");
    let got = in_flight.await.unwrap();

    assert!(got.error.is_none(), "{:?}", got.error);
    assert!(
        got.text().ends_with("data: [DONE]\n\n"),
        "the stream was not allowed to finish"
    );
    assert!(proxy.wait_exit(Duration::from_secs(10)).success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_keys_never_reach_the_logs() {
    let secrets = [
        "sk-proj-SECRETbearer0001",
        "SECRETazurekey0002",
        "sk-ant-SECRETxapikey0003",
        "SECRETcookie0004",
        "SECRETquery0005",
    ];
    let mock = MockUpstream::with(|req| {
        if req.target.contains("chat") {
            Reply::chat_stream(&["x"], Duration::ZERO)
        } else {
            Reply::json(json!({}))
        }
    })
    .await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            rust_log: "trace".into(),
            ..ProxyOptions::default()
        },
    );
    let headers = [
        ("authorization", "Bearer sk-proj-SECRETbearer0001"),
        ("api-key", secrets[1]),
        ("x-api-key", secrets[2]),
        ("cookie", "session=SECRETcookie0004"),
    ];
    let mut body = chat_body();
    body["stream"] = json!(true);
    let url = format!("{}{CHAT}?api-key=SECRETquery0005", proxy.url());
    client::stream(request("POST", &url, &headers, body.to_string()), None).await;
    client::send(request(
        "GET",
        &format!("{}/v1/models?key=SECRETquery0005", proxy.url()),
        &headers,
        "",
    ))
    .await;
    client::post_json(
        &format!("{}{CHAT}", proxy.url()),
        &json!({"messages": "broken"}),
    )
    .await;

    proxy.wait_for_log("/v1/models?key=********", Duration::from_secs(5));
    let logs = proxy.logs();
    assert!(
        logs.contains("/v1/chat/completions?api-key=********"),
        "{logs}"
    );
    for secret in secrets {
        assert!(
            !logs.contains(secret),
            "{secret} leaked into the logs:\n{logs}"
        );
    }
    // The upstream still got the real credentials.
    assert_eq!(mock.requests()[0].headers["api-key"], secrets[1]);
}

/// `workers = 1`: one thread serves every connection, so the first count of a huge
/// conversation (megabytes to tokenise, tables to load) must not run on it. A small
/// request sent while that count runs is answered before it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_worker_answers_a_small_request_while_a_huge_first_count_runs() {
    let mock = MockUpstream::replying(Reply::json(chat_completion("counted"))).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: "workers = 1\n[models.\"big\"]\ncontext_window = 100000000\n".into(),
            ..ProxyOptions::default()
        },
    );
    let url = format!("{}{CHAT}", proxy.url());
    // About 9 MB of varied words, none of it counted before: seconds to tokenise.
    let words: Vec<String> = (0..1_200_000u64)
        .map(|n| format!("w{}", n * 7919 % 100_003))
        .collect();
    let huge = json!({"model": "big", "messages": [
        {"role": "user", "content": words.join(" ")},
    ]});
    let heavy = tokio::spawn(client::send(request("POST", &url, &[], huge.to_string())));
    // The huge request's original is logged before it is counted: once its folder is
    // there, the worker has read it and handed the count off.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while proxy.conversation_dirs().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "the huge request was never logged"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let mut small = chat_body();
    small["model"] = json!("big");
    let got = client::send(request("POST", &url, &[], small.to_string())).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(
        !heavy.is_finished(),
        "the small request waited for the huge count to end"
    );
    let heavy = heavy.await.unwrap();
    assert_eq!(heavy.status, 200, "{}", heavy.text());
    assert_eq!(mock.requests().len(), 2);
}

/// `workers = 2`: two threads, each its own runtime and `SO_REUSEPORT` socket on the
/// one address. Every connection is served whichever socket the kernel gives it to,
/// a stream in flight finishes after SIGTERM, and a second proxy cannot take the port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_one_port_serve_every_connection_and_drain_on_sigterm() {
    let mock = MockUpstream::with(|req| {
        if req.json().get("stream") == Some(&json!(true)) {
            Reply::chat_stream(&["a", "b", "c", "d"], Duration::from_millis(100))
        } else {
            Reply::json(chat_completion("from a worker"))
        }
    })
    .await;
    let mut proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: "workers = 2\n".into(),
            ..ProxyOptions::default()
        },
    );
    assert!(proxy.logs().contains("workers=2"), "{}", proxy.logs());
    let url = format!("{}{CHAT}", proxy.url());
    // One connection each: the kernel spreads them over both sockets.
    for n in 0..24 {
        let mut body = chat_body();
        body["messages"][1]["content"] = json!(format!("question {n}"));
        let got = client::send(request("POST", &url, &[], body.to_string())).await;
        assert_eq!(got.status, 200, "request {n}: {}", got.text());
        assert_eq!(
            got.json()["choices"][0]["message"]["content"],
            "from a worker"
        );
    }
    assert_eq!(mock.requests().len(), 24);

    let taken = std::process::Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(["serve", "--listen", &proxy.url().replace("http://", "")])
        .args(["--upstream", &mock.url()])
        .arg("--data-dir")
        .arg(tempfile::tempdir().unwrap().path())
        .env("HANDOFF_WORKERS", "2")
        .env_remove("HANDOFF_CONFIG")
        .output()
        .unwrap();
    assert!(!taken.status.success(), "a second proxy shared the port");
    assert!(
        String::from_utf8_lossy(&taken.stderr).contains("cannot listen"),
        "{}",
        String::from_utf8_lossy(&taken.stderr)
    );

    let mut body = chat_body();
    body["stream"] = json!(true);
    let in_flight = tokio::spawn(client::stream(
        request("POST", &url, &[], body.to_string()),
        None,
    ));
    mock.wait_for_requests(25, Duration::from_secs(5)).await;
    proxy.signal("TERM");
    let got = in_flight.await.unwrap();
    assert!(got.error.is_none(), "{:?}", got.error);
    assert!(
        got.text().ends_with("data: [DONE]\n\n"),
        "the stream was cut"
    );
    assert!(proxy.wait_exit(Duration::from_secs(10)).success());
    assert!(
        proxy.logs().contains("all workers drained"),
        "{}",
        proxy.logs()
    );
}

/// Posts `body` on a raw socket in pieces of `piece` bytes, each flushed on its own, so
/// the proxy reads it in many frames cut mid-message; the answer's status.
async fn post_in_pieces(addr: std::net::SocketAddr, body: &[u8], piece: usize) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut socket = tokio::net::TcpStream::connect(addr).await.unwrap();
    socket.set_nodelay(true).unwrap();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\ncontent-type: application/json\r\n\
         authorization: Bearer sk-test-123\r\nx-handoff-conversation-id: framed\r\n\
         content-length: {}\r\n\r\n",
        body.len()
    );
    socket.write_all(head.as_bytes()).await.unwrap();
    for chunk in body.chunks(piece) {
        socket.write_all(chunk).await.unwrap();
        socket.flush().await.unwrap();
        tokio::task::yield_now().await;
    }
    let mut answer = Vec::new();
    socket.read_to_end(&mut answer).await.unwrap();
    let line = String::from_utf8_lossy(&answer[..answer.len().min(12)]).into_owned();
    line[9..12]
        .parse()
        .unwrap_or_else(|_| panic!("no status in {line:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_body_in_many_frames_reaches_the_upstream_and_the_log_whole() {
    let mock = MockUpstream::replying(Reply::chat_text("noted")).await;
    let proxy = Proxy::start(&mock.url());
    // Over 256 KB, so the second turn is read through the first one's memo.
    let mut messages = vec![json!({"role": "system", "content": "framed session"})];
    for turn in 0..120 {
        messages.push(
            json!({"role": "user", "content": format!("step {turn} é ✓ {}", "x".repeat(2500))}),
        );
        messages.push(json!({"role": "assistant", "content": format!("done {turn}")}));
    }
    let first = json!({"model": "gpt-4o", "messages": messages}).to_string();
    assert_eq!(
        post_in_pieces(proxy.addr(), first.as_bytes(), 7919).await,
        200
    );
    messages.push(json!({"role": "assistant", "content": "noted"}));
    messages.push(json!({"role": "user", "content": "and the next step?"}));
    let second = json!({"model": "gpt-4o", "messages": messages, "stream": false}).to_string();
    assert_eq!(
        post_in_pieces(proxy.addr(), second.as_bytes(), 4099).await,
        200
    );

    let seen = mock.requests();
    assert_eq!(seen.len(), 2);
    assert!(
        seen[0].body == first.as_bytes(),
        "the first body changed on its way"
    );
    assert!(
        seen[1].body == second.as_bytes(),
        "the second body changed on its way"
    );
    // Every message after the pinned system one logged once, each turn's reply after it.
    let logged: Vec<serde_json::Value> = crate::support::message_lines(&proxy, "framed")
        .into_iter()
        .map(|line| line["message"].clone())
        .collect();
    let mut expected = messages[1..messages.len() - 2].to_vec();
    expected.push(json!({"role": "assistant", "content": "noted"}));
    expected.push(json!({"role": "user", "content": "and the next step?"}));
    expected.push(json!({"role": "assistant", "content": "noted"}));
    assert_eq!(logged.len(), expected.len());
    assert!(logged == expected, "the log differs from what was sent");
}
