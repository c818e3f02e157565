//! A gateway a team can share, on the real binary: neither team reaches the other's
//! upstream objects across a restart, `tpm` holds on a chunked body, the server's slots
//! cannot be held by silent sockets whatever the number of workers, credentials never
//! rest on disk, quotas hold on every route. The checks that need no process (the
//! model allow-list and a key's paths on every path, the base URL's prefix, unknown
//! object fields, the upstream key per host) are in `src/testing/team.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use crate::support::{Proxy, ProxyOptions};
use mock_upstream::{MockUpstream, Reply};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TEAM_A: &str = "hk-team-a-0123456789";
const TEAM_B: &str = "hk-team-b-9876543210";
const UPSTREAM_KEY: &str = "sk-upstream-shared-key-77";

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// [`team_proxy`] on an existing data directory.
fn team_proxy_on(upstream: &str, data: &std::path::Path) -> Proxy {
    team_proxy_with(upstream, "", Some(data.to_owned()))
}

/// Two teams behind one upstream key: team-a may use gpt-4o only, team-b has a `tpm`.
fn team_proxy(upstream: &str, extra: &str) -> Proxy {
    team_proxy_with(upstream, extra, None)
}

fn team_proxy_with(upstream: &str, extra: &str, data_dir: Option<std::path::PathBuf>) -> Proxy {
    let toml = format!(
        "[upstream]\napi_key_env = \"UPSTREAM_KEY_FOR_TEST\"\n{extra}\n\
         [[auth.keys]]\nname = \"team-a\"\nsha256 = \"{}\"\nmodels = [\"gpt-4o\"]\n\
         [[auth.keys]]\nname = \"team-b\"\nsha256 = \"{}\"\ntpm = 1000\n",
        sha256_hex(TEAM_A),
        sha256_hex(TEAM_B)
    );
    Proxy::start_with(
        upstream,
        ProxyOptions {
            extra_toml: toml,
            env: vec![("UPSTREAM_KEY_FOR_TEST".into(), UPSTREAM_KEY.into())],
            data_dir,
            ..Default::default()
        },
    )
}

/// Sends `head` (request line and headers, no blank line) and `body` as written, on a
/// fresh connection; returns the status and the whole response.
async fn raw(addr: SocketAddr, head: &str, body: &[u8]) -> (u16, String) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut bytes = format!("{head}\r\nhost: {addr}\r\nconnection: close\r\n\r\n").into_bytes();
    bytes.extend_from_slice(body);
    stream.write_all(&bytes).await.unwrap();
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut out)).await;
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, text)
}

/// A Responses request by `team` continuing `response_id`, named under `key` (the
/// field as the body spells it).
async fn follow_up(addr: SocketAddr, team: &str, key: &str, response_id: &str) -> (u16, String) {
    let follow = format!(r#"{{"model":"gpt-4o","{key}":"{response_id}","input":"and now?"}}"#);
    let (head, body) = post("/v1/responses", team, "application/json", follow.as_bytes());
    raw(addr, &head, &body).await
}

fn post(path: &str, key: &str, content_type: &str, body: &[u8]) -> (String, Vec<u8>) {
    (
        format!(
            "POST {path} HTTP/1.1\r\nauthorization: Bearer {key}\r\ncontent-type: {content_type}\r\ncontent-length: {}",
            body.len()
        ),
        body.to_vec(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tpm_is_charged_by_the_bytes_a_chunked_body_holds() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let proxy = team_proxy(&mock.url(), "");
    // 8,000 bytes, about 2,000 tokens: twice team-b's minute, sent without a length.
    let filler = "x".repeat(8_000);
    let body =
        format!(r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{filler}"}}]}}"#);
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    for _ in 0..5 {
        let (status, text) = raw(
            proxy.addr(),
            &format!("POST /v1/chat/completions HTTP/1.1\r\nauthorization: Bearer {TEAM_B}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked"),
            chunked.as_bytes(),
        )
        .await;
        // Larger than a whole minute once read: refused, however it was sent.
        assert_eq!(status, 429, "{text}");
        assert!(text.contains("larger than"), "{text}");
    }
    assert!(
        mock.requests().is_empty(),
        "an oversize body reached the upstream"
    );
    // A body within the minute still goes, and gives back what it did not use.
    let small = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let chunked = format!("{:x}\r\n{small}\r\n0\r\n\r\n", small.len());
    for _ in 0..2 {
        let (status, text) = raw(
            proxy.addr(),
            &format!("POST /v1/chat/completions HTTP/1.1\r\nauthorization: Bearer {TEAM_B}\r\ncontent-type: application/json\r\ntransfer-encoding: chunked"),
            chunked.as_bytes(),
        )
        .await;
        assert_eq!(status, 200, "{text}");
    }
}

/// An upstream that stores what it is asked to: responses and files, each answered
/// with a fresh id, and anything named by id answered as found.
async fn storing_upstream() -> MockUpstream {
    let serial = std::sync::atomic::AtomicUsize::new(0);
    MockUpstream::with(move |request| {
        let n = serial.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = request.target.split('?').next().unwrap_or("").to_owned();
        match (request.method.as_str(), path.as_str()) {
            ("POST", "/v1/responses") => Reply::json(serde_json::json!({
                "id": format!("resp_stored{n}"), "object": "response", "status": "completed",
                "model": "gpt-4o",
                "output": [{"type": "message", "id": format!("msg_{n}"), "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": "stored", "annotations": []}]}],
                "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}})),
            ("POST", "/v1/files") => Reply::json(serde_json::json!({
                "id": format!("file-up{n}"), "object": "file", "bytes": 4, "purpose": "batch"})),
            _ => Reply::json(serde_json::json!({"id": "whatever", "object": "found", "deleted": false})),
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_team_never_reaches_another_teams_upstream_objects() {
    let mock = storing_upstream().await;
    let proxy = team_proxy(&mock.url(), "");
    let addr = proxy.addr();
    // Team A stores a response and uploads a file.
    let stored = br#"{"model":"gpt-4o","store":true,"input":"remember this"}"#;
    let (head, body) = post("/v1/responses", TEAM_A, "application/json", stored);
    let (status, text) = raw(addr, &head, &body).await;
    assert_eq!(status, 200, "{text}");
    let response_id = text
        .split("\"id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    assert!(response_id.starts_with("resp_"), "{text}");
    let form = b"--B1\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--B1\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.jsonl\"\r\n\r\n{}\n\r\n--B1--\r\n";
    let (head, body) = post(
        "/v1/files",
        TEAM_A,
        "multipart/form-data; boundary=B1",
        form,
    );
    let (status, text) = raw(addr, &head, &body).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("file-up"), "{text}");
    let file_id = text
        .split("\"id\":\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let before = mock.requests().len();

    // Team B can neither read, delete nor continue them, nor list the account's files.
    let get = |key: &str, path: &str, method: &str| {
        format!("{method} {path} HTTP/1.1\r\nauthorization: Bearer {key}")
    };
    for (method, path) in [
        ("GET", format!("/v1/responses/{response_id}")),
        ("DELETE", format!("/v1/responses/{response_id}")),
        ("GET", format!("/v1/responses/{response_id}/input_items")),
        ("GET", format!("/v1/files/{file_id}")),
        ("GET", format!("/v1/files/{file_id}/content")),
        ("DELETE", format!("/v1/files/{file_id}")),
        ("GET", "/v1/files/file-never-made".to_owned()),
    ] {
        let (status, text) = raw(addr, &get(TEAM_B, &path, method), b"").await;
        assert_eq!(status, 404, "{method} {path}: {text}");
    }
    let (status, text) = raw(addr, &get(TEAM_B, "/v1/files", "GET"), b"").await;
    assert_eq!(status, 403, "{text}");
    // Also with the key spelled in escapes, which the upstream reads as the name.
    for key in ["previous_response_id", r"previous_resp\u006fnse_id"] {
        let (status, text) = follow_up(addr, TEAM_B, key, &response_id).await;
        assert_eq!(status, 404, "{key}: {text}");
    }
    let batch = format!(
        r#"{{"input_file_id":"{file_id}","endpoint":"/v1/chat/completions","completion_window":"24h"}}"#
    );
    let (head, body) = post("/v1/batches", TEAM_B, "application/json", batch.as_bytes());
    let (status, text) = raw(addr, &head, &body).await;
    assert_eq!(status, 404, "{text}");
    assert_eq!(mock.requests().len(), before, "team B reached the upstream");

    // Team A still reaches its own.
    for path in [
        format!("/v1/responses/{response_id}"),
        format!("/v1/files/{file_id}"),
    ] {
        let (status, text) = raw(addr, &get(TEAM_A, &path, "GET"), b"").await;
        assert_eq!(status, 200, "{path}: {text}");
    }
    let (status, text) = follow_up(addr, TEAM_A, "previous_response_id", &response_id).await;
    assert_eq!(status, 200, "{text}");

    // Ownership is on disk: after a restart, the file is still team A's alone.
    let mut proxy = proxy;
    let data = proxy.data_dir();
    proxy.signal("TERM");
    proxy.wait_exit(Duration::from_secs(10));
    let again = team_proxy_on(&mock.url(), &data);
    let path = format!("/v1/files/{file_id}");
    let (status, _) = raw(again.addr(), &get(TEAM_A, &path, "GET"), b"").await;
    assert_eq!(status, 200);
    let (status, _) = raw(again.addr(), &get(TEAM_B, &path, "GET"), b"").await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_execution_container_is_the_tenant_s_whose_reply_ran_in_it() {
    let mock = MockUpstream::with(|_| {
        Reply::json(
            serde_json::json!({"id": "msg_1", "type": "message", "role": "assistant",
            "model": "claude-x", "content": [{"type": "text", "text": "ran"}],
            "stop_reason": "end_turn", "stop_sequence": null,
            "usage": {"input_tokens": 5, "output_tokens": 1},
            "container": {"id": "container_011ran", "expires_at": "2026-12-07T02:00:00Z"}}),
        )
    })
    .await;
    let proxy = team_proxy(&mock.url(), "");
    let addr = proxy.addr();
    let ask = |team: &'static str, container: Option<serde_json::Value>| async move {
        // team-a may use gpt-4o only: the model's name is all the mock reads of it.
        let mut body = serde_json::json!({"model": "gpt-4o", "max_tokens": 16,
            "tools": [{"type": "code_execution_20250825", "name": "code_execution"}],
            "messages": [{"role": "user", "content": format!("run it for {team}")}]});
        if let Some(container) = container {
            body["container"] = container;
        }
        let body = body.to_string();
        let (head, body) = post("/v1/messages", team, "application/json", body.as_bytes());
        raw(addr, &head, &body).await
    };
    // Team A's reply ran in a container: it is team A's from then on.
    let (status, text) = ask(TEAM_A, None).await;
    assert_eq!(status, 200, "{text}");
    let (status, text) = ask(TEAM_A, Some(serde_json::json!("container_011ran"))).await;
    assert_eq!(status, 200, "{text}");
    let before = mock.requests().len();
    // Team B names it by id or inside a container object; anyone names one never made.
    for (team, container) in [
        (TEAM_B, serde_json::json!("container_011ran")),
        (
            TEAM_B,
            serde_json::json!({"id": "container_011ran", "skills": []}),
        ),
        (TEAM_A, serde_json::json!("container_never_made")),
    ] {
        let (status, text) = ask(team, Some(container.clone())).await;
        assert_eq!(status, 404, "{container}: {text}");
    }
    assert_eq!(
        mock.requests().len(),
        before,
        "a refused request reached the upstream"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_credential_an_upstream_echoes_is_never_stored() {
    // No known key shape: only its value can find it.
    let plain = "upstream-plain-credential-4242";
    let mock = MockUpstream::with(|request| {
        let body = String::from_utf8_lossy(&request.body);
        if body.contains(mock_upstream::strict::SUMMARY_PROMPT_START) {
            let presented = request
                .headers
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("")
                .trim_start_matches("Bearer ")
                .to_owned();
            // Quoted plain, and as a URL carries it, every byte escaped.
            let escaped: String = presented.bytes().map(|b| format!("%{b:02X}")).collect();
            return Reply::error(
                401,
                "invalid_api_key",
                &format!("Invalid credential {presented} (GET /v1/models?key={escaped})"),
            );
        }
        Reply::chat_text("ok")
    })
    .await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: "[upstream]\napi_key_env = \"PLAIN_KEY_FOR_TEST\"\n[models.\"small\"]\ncontext_window = 2000\n".into(),
            env: vec![("PLAIN_KEY_FOR_TEST".into(), plain.into())],
            ..Default::default()
        },
    );
    let mut messages = vec![serde_json::json!({"role": "system", "content": "be brief"})];
    for n in 0..12 {
        messages.push(crate::support::scenario::big_user(n, 200));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("noted {n}")}));
    }
    messages.push(serde_json::json!({"role": "user", "content": "and now?"}));
    let got = crate::support::scenario::post_chat(
        &proxy,
        &[("x-handoff-conversation-id", "echoed")],
        &serde_json::json!({"model": "small", "messages": messages}),
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let records = crate::support::scenario::records(&proxy, "echoed");
    assert!(
        records
            .iter()
            .any(|r| r.to_string().contains("Invalid credential")),
        "the summary attempt failed with the upstream's message: {records:?}"
    );
    let timeline = crate::support::client::send(crate::support::client::request(
        "GET",
        &format!("{}/handoff/conversations/echoed/timeline", proxy.url()),
        &[],
        "",
    ))
    .await;
    assert_eq!(timeline.status, 200);
    for (where_, text) in [("the log", proxy.logs()), ("the timeline", timeline.text())]
        .into_iter()
        .chain(
            crate::support::read_tree(&proxy.data_dir())
                .into_iter()
                .map(|(path, bytes)| {
                    (
                        path.display().to_string().leak() as &str,
                        String::from_utf8_lossy(&bytes).into_owned(),
                    )
                }),
        )
    {
        assert!(!text.contains(plain), "the credential is in {where_}");
        assert!(
            !text.contains("%75%70%73%74%72%65%61%6D"),
            "the URL-encoded credential is in {where_}"
        );
    }
}

/// Opens `n` connections that never send a byte.
async fn silent_sockets(addr: SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut held = Vec::new();
    for _ in 0..n {
        held.push(tokio::net::TcpStream::connect(addr).await.unwrap());
    }
    // Let the proxy accept them all.
    tokio::time::sleep(Duration::from_millis(300)).await;
    held
}

/// How many of `held` the proxy closed, waiting up to `wait` for the first.
async fn shed_count(held: &mut [tokio::net::TcpStream], wait: Duration) -> usize {
    let deadline = tokio::time::Instant::now() + wait;
    let mut closed = vec![false; held.len()];
    while tokio::time::Instant::now() < deadline {
        for (socket, closed) in held.iter_mut().zip(closed.iter_mut()) {
            let mut byte = [0u8; 1];
            let read = tokio::time::timeout(Duration::from_millis(20), socket.read(&mut byte));
            if matches!(read.await, Ok(Ok(0)) | Ok(Err(_))) {
                *closed = true;
            }
        }
        if closed.contains(&true) {
            break;
        }
    }
    closed.iter().filter(|closed| **closed).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_cannot_lock_everyone_out() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: "[limits]\nmax_connections = 8\nmax_connections_per_peer = 6\nheader_timeout = \"60s\"\n".into(),
            ..Default::default()
        },
    );
    // Every slot a peer may hold, silent: the next connection of that peer sheds the
    // oldest, and a real request is served at once, not after header_timeout.
    let mut held = silent_sockets(proxy.addr(), 6).await;
    let body = br#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    let (head, body) = post(
        "/v1/chat/completions",
        "sk-client-1234567",
        "application/json",
        body,
    );
    let served = tokio::time::timeout(Duration::from_secs(10), raw(proxy.addr(), &head, &body))
        .await
        .expect("served while the peer's slots were silent");
    assert_eq!(served.0, 200, "{}", served.1);
    // Each worker accepts from its own listener, so the socket admitted first need not
    // be the one connected first: exactly one of them was shed, whichever it was.
    assert_eq!(
        shed_count(&mut held, Duration::from_secs(5)).await,
        1,
        "one silent socket was shed"
    );
    // With every global slot silent too, a new client still gets in.
    held.extend(silent_sockets(proxy.addr(), 8).await);
    let served = tokio::time::timeout(Duration::from_secs(10), raw(proxy.addr(), &head, &body))
        .await
        .expect("served while every slot was silent");
    assert_eq!(served.0, 200, "{}", served.1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_slot_is_usable_whatever_the_number_of_workers() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: "workers = 2\n[limits]\nmax_connections = 4\nheader_timeout = \"60s\"\n"
                .into(),
            ..Default::default()
        },
    );
    // max_connections silent sockets fit: none is shed to make room for a worker.
    let mut held = silent_sockets(proxy.addr(), 4).await;
    assert_eq!(shed_count(&mut held, Duration::from_secs(1)).await, 0);
    // One more is over the limit: the oldest silent one makes room for it.
    held.extend(silent_sockets(proxy.addr(), 1).await);
    assert_eq!(shed_count(&mut held, Duration::from_secs(5)).await, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_of_tiny_messages_is_refused_before_it_is_written() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: "[limits]\nmax_messages = 100\n".into(),
            ..Default::default()
        },
    );
    let messages: Vec<String> = (0..101)
        .map(|_| r#"{"role":"user","content":""}"#.to_owned())
        .collect();
    let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
    let (head, body) = post(
        "/v1/chat/completions",
        "sk-client-1234567",
        "application/json",
        body.as_bytes(),
    );
    let (status, text) = raw(proxy.addr(), &head, &body).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("too_many_messages"), "{text}");
    assert!(mock.requests().is_empty());
    assert!(proxy.conversation_dirs().is_empty(), "nothing was logged");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_of_any_kind_is_at_rest_after_mixed_traffic() {
    let mock = MockUpstream::with(|request| {
        if request.target.starts_with("/v1/messages") {
            return Reply::json(serde_json::json!({"id": "msg_1", "type": "message", "role": "assistant",
                "model": "claude", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                "stop_sequence": null, "usage": {"input_tokens": 3, "output_tokens": 1}}));
        }
        Reply::chat_text("fine")
    })
    .await;
    let admin = "admin-token-never-stored-31";
    let extra = format!("[admin]\ntoken = \"{admin}\"\n");
    let proxy = team_proxy(&mock.url(), &extra);
    let chat = br#"{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}"#;
    let claude =
        br#"{"model":"claude","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#;
    for (head, body) in [
        post("/v1/chat/completions", TEAM_A, "application/json", chat),
        (
            format!("POST /v1/messages HTTP/1.1\r\nx-api-key: {TEAM_B}\r\nanthropic-version: 2023-06-01\r\ncontent-type: application/json\r\ncontent-length: {}", claude.len()),
            claude.to_vec(),
        ),
        (
            format!("POST /v1/chat/completions HTTP/1.1\r\napi-key: {TEAM_A}\r\nauthorization: Bearer {TEAM_A}\r\ncontent-type: application/json\r\ncontent-length: {}", chat.len()),
            chat.to_vec(),
        ),
        (format!("GET /v1/models HTTP/1.1\r\nauthorization: Bearer {TEAM_B}"), Vec::new()),
        (format!("GET /handoff/conversations HTTP/1.1\r\nauthorization: Bearer {admin}"), Vec::new()),
        (format!("GET /handoff/config HTTP/1.1\r\nauthorization: Bearer {admin}"), Vec::new()),
        (format!("GET /handoff/metrics HTTP/1.1\r\nauthorization: Bearer {admin}"), Vec::new()),
        // A wrong key, in each header, is a credential too.
        post("/v1/chat/completions", "hk-wrong-key-99999999", "application/json", chat),
    ] {
        let (status, text) = raw(proxy.addr(), &head, &body).await;
        assert!(status < 500, "{status}: {text}");
        for secret in [TEAM_A, TEAM_B, UPSTREAM_KEY, admin] {
            assert!(!text.contains(secret), "an answer shows a credential: {text}");
        }
    }
    let logs = proxy.logs();
    let stored: Vec<(String, String)> = crate::support::read_tree(&proxy.data_dir())
        .into_iter()
        .map(|(path, bytes)| {
            (
                path.display().to_string(),
                String::from_utf8_lossy(&bytes).into_owned(),
            )
        })
        .collect();
    assert!(!stored.is_empty());
    for secret in [TEAM_A, TEAM_B, UPSTREAM_KEY, admin, "hk-wrong-key-99999999"] {
        assert!(!logs.contains(secret), "{secret} is in the log");
        for (path, text) in &stored {
            assert!(!text.contains(secret), "{secret} is in {path}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_past_its_disk_quota_gets_507_and_others_go_on() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let proxy = team_proxy(&mock.url(), "[store]\ntenant_quota_bytes = 20000\n");
    let chat = |n: usize| {
        format!(
            r#"{{"model":"gpt-4o","messages":[{{"role":"user","content":"{n} {}"}}]}}"#,
            "x".repeat(3000)
        )
    };
    let mut statuses = Vec::new();
    for n in 0..12 {
        let body = chat(n);
        let (head, body) = post(
            "/v1/chat/completions",
            TEAM_A,
            "application/json",
            body.as_bytes(),
        );
        let (status, text) = raw(proxy.addr(), &head, &body).await;
        if status == 507 {
            assert!(text.contains("tenant_quota_exceeded"), "{text}");
        }
        statuses.push(status);
    }
    // Each request writes its 3 KB message, its request line, its decision and the
    // reply: four fit in 20,000 bytes, and not all twelve.
    let served = statuses.iter().filter(|s| **s == 200).count();
    assert!((4..12).contains(&served), "{statuses:?}");
    assert!(statuses[served..].iter().all(|s| *s == 507), "{statuses:?}");
    let body = chat(99);
    let (head, body) = post(
        "/v1/chat/completions",
        TEAM_B,
        "application/json",
        body.as_bytes(),
    );
    assert_eq!(
        raw(proxy.addr(), &head, &body).await.0,
        200,
        "another tenant is not held up"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_over_a_lowered_quota_is_refused_before_its_body_is_read_on_every_route() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let data = tempfile::tempdir().unwrap();
    let first = team_proxy_with(&mock.url(), "", Some(data.path().to_owned()));
    let body = r#"{"model":"gpt-4o","messages":[{"role":"user","content":"hello there"}]}"#;
    let (head, body) = post(
        "/v1/chat/completions",
        TEAM_A,
        "application/json",
        body.as_bytes(),
    );
    assert_eq!(raw(first.addr(), &head, &body).await.0, 200);
    drop(first);
    // The operator lowers the quota under what team-a's log already holds.
    let proxy = team_proxy_with(
        &mock.url(),
        "[store]\ntenant_quota_bytes = 100\n",
        Some(data.path().to_owned()),
    );
    let forwarded = mock.requests().len();
    let held = || crate::support::read_tree(&data.path().join("tenants"));
    let before = held();
    // One intake for every route: a body that would not even parse gets the 507, not
    // a 400, on the three tracked APIs and a pass-through path alike, each in its API's
    // shape, and nothing goes upstream.
    let refused = [
        ("/v1/chat/completions", r#"{"model":"gpt-4o","messages":["#),
        (
            "/v1/messages",
            r#"{"model":"gpt-4o","max_tokens":9,"messages":[]}"#,
        ),
        ("/v1/responses", r#"{"model":"gpt-4o","input":"hi"}"#),
        ("/v1/embeddings", r#"{"model":"gpt-4o","input":"hi"}"#),
    ];
    for (path, body) in refused {
        let (head, body) = post(path, TEAM_A, "application/json", body.as_bytes());
        let (status, text) = raw(proxy.addr(), &head, &body).await;
        assert_eq!(status, 507, "{path}: {text}");
        assert!(text.contains("tenant_quota_exceeded"), "{path}: {text}");
        if path == "/v1/messages" {
            assert!(
                text.contains(r#""type":"error""#),
                "Anthropic's shape: {text}"
            );
        }
    }
    assert_eq!(
        mock.requests().len(),
        forwarded,
        "nothing refused went upstream"
    );
    // Reading writes nothing: the same tenant's GET still goes through.
    let get = format!("GET /v1/models HTTP/1.1\r\nauthorization: Bearer {TEAM_A}");
    let (status, text) = raw(proxy.addr(), &get, b"").await;
    assert_eq!(status, 200, "{text}");
    assert!(held() == before, "the refused requests wrote nothing");
}
