//! The stub dialect (`handoff-wire`'s `stub` feature) driven through the router: what a
//! fourth wire format gets from the core without the core learning it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use mock_upstream::{MockUpstream, Reply};
use serde_json::json;

use crate::dialect::pair::CONTINUATION;
use crate::testing::Harness;

const CONFIG: &str =
    "[models.\"t\"]\ncontext_window = 2000\n[compaction]\nstrategy = \"extract\"\n";

fn turn(index: usize) -> serde_json::Value {
    let filler = "word ".repeat(200);
    json!({"role": "user", "content": format!("turn {index}: remember TALLY-{index:03}. {filler}")})
}

#[tokio::test]
async fn a_tally_conversation_is_tracked_compacted_and_answered_in_its_own_shape() {
    // It reports the input it counted (bytes / 4), which handoff calibrates on.
    let mock = MockUpstream::with(|recorded| {
        let counted = recorded.body.len() / 4;
        Reply::json(json!({"turn": {"role": "assistant", "content": "noted"}, "stop": "end", "tally": {"in": counted, "out": 1}}))
    })
    .await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let mut turns = Vec::new();
    for index in 0..12 {
        turns.push(turn(index));
        let body = json!({"model": "t", "turns": turns});
        let answer = proxy
            .post(
                "/v1/tally/generate",
                &[("x-tally-key", "tk-1"), ("tally-version", "2")],
                body.to_string().as_bytes(),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert_eq!(answer.json()["turn"]["content"], "noted");
        turns.push(json!({"role": "assistant", "content": "noted"}));
    }
    let seen = mock.requests();
    let last = seen.last().unwrap();
    assert_eq!(last.target, "/v1/tally/generate");
    assert_eq!(last.headers["x-tally-key"], "tk-1");
    let sent = last.json();
    let sent = sent["turns"].as_array().unwrap();
    let sizes: Vec<usize> = seen
        .iter()
        .map(|r| r.json()["turns"].as_array().map_or(0, Vec::len))
        .collect();
    assert!(
        sent.len() < turns.len() - 1,
        "the view was compacted: {sizes:?}"
    );
    assert_eq!(sent[0]["content"], CONTINUATION);
    let handoff = sent[1]["content"].as_str().unwrap();
    assert_eq!(sent[1]["role"], "assistant");
    assert!(handoff.contains("remember TALLY-0"), "{handoff}");
    assert_eq!(
        sent.last().unwrap()["content"],
        turns[turns.len() - 2]["content"]
    );
    // The conversation, its replies and its compaction are tracked.
    let conversations = proxy
        .state
        .tracker
        .store()
        .list(None, None, 10)
        .await
        .unwrap();
    assert_eq!(conversations.len(), 1);
    let log = proxy
        .state
        .tracker
        .store()
        .read(&conversations[0])
        .await
        .unwrap();
    assert!(!log.compactions.is_empty());
}

#[tokio::test]
async fn errors_on_tally_paths_come_in_the_tally_shape_and_an_overflow_is_recovered() {
    let mock = MockUpstream::with(|recorded| {
        let turns = recorded.json()["turns"].as_array().map_or(0, Vec::len);
        if turns > 8 {
            Reply::Json {
                status: http::StatusCode::BAD_REQUEST,
                body: json!({"fault": {"code": "window_exceeded", "detail": "too long"}}),
            }
        } else {
            Reply::json(json!({"turn": {"role": "assistant", "content": "ok"}, "stop": "end", "tally": {"in": 5, "out": 1}}))
        }
    })
    .await;
    let proxy = Harness::start(&mock.url(), CONFIG).await;
    let broken = proxy
        .post("/v1/tally/generate", &[], b"{\"turns\": [")
        .await;
    assert_eq!(broken.status, 400);
    assert!(
        broken.json()["fault"]["detail"].is_string(),
        "{}",
        broken.text()
    );
    let short: Vec<_> = (0..10)
        .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("short {i} {}", "word ".repeat(80))}))
        .collect();
    let body = json!({"model": "t", "turns": short});
    let answer = proxy
        .post("/v1/tally/generate", &[], body.to_string().as_bytes())
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    let seen = mock.requests();
    assert!(seen.len() >= 2, "the overflow was retried compacted");
}

async fn conversations(proxy: &Harness) -> Vec<crate::base::id::ConversationId> {
    proxy
        .state
        .tracker
        .store()
        .list(None, None, 10)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_tally_key_is_a_credential_a_tenant_and_a_proxy_key() {
    let mock = MockUpstream::with(|_| {
        Reply::json(json!({"turn": {"role": "assistant", "content": "noted"}, "stop": "end", "tally": {"in": 10, "out": 1}}))
    })
    .await;
    let body = json!({"model": "t", "turns": [turn(0)]}).to_string();
    // Without proxy keys, the key in the API's own header names the tenant, as the
    // same key in `Authorization` does.
    let open = Harness::start(&mock.url(), CONFIG).await;
    let sent: [(&str, &[(&str, &str)]); 3] = [
        ("in-key-header", &[("x-tally-key", "tk-1")]),
        ("in-bearer", &[("authorization", "Bearer tk-1")]),
        ("no-key", &[]),
    ];
    for (id, headers) in sent {
        let mut headers = headers.to_vec();
        headers.push(("x-handoff-conversation-id", id));
        let answer = open
            .post("/v1/tally/generate", &headers, body.as_bytes())
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
    }
    let listed = conversations(&open).await;
    let tenant = |id: &str| {
        listed
            .iter()
            .find(|c| c.as_str() == id)
            .map(|c| c.tenant().clone())
            .unwrap()
    };
    assert_eq!(tenant("in-key-header"), tenant("in-bearer"));
    assert_ne!(tenant("in-key-header"), tenant("no-key"));

    // With proxy keys, a key in that header is admitted as its team and never goes
    // upstream; an unknown one is refused in the Tally API's own shape.
    let digest = crate::testing::sha256_hex("tk-team");
    let keyed = Harness::start(
        &mock.url(),
        &format!("{CONFIG}[[auth.keys]]\nname = \"tally-team\"\nsha256 = {digest:?}\n"),
    )
    .await;
    let answer = keyed
        .post(
            "/v1/tally/generate",
            &[("x-tally-key", "tk-team")],
            body.as_bytes(),
        )
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    assert!(mock
        .requests()
        .last()
        .unwrap()
        .headers
        .get("x-tally-key")
        .is_none());
    let listed = conversations(&keyed).await;
    assert_eq!(listed[0].tenant().as_str(), "tally-team");
    let refused = keyed
        .post(
            "/v1/tally/generate",
            &[("x-tally-key", "tk-other")],
            body.as_bytes(),
        )
        .await;
    assert_eq!(refused.status, 401);
    assert!(
        refused.json()["fault"]["detail"].is_string(),
        "{}",
        refused.text()
    );
}
