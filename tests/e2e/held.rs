//! Server-held Responses sessions with the official openai SDK through the real binary:
//! a 30-turn streamed tool loop that sends only its new items each turn, the rest held
//! by the server, chained by `previous_response_id` or over a conversation. Against
//! the strict Responses server directly it dies of the window; through handoff every
//! turn is served, compacted from handoff's record, on one conversation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use mock_upstream::responses::StrictResponses;

use crate::support::scenario::{estimate_model, records, run_client, run_client_at, serve_strict};
use crate::support::Proxy;

const WINDOW: u64 = 8000;
const TURNS: &str = "30";

async fn held(mode: &str) {
    let strict = StrictResponses::new(WINDOW);
    let mock = serve_strict(&strict, StrictResponses::answer).await;
    let control = run_client_at(mock.url(), "openai_held_session.py", &[mode, TURNS]).await;
    let died = control["died"].as_str().unwrap_or_default().to_owned();
    assert!(
        died.contains("context window"),
        "{mode}: without handoff: {control}"
    );

    let strict = StrictResponses::new(WINDOW);
    let mock = serve_strict(&strict, StrictResponses::answer).await;
    let data = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(&mock.url(), estimate_model(data.path(), "gpt-mock", WINDOW));
    let ran = run_client(&proxy, "openai_held_session.py", &[mode, TURNS]).await;
    assert!(ran["died"].is_null(), "{mode}: through handoff: {ran}");
    assert_eq!(ran["turns"], 30, "{mode}: {ran}");
    let listed = proxy.conversations();
    assert_eq!(listed.len(), 1, "{mode}: one conversation: {listed:?}");
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    let compactions = records(&proxy, &id).len();
    assert!(compactions >= 1, "{mode}: handoff compacted");
    proxy.assert_verified(&[&id]);
    println!(
        "HELD-ROW | openai SDK 3.57.0 (`{mode}`, streamed, store) | {} | {} | 30 | {compactions} | {} |",
        ran["requests"],
        died.split(':').next().unwrap_or_default(),
        listed[0]["branches"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_previous_response_id_chain_past_the_window_is_served_through_handoff() {
    held("previous_response_id").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conversation_past_the_window_is_served_through_handoff() {
    held("conversation").await;
}

/// The openai SDK's `responses.connect()`: a 30-turn tool loop over one socket, each
/// turn only its new items with `store: false`, against a server that serves the mode.
/// Straight to it the session dies of the window; through handoff (its own socket to
/// the server) every turn is served, compacted past the window, on one conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_sdk_socket_session_past_the_window_is_served_through_handoff() {
    // Straight to a server that holds the chain on the socket, it dies of the window.
    let strict = StrictResponses::new(WINDOW);
    let mock = serve_strict(&strict, StrictResponses::answer).await;
    mock.serve_sockets(true);
    let control = run_client_at(mock.url(), "openai_socket_session.py", &[TURNS]).await;
    let died = control["died"].as_str().unwrap_or_default().to_owned();
    assert!(
        died.contains("context window"),
        "without handoff: {control}"
    );

    let strict = StrictResponses::new(WINDOW);
    let mock = serve_strict(&strict, StrictResponses::answer).await;
    mock.serve_sockets(true);
    let data = tempfile::tempdir().unwrap();
    let proxy = Proxy::start_with(&mock.url(), estimate_model(data.path(), "gpt-mock", WINDOW));
    let ran = run_client(&proxy, "openai_socket_session.py", &[TURNS]).await;
    assert!(
        ran["died"].is_null(),
        "through handoff: {ran}\n{}",
        proxy.logs()
    );
    assert_eq!(ran["turns"], 30, "{ran}");
    let listed = proxy.conversations();
    assert_eq!(listed.len(), 1, "one conversation: {listed:?}");
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    let compactions = records(&proxy, &id).len();
    assert!(compactions >= 1, "handoff compacted");
    proxy.assert_verified(&[&id]);
    assert!(strict.refused.lock().unwrap().is_empty());
    println!(
        "HELD-ROW | openai SDK 3.57.0 (`responses.connect()`, store false) | {} | {} | 30 | {compactions} | {} |",
        ran["requests"],
        died.split(':').next().unwrap_or_default(),
        listed[0]["branches"]
    );
}
