//! The Responses API's WebSocket mode on the in-process harness, against the strict
//! Responses server over HTTP (handoff bridges each create to `POST /v1/responses`):
//! a warm-up, then a tool loop that sends only its new items each turn with
//! `store: false` (the chain held on the socket), past the window; bad events get the
//! API's `error` event and the socket stays open.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use futures_util::{SinkExt, StreamExt};
use mock_upstream::responses::StrictResponses;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

use crate::audit::summarize;
use crate::testing::Harness;

const CONFIG: &str = "[models.\"gpt-mock\"]\ncontext_window = 6000\ntokenizer = \"estimate\"\n[compaction]\nprepare_at = 0\n";

type Client = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

async fn connect(proxy: &Harness) -> Client {
    let url = proxy.url().replace("http://", "ws://") + "/v1/responses";
    let mut request = url.as_str().into_client_request().unwrap();
    request
        .headers_mut()
        .insert("authorization", "Bearer sk-socket-test".parse().unwrap());
    let address = proxy.url().trim_start_matches("http://").to_owned();
    let stream = tokio::net::TcpStream::connect(address).await.unwrap();
    let (socket, response) = tokio_tungstenite::client_async(request, stream)
        .await
        .unwrap();
    assert_eq!(response.status(), 101);
    socket
}

/// Sends `event`, then reads events up to the one that ends it: the response's
/// `response.completed` (or `.failed`, `.incomplete`), or an `error`.
async fn exchange(socket: &mut Client, event: &Value) -> Vec<Value> {
    socket.send(Message::text(event.to_string())).await.unwrap();
    read_to_end(socket).await
}

async fn read_to_end(socket: &mut Client) -> Vec<Value> {
    let mut events = Vec::new();
    while let Some(message) = socket.next().await {
        let Message::Text(text) = message.unwrap() else {
            continue;
        };
        let event: Value = serde_json::from_str(text.as_str()).unwrap();
        let kind = event["type"].as_str().unwrap_or("").to_owned();
        events.push(event);
        if matches!(
            kind.as_str(),
            "response.completed" | "response.failed" | "response.incomplete" | "error"
        ) {
            break;
        }
    }
    events
}

fn socket_ref(socket: &mut Client) -> &mut Client {
    socket
}

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

#[tokio::test]
async fn a_socket_tool_loop_held_on_the_connection_is_tracked_and_compacted() {
    let strict = StrictResponses::new(6000);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| responder.answer(request)).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    tool_loop(&proxy, &mock).await;
    bridged_checks(&proxy, &mock, &strict).await;
}

#[tokio::test]
async fn an_upstream_that_serves_sockets_gets_one_and_holds_the_chain() {
    let strict = StrictResponses::new(6000);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| responder.answer(request)).await;
    mock.serve_sockets(true);
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    tool_loop(&proxy, &mock).await;
    // Every create went up the upstream's socket; while the chain fit, as the client
    // sent it (only the new items), and past the window standing alone, compacted.
    let sent: Vec<_> = (mock.requests().into_iter())
        .filter(|r| !mock_upstream::strict::is_summary(&r.json()))
        .collect();
    assert!(
        sent.iter().all(|r| r.headers.contains_key("x-mock-socket")),
        "every create on the socket"
    );
    let continued = (sent.iter())
        .filter(|r| r.headers.contains_key("x-mock-continued"))
        .count();
    assert!(
        continued >= 10,
        "{continued} creates went with only their new items"
    );
    let ids = proxy.conversations().await;
    let mut compacted = 0;
    for id in &ids {
        if !proxy.records(id.as_str()).await.is_empty() {
            compacted += 1;
        }
    }
    assert_eq!(compacted, 1, "{ids:?}");
    let refused = strict.refused.lock().unwrap().clone();
    assert!(
        refused.iter().all(|r| r.contains("context window")),
        "{refused:?}"
    );
}

/// The loop of [`a_socket_tool_loop_held_on_the_connection_is_tracked_and_compacted`]
/// and its checks of what every socket session keeps.
async fn tool_loop(proxy: &Harness, mock: &MockUpstream) {
    let mut socket = connect(proxy).await;
    // Codex's warm-up: nothing goes upstream, and its id starts the chain.
    let warm = exchange(
        &mut socket,
        &json!({"type": "response.create", "model": "gpt-mock",
        "generate": false, "store": false, "input": []}),
    )
    .await;
    assert_eq!(warm.last().unwrap()["type"], "response.completed");
    let mut previous = warm.last().unwrap()["response"]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(mock.requests().is_empty());
    let filler: String = (0..250).map(|i| format!("w{i} ")).collect();
    let mut input = Vec::new();
    for turn in 0..20 {
        input.push(user(&format!("FACT-{turn:03} {filler}")));
        loop {
            let create = json!({"type": "response.create", "model": "gpt-mock", "store": false,
                "previous_response_id": previous, "input": std::mem::take(&mut input)});
            let events = exchange(&mut socket, &create).await;
            let last = events.last().unwrap();
            assert_eq!(last["type"], "response.completed", "turn {turn}: {last}");
            // The events came as the stream sent them, numbered in order.
            let numbers: Vec<u64> = events
                .iter()
                .filter_map(|e| e["sequence_number"].as_u64())
                .collect();
            assert!(numbers.windows(2).all(|w| w[0] < w[1]), "{numbers:?}");
            previous = last["response"]["id"].as_str().unwrap().to_owned();
            let calls: Vec<Value> = (last["response"]["output"].as_array().unwrap().iter())
                .filter(|item| item["type"] == "function_call")
                .cloned()
                .collect();
            if calls.is_empty() {
                break;
            }
            input = (calls.iter())
                .map(|call| json!({"type": "function_call_output", "call_id": call["call_id"], "output": "found"}))
                .collect();
        }
    }
    // A create that names a stream gets its events back under that name.
    let named = exchange(
        socket_ref(&mut socket),
        &json!({"type": "response.create", "model": "gpt-mock",
        "stream_id": "s-7", "store": false, "input": [user("a side question")]}),
    )
    .await;
    assert!(named.iter().all(|e| e["stream_id"] == "s-7"), "{named:?}");
    // Bad events: an error event each, and the socket goes on.
    socket.send(Message::text("{not json")).await.unwrap();
    let bad = read_to_end(&mut socket).await;
    assert_eq!(bad[0]["error"]["code"], "invalid_json");
    let steer = exchange(&mut socket, &json!({"type": "response.steer", "input": []})).await;
    assert_eq!(steer[0]["error"]["code"], "unsupported_event");
    socket.send(Message::binary(vec![1, 2, 3])).await.unwrap();
    let binary = read_to_end(&mut socket).await;
    assert_eq!(binary[0]["type"], "error");
    let unknown = exchange(
        &mut socket,
        &json!({"type": "response.create", "model": "gpt-mock",
        "previous_response_id": "resp_nobody_knows", "store": false, "input": [user("hi")]}),
    )
    .await;
    assert_eq!(unknown.last().unwrap()["type"], "error", "{unknown:?}");
    socket.close(None).await.unwrap();
}

/// What the bridged loop sent upstream, and the record it left.
async fn bridged_checks(proxy: &Harness, mock: &MockUpstream, strict: &StrictResponses) {
    // Upstream: plain POSTs that stand alone (the chain lives on the socket), never
    // over the server's window.
    // It asked the upstream for a socket once, was refused, and bridged every create.
    let asked = (mock.requests().iter())
        .filter(|r| r.method == http::Method::GET && r.headers.contains_key("upgrade"))
        .count();
    assert_eq!(asked, 1, "one upgrade asked of the upstream");
    let sent: Vec<_> = (mock.requests().into_iter())
        .filter(|r| r.method == http::Method::POST && !mock_upstream::strict::is_summary(&r.json()))
        .collect();
    assert!(sent
        .iter()
        .all(|r| r.target == "/v1/responses" && r.json()["stream"] == true));
    assert!(sent
        .iter()
        .all(|r| r.json().get("type").is_none() && r.json().get("generate").is_none()));
    let held = sent
        .iter()
        .filter(|r| r.json().get("previous_response_id").is_some())
        .count();
    assert_eq!(held, 1, "only the unknown one went with its reference");
    // The loop is one conversation, compacted, on one branch; the side question and
    // the create that named a response nobody holds are one each of their own.
    let ids = proxy.conversations().await;
    assert_eq!(ids.len(), 3, "{ids:?}");
    let mut compacted = 0;
    for id in &ids {
        if proxy.records(id.as_str()).await.is_empty() {
            continue;
        }
        compacted += 1;
        let log = proxy.log(id.as_str()).await;
        assert_eq!(summarize(id, &log).branches, 1);
    }
    assert_eq!(compacted, 1);
    let refused = strict.refused.lock().unwrap().clone();
    // Besides the unknown response: the upgrade it refused (a GET with no input).
    let expected = |r: &String| {
        r.contains("resp_nobody_knows") || r.contains("context window") || r.contains("'input'")
    };
    assert!(refused.iter().all(expected), "{refused:?}");
}

/// The close frame `socket` gets next.
async fn closed_with(socket: &mut Client) -> u16 {
    loop {
        match socket.next().await {
            Some(Ok(Message::Close(Some(frame)))) => return u16::from(frame.code),
            Some(Ok(_)) => continue,
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn an_oversized_event_is_closed_with_1009_and_nothing_goes_upstream() {
    let strict = StrictResponses::new(6000);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| responder.answer(request)).await;
    let config = format!("{CONFIG}[limits]\nmax_body_bytes = 65536\n");
    let proxy = Harness::start(&mock.url(), &config).await;
    let mut socket = connect(&proxy).await;
    let huge =
        json!({"type": "response.create", "model": "gpt-mock", "input": "x".repeat(100_000)});
    socket.send(Message::text(huge.to_string())).await.unwrap();
    assert_eq!(closed_with(&mut socket).await, 1009);
    assert!(mock.requests().is_empty(), "nothing went upstream");
}

#[tokio::test(start_paused = true)]
async fn a_socket_idle_past_the_limit_is_closed_with_1001() {
    let mock = MockUpstream::with(|_| mock_upstream::Reply::chat_text("unused")).await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut idle = connect(&proxy).await;
    // Past limits.idle_timeout (60 s by default), on paused time.
    assert_eq!(closed_with(&mut idle).await, 1001);
    assert!(mock.requests().is_empty());
}
