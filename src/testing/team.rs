//! One handoff shared by teams, on the in-process harness with the keys handed to it:
//! a key's model allow-list on every path, paths that cannot leave the base URL, a
//! key's own paths, object-naming fields handoff cannot own, and the upstream key sent
//! to its own host only. The contracts of the server itself (its slots, silent sockets,
//! workers) stay on the real binary (`tests/e2e/team.rs`).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::net::SocketAddr;
use std::time::Duration;

use mock_upstream::{MockUpstream, Reply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{sha256_hex, Harness};
use crate::auth::Secrets;

const TEAM_A: &str = "hk-team-a-0123456789";
const TEAM_B: &str = "hk-team-b-9876543210";
const UPSTREAM_KEY: &str = "sk-upstream-shared-key-77";

/// Two teams behind one upstream key: team-a may use gpt-4o only, team-b has a `tpm`;
/// `extra` goes into `[upstream]`, `keys` after the two teams.
async fn team_proxy(upstream: &str, extra: &str, keys: &str) -> Harness {
    let toml = format!(
        "[upstream]\napi_key_env = \"UPSTREAM_KEY\"\n{extra}\n\
         [[auth.keys]]\nname = \"team-a\"\nsha256 = \"{}\"\nmodels = [\"gpt-4o\"]\n\
         [[auth.keys]]\nname = \"team-b\"\nsha256 = \"{}\"\ntpm = 1000\n{keys}",
        sha256_hex(TEAM_A),
        sha256_hex(TEAM_B)
    );
    let secrets = Secrets::given(&[("UPSTREAM_KEY", UPSTREAM_KEY)]);
    Harness::start_with(upstream, &toml, secrets).await
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

/// A `POST path` head with `key` as the bearer, and `body`.
fn post(path: &str, key: &str, content_type: &str, body: &[u8]) -> (String, Vec<u8>) {
    (
        format!(
            "POST {path} HTTP/1.1\r\nauthorization: Bearer {key}\r\ncontent-type: {content_type}\r\ncontent-length: {}",
            body.len()
        ),
        body.to_vec(),
    )
}

#[tokio::test]
async fn a_model_allow_list_holds_on_every_path() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let proxy = team_proxy(&mock.url(), "", "").await;
    let json = |model: &str| {
        format!(
            r#"{{"model":"{model}","input":"hi","messages":[{{"role":"user","content":"hi"}}]}}"#
        )
    };
    for path in [
        "/v1/completions",
        "/v1/embeddings",
        "/v1/responses/compact",
        "/v1/messages/count_tokens",
        "/v1/moderations",
    ] {
        let (head, body) = post(path, TEAM_A, "application/json", json("gpt-4.1").as_bytes());
        let (status, text) = raw(proxy.addr(), &head, &body).await;
        assert_eq!(status, 403, "{path}: {text}");
        assert!(text.contains("model_not_allowed"), "{path}: {text}");
    }
    // Paths that only look like the tracked one are refused outright.
    for path in [
        "/v1/chat/completions/",
        "/v1/chat/completions;x",
        "/v1//chat/completions",
    ] {
        let (head, body) = post(path, TEAM_A, "application/json", json("gpt-4.1").as_bytes());
        let (status, text) = raw(proxy.addr(), &head, &body).await;
        assert_eq!(status, 400, "{path}: {text}");
        assert!(text.contains("invalid_path"), "{path}: {text}");
    }
    // A form names its model too.
    let form = b"--B0\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\r\n--B0\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--B0--\r\n";
    let (head, body) = post(
        "/v1/audio/transcriptions",
        TEAM_A,
        "multipart/form-data; boundary=B0",
        form,
    );
    let (status, text) = raw(proxy.addr(), &head, &body).await;
    assert_eq!(status, 403, "{text}");
    assert!(
        mock.requests().is_empty(),
        "a disallowed model reached the upstream"
    );
    // An allowed model passes, with the server's key.
    let (head, body) = post(
        "/v1/embeddings",
        TEAM_A,
        "application/json",
        json("gpt-4o").as_bytes(),
    );
    let (status, text) = raw(proxy.addr(), &head, &body).await;
    assert_eq!(status, 200, "{text}");
    let seen = mock.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].headers.get("authorization").unwrap(),
        &format!("Bearer {UPSTREAM_KEY}")
    );
}

#[tokio::test]
async fn dot_segments_never_leave_the_base_url_prefix() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let proxy = team_proxy(&format!("{}/gw/openai", mock.url()), "", "").await;
    for path in [
        "/../../outside",
        "/v1/%2e%2e/%2E%2E/outside",
        "/v1/..%2foutside",
        "/v1/./models",
    ] {
        let head = format!("GET {path} HTTP/1.1\r\nauthorization: Bearer {TEAM_A}");
        let (status, text) = raw(proxy.addr(), &head, b"").await;
        assert_eq!(status, 400, "{path}: {text}");
    }
    let sent: Vec<String> = mock.requests().iter().map(|r| r.target.clone()).collect();
    assert!(sent.is_empty(), "{sent:?}");
}

#[tokio::test]
async fn a_key_reaches_only_its_paths() {
    let mock = MockUpstream::replying(Reply::chat_text("fine")).await;
    let embedder = format!(
        "[[auth.keys]]\nname = \"embedder\"\nsha256 = \"{}\"\npaths = [\"/v1/embeddings\"]\n",
        sha256_hex("hk-embedder-55555555")
    );
    let proxy = team_proxy(&mock.url(), "", &embedder).await;
    let get = |key: &str, path: &str| format!("GET {path} HTTP/1.1\r\nauthorization: Bearer {key}");
    // The default list: the inference APIs, never the account's admin APIs.
    for path in [
        "/v1/organization/admin_api_keys",
        "/v1/fine_tuning/jobs/ftjob-1",
        "/v1/organization/users",
    ] {
        let (status, text) = raw(proxy.addr(), &get(TEAM_A, path), b"").await;
        assert_eq!(status, 403, "{path}: {text}");
        assert!(text.contains("path_not_allowed"), "{text}");
    }
    let (status, _) = raw(proxy.addr(), &get(TEAM_A, "/v1/models"), b"").await;
    assert_eq!(status, 200);
    // A key's own list.
    let (head, body) = post(
        "/v1/embeddings",
        "hk-embedder-55555555",
        "application/json",
        br#"{"model":"e","input":"x"}"#,
    );
    assert_eq!(raw(proxy.addr(), &head, &body).await.0, 200);
    let (head, body) = post(
        "/v1/chat/completions",
        "hk-embedder-55555555",
        "application/json",
        br#"{"model":"m","messages":[]}"#,
    );
    assert_eq!(raw(proxy.addr(), &head, &body).await.0, 403);
    let longer = get("hk-embedder-55555555", "/v1/embeddingsX");
    assert_eq!(
        raw(proxy.addr(), &longer, b"").await.0,
        403,
        "a prefix covers what is below it, not a longer name"
    );
}

/// An upstream that answers a Responses request with a stored response.
async fn storing_upstream() -> MockUpstream {
    MockUpstream::with(move |_| {
        Reply::json(serde_json::json!({
            "id": "resp_stored0", "object": "response", "status": "completed", "model": "gpt-4o",
            "output": [{"type": "message", "id": "msg_0", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "stored", "annotations": []}]}],
            "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}}))
    })
    .await
}

#[tokio::test]
async fn a_field_naming_an_object_kind_handoff_does_not_know_is_refused() {
    let mock = storing_upstream().await;
    let proxy = team_proxy(&mock.url(), "", "").await;
    let send = |body: &'static str| {
        let addr = proxy.addr();
        async move {
            let (head, body) = post("/v1/responses", TEAM_A, "application/json", body.as_bytes());
            raw(addr, &head, &body).await
        }
    };
    let (status, text) = send(r#"{"model":"gpt-4o","input":"hi","eval_id":"eval_abc123"}"#).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("eval_id"), "{text}");
    assert!(mock.requests().is_empty(), "nothing was sent");
    // What a client writes freely passes: metadata, a tool call's id.
    let (status, text) = send(
        r#"{"model":"gpt-4o","metadata":{"trace_id":"t-123456"},"input":[{"role":"user","content":"hi"},{"type":"function_call_output","call_id":"call_123456","output":"ok"}]}"#,
    )
    .await;
    assert_eq!(status, 200, "{text}");
    // And an operator who must can let such fields through.
    let open = team_proxy(&mock.url(), "pass_unknown_ids = true", "").await;
    let (head, body) = post(
        "/v1/responses",
        TEAM_A,
        "application/json",
        br#"{"model":"gpt-4o","input":"hi","eval_id":"eval_abc123"}"#,
    );
    let (status, text) = raw(open.addr(), &head, &body).await;
    assert_eq!(status, 200, "{text}");
}

#[tokio::test]
async fn the_upstream_key_goes_only_to_its_own_host() {
    let main = MockUpstream::replying(Reply::chat_text("main")).await;
    let other = MockUpstream::replying(Reply::chat_text("other")).await;
    let keyed = MockUpstream::replying(Reply::chat_text("keyed")).await;
    let config = format!(
        "[upstream]\napi_key_env = \"UPSTREAM_KEY\"\n\
         [[routes]]\nmatch = \"other-*\"\nupstream = \"{}\"\n\
         [[routes]]\nmatch = \"keyed-*\"\nupstream = \"{}\"\napi_key_env = \"KEYED_KEY\"\n",
        other.url(),
        keyed.url()
    );
    let secrets = Secrets::given(&[
        ("UPSTREAM_KEY", UPSTREAM_KEY),
        ("KEYED_KEY", "sk-keyed-route-own-key-11"),
    ]);
    let proxy = Harness::start_with(&main.url(), &config, secrets).await;
    for model in ["gpt-4o", "other-1", "keyed-1"] {
        let body = format!(
            r#"{{"model":"{model}","messages":[{{"role":"user","content":"hi {model}"}}]}}"#
        );
        let (head, body) = post(
            "/v1/chat/completions",
            "sk-client-own-key-22",
            "application/json",
            body.as_bytes(),
        );
        let (status, text) = raw(proxy.addr(), &head, &body).await;
        assert_eq!(status, 200, "{model}: {text}");
    }
    let auth = |mock: &MockUpstream| {
        mock.requests()
            .iter()
            .map(|r| {
                r.headers
                    .get("authorization")
                    .map(|v| v.to_str().unwrap().to_owned())
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(auth(&main), [Some(format!("Bearer {UPSTREAM_KEY}"))]);
    // Another host gets neither the server's key nor the client's.
    assert_eq!(auth(&other), [None]);
    assert_eq!(
        auth(&keyed),
        [Some("Bearer sk-keyed-route-own-key-11".to_owned())]
    );
}
