//! Conversation tracking and the log of originals on the real binary, where a process
//! or the disk is the subject: the SDK's requests replayed exactly, a restart, a torn
//! last line, the files' permissions, re-serialised tool arguments across a restart.
//! The rest is in-process (`src/testing/tracking.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::support::scenario::run_client;
use crate::support::{canonical, read_tree, Proxy, ProxyOptions};
use mock_upstream::{agent_reply, MockUpstream, Reply};
use serde_json::{json, Value};

async fn agent_mock() -> MockUpstream {
    let serial = Arc::new(AtomicUsize::new(0));
    MockUpstream::with(move |req| agent_reply(req, serial.fetch_add(1, Ordering::SeqCst))).await
}

use crate::support::scenario::post_chat as post;

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_hundred_sdk_requests_replay_exactly() {
    let mock = agent_mock().await;
    let proxy = Proxy::start(&mock.url());
    let client_side = run_client(&proxy, "openai_agent.py", &["300"]).await;
    assert_eq!(mock.requests().len(), 300);

    let conversations = proxy.conversations();
    assert_eq!(
        conversations.len(),
        1,
        "a changing system prompt must not split the conversation"
    );
    let summary = &conversations[0];
    assert_eq!(summary["requests"], 300);
    assert_eq!(
        summary["branches"], 1,
        "echoed replies must not fork: {summary}"
    );

    let mut expected: Vec<Value> = client_side["request"].as_array().unwrap().clone();
    expected.push(client_side["reply"].clone());
    let replayed = proxy.replay(summary["id"].as_str().unwrap(), None);
    assert_eq!(replayed.len(), expected.len());
    assert_eq!(
        replayed[0], expected[0],
        "the latest request's system prompt leads the replay"
    );
    for (index, (got, want)) in replayed.iter().zip(&expected).enumerate() {
        assert_eq!(canonical(got), canonical(want), "message {index} differs");
    }
    // Byte for byte too: the SDK's last request reached the mock uncompacted, each
    // message as the SDK wrote it, and the replay gives those bytes back.
    let last = mock.requests().pop().unwrap();
    let sent = crate::support::hop::Sent {
        path: last.target.clone(),
        body: last.body.clone(),
    }
    .messages()
    .unwrap();
    let raw = proxy.replay_raw(&["replay", summary["id"].as_str().unwrap()]);
    assert_eq!(raw[..sent.len()], sent[..], "the replay is the SDK's bytes");
    // Client messages are logged byte for byte, not re-serialised.
    let user_messages: Vec<&Value> = replayed.iter().filter(|m| m["role"] == "user").collect();
    assert_eq!(user_messages.len(), 150);

    proxy.assert_verified(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_mid_conversation_continues_the_same_log() {
    let mock = agent_mock().await;
    let data = tempfile::tempdir().unwrap();
    let options = || ProxyOptions {
        data_dir: Some(data.path().to_owned()),
        ..ProxyOptions::default()
    };
    let id = [("x-handoff-conversation-id", "restart")];
    let mut messages = vec![json!({"role": "system", "content": "sys"}), user("q1")];

    let proxy = Proxy::start_with(&mock.url(), options());
    let got = post(&proxy, &id, &json!({"model": "m", "messages": messages})).await;
    messages.push(got.json()["choices"][0]["message"].clone());
    let call_id = messages[2]["tool_calls"][0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    messages.push(json!({"role": "tool", "tool_call_id": call_id, "content": "4"}));
    drop(proxy);

    let proxy = Proxy::start_with(&mock.url(), options());
    let got = post(&proxy, &id, &json!({"model": "m", "messages": messages})).await;
    assert_eq!(got.status, 200);
    messages.push(got.json()["choices"][0]["message"].clone());

    let output = proxy.audit(&["show", "restart"]);
    let timeline = String::from_utf8_lossy(&output.stdout);
    assert!(
        timeline.contains("new=1"),
        "only the tool result was new after the restart:\n{timeline}"
    );
    let replay = proxy.replay("restart", None);
    assert_eq!(
        replay.iter().map(canonical).collect::<Vec<_>>(),
        messages.iter().map(canonical).collect::<Vec<_>>()
    );
    assert!(proxy.audit(&["verify"]).status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_torn_last_line_is_reported_and_the_conversation_goes_on() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let proxy = Proxy::start(&mock.url());
    let id = [("x-handoff-conversation-id", "torn")];
    let mut messages = vec![user("first")];
    let got = post(&proxy, &id, &json!({"model": "m", "messages": messages})).await;
    messages.push(got.json()["choices"][0]["message"].clone());
    messages.push(user("second"));

    let log = proxy.conversation_dir("torn").join("messages.jsonl");
    let mut bytes = std::fs::read(&log).unwrap();
    bytes.extend_from_slice(br#"{"v":1,"at":"2026-01-01T00:00:00Z","kind":"message","dig"#);
    std::fs::write(&log, &bytes).unwrap();

    let verify = proxy.audit(&["verify", "torn"]);
    assert!(!verify.status.success());
    assert!(String::from_utf8_lossy(&verify.stdout).contains("torn last line"));

    let got = post(&proxy, &id, &json!({"model": "m", "messages": messages})).await;
    assert_eq!(got.status, 200);
    let replay = proxy.replay("torn", None);
    assert_eq!(replay.len(), 4);
    assert_eq!(replay[2], user("second"));
    // The torn fragment stays where it was, sealed as one bad line; the new lines are whole.
    let verify = String::from_utf8_lossy(&proxy.audit(&["verify", "torn"]).stdout).into_owned();
    assert_eq!(verify.lines().count(), 1, "{verify}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_conversation_ids_get_400_and_write_nothing() {
    let mock = MockUpstream::replying(Reply::chat_text("never")).await;
    let proxy = Proxy::start(&mock.url());
    let long = "x".repeat(200);
    for bad in ["../x", "a b", long.as_str(), "..", ""] {
        let got = post(
            &proxy,
            &[("x-handoff-conversation-id", bad)],
            &json!({"model": "m", "messages": [user("hi")]}),
        )
        .await;
        assert_eq!(got.status, 400, "{bad:?}");
        assert_eq!(got.json()["error"]["code"], "invalid_conversation_id");
        assert!(got.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("conversation id"));
    }
    assert!(mock.requests().is_empty());
    let mut written: Vec<PathBuf> = read_tree(proxy.dir()).into_iter().map(|(p, _)| p).collect();
    written.sort();
    let mut expected = vec![
        proxy.config_path().to_owned(),
        proxy.data_dir().join("secret"),
        proxy.data_dir().join("lock"),
    ];
    expected.sort();
    assert_eq!(
        written, expected,
        "nothing but the config, the server secret and the lock (made at start) may exist"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unwritable_store_refuses_with_503_unless_optional() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let mut proxy = Proxy::start(&mock.url());
    let id = [("x-handoff-conversation-id", "kept")];
    assert_eq!(
        post(&proxy, &id, &json!({"model": "m", "messages": [user("a")]}))
            .await
            .status,
        200
    );
    let before = std::fs::read(proxy.conversation_dir("kept").join("messages.jsonl")).unwrap();

    // Root ignores permission bits, so break the store in a way root cannot write through:
    // the log of a new conversation would need a folder where a file now stands.
    std::fs::write(
        proxy.conversation_dir("kept").with_file_name("blocked"),
        b"not a folder",
    )
    .unwrap();
    let got = post(
        &proxy,
        &[("x-handoff-conversation-id", "blocked")],
        &json!({"model": "m", "messages": [user("b")]}),
    )
    .await;
    assert_eq!(got.status, 503);
    assert_eq!(got.json()["error"]["type"], "storage_error");
    assert_eq!(
        mock.requests().len(),
        1,
        "an unlogged request must not go upstream"
    );
    assert_eq!(
        std::fs::read(proxy.conversation_dir("kept").join("messages.jsonl")).unwrap(),
        before
    );
    assert!(proxy.audit(&["verify", "kept"]).status.success());

    // One process per data dir: the first one stops before the lenient one starts.
    proxy.kill9();
    let lenient = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: "[store]\nrequired = false\n".into(),
            data_dir: Some(proxy.data_dir()),
            ..ProxyOptions::default()
        },
    );
    let got = post(
        &lenient,
        &[("x-handoff-conversation-id", "blocked")],
        &json!({"model": "m", "messages": [user("b")]}),
    )
    .await;
    assert_eq!(got.status, 200);
    lenient.wait_for_log("forwarding untracked", Duration::from_secs(5));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_private_and_hold_no_credentials() {
    let mock = MockUpstream::with(|req| {
        if req.json()["stream"] == true {
            Reply::chat_stream(&["x"], Duration::ZERO)
        } else {
            Reply::chat_text("y")
        }
    })
    .await;
    let proxy = Proxy::start(&mock.url());
    let secret = "sk-proj-DISKSECRET123456";
    let headers = [
        ("authorization", "Bearer sk-proj-DISKSECRET123456"),
        ("api-key", "azure-DISKSECRET-789"),
    ];
    post(
        &proxy,
        &headers,
        &json!({"model": "m", "messages": [user("hi")]}),
    )
    .await;
    post(
        &proxy,
        &headers,
        &json!({"model": "m", "messages": [user("hi")], "stream": true}),
    )
    .await;

    let files = read_tree(&proxy.data_dir());
    assert!(!files.is_empty());
    for (path, bytes) in &files {
        let text = String::from_utf8_lossy(bytes);
        assert!(
            !text.contains(secret) && !text.contains("DISKSECRET"),
            "{} holds a credential",
            path.display()
        );
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", path.display());
    }
    let dir_mode = std::fs::metadata(proxy.data_dir().join("tenants"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(dir_mode, 0o700);
    assert!(!proxy.logs().contains("DISKSECRET"));
}

/// A model that writes tool-call arguments with spaces (`{"command": "ls"}`), and a
/// client that parses them and re-sends them compact (`{"command":"ls"}`), as opencode
/// does, across a restart: one branch, and `audit replay` gives every request as the
/// client sent it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn re_serialised_tool_arguments_replay_as_the_client_sent_them() {
    let mock = crate::support::forms::spaced_tool_caller().await;
    let data = tempfile::tempdir().unwrap();
    let options = || ProxyOptions {
        data_dir: Some(data.path().to_owned()),
        ..ProxyOptions::default()
    };
    let mut proxy = Proxy::start_with(&mock.url(), options());
    let mut messages: Vec<String> =
        vec![r#"{"role":"user","content":"List the files, ten times."}"#.into()];
    let mut sent = Vec::new();
    for turn in 0..10 {
        if turn == 5 {
            // A restart reads the forms back from the log.
            proxy.kill9();
            proxy = Proxy::start_with(&mock.url(), options());
        }
        sent.push(messages.clone());
        crate::support::forms::turn(&proxy.url(), "spaced", &mut messages).await;
    }
    assert_eq!(proxy.conversations()[0]["branches"], 1);
    for (n, request) in sent.iter().enumerate() {
        let number = (n + 1).to_string();
        let replay = proxy.replay_raw(&["replay", "spaced", "--request", &number]);
        assert_eq!(replay[..request.len()], request[..], "request {number}");
        // Its reply as the model wrote it, spaces and all.
        assert!(
            replay[request.len()].contains(r#"\"command\": \"ls -la"#),
            "{}",
            replay[request.len()]
        );
    }
    let latest = proxy.replay_raw(&["replay", "spaced"]);
    assert_eq!(latest[..sent[9].len()], sent[9][..]);
    let show = String::from_utf8(proxy.audit(&["show", "spaced"]).stdout).unwrap();
    // Each call re-serialised once, carried by the request that sent it (inline: a
    // short call costs less there than as a form line and two digests).
    assert_eq!(
        show.matches(" forms=1 ").count(),
        9,
        "each re-serialised call written once: {show}"
    );
    assert_eq!(show.matches("  form  ").count(), 0, "{show}");
    proxy.assert_verified(&["spaced"]);
}
