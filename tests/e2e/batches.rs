//! A key's model allow-list holds on batches: every model a batch's inline requests
//! name is checked, and a batch over an uploaded file (whose lines handoff does not
//! read) is refused to a key with a model list.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::json;
use sha2::{Digest, Sha256};

use crate::support::client::{self, request};
use crate::support::{Proxy, ProxyOptions};
use mock_upstream::{MockUpstream, Reply};

const LISTED: &str = "hk-listed-0123456789";
const OPEN: &str = "hk-open-9876543210";

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

async fn post(proxy: &Proxy, path: &str, key: &str, body: &serde_json::Value) -> u16 {
    client::send(request(
        "POST",
        &format!("{}{path}", proxy.url()),
        &[
            ("content-type", "application/json"),
            ("authorization", &format!("Bearer {key}")),
            ("x-api-key", key),
            ("x-goog-api-key", key),
        ],
        body.to_string(),
    ))
    .await
    .status
    .as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_allow_list_holds_on_every_kind_of_batch() {
    let mock =
        MockUpstream::with(|_| Reply::json(json!({"id": "batch_1", "name": "batches/b1"}))).await;
    let extra = format!(
        "[upstream]\napi_key_env = \"BATCH_UPSTREAM_KEY\"\n\
         [[auth.keys]]\nname = \"listed\"\nsha256 = \"{}\"\nmodels = [\"allowed-model\"]\n\
         [[auth.keys]]\nname = \"open\"\nsha256 = \"{}\"\n",
        sha256_hex(LISTED),
        sha256_hex(OPEN)
    );
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: extra,
            env: vec![("BATCH_UPSTREAM_KEY".into(), "sk-upstream-batches".into())],
            ..Default::default()
        },
    );
    let anthropic = |model: &str| {
        json!({"requests": [
            {"custom_id": "a", "params": {"model": "allowed-model", "max_tokens": 5, "messages": []}},
            {"custom_id": "b", "params": {"model": model, "max_tokens": 5, "messages": []}}]})
    };
    let gemini = |model: &str| {
        json!({"batch": {"display_name": "b", "input_config": {"requests": {"requests": [
            {"request": {"model": format!("models/{model}"), "contents": []}, "metadata": {"key": "1"}}]}}}})
    };
    let from_file = json!({"input_file_id": "file-abc", "endpoint": "/v1/chat/completions", "completion_window": "24h"});
    let gemini_file = json!({"batch": {"input_config": {"file_name": "files/abc"}}});
    let gemini_path = "/v1beta/models/allowed-model:batchGenerateContent";

    let refused = [
        ("/v1/messages/batches", anthropic("other-model")),
        (gemini_path, gemini("other-model")),
        ("/v1/batches", from_file.clone()),
        (gemini_path, gemini_file.clone()),
    ];
    for (path, body) in &refused {
        assert_eq!(post(&proxy, path, LISTED, body).await, 403, "{path} {body}");
    }
    assert!(
        mock.requests().is_empty(),
        "a refused batch reached the upstream"
    );

    for (path, body) in [
        ("/v1/messages/batches", anthropic("allowed-model")),
        (gemini_path, gemini("allowed-model")),
    ] {
        assert_eq!(
            post(&proxy, path, LISTED, &body).await,
            200,
            "{path} {body}"
        );
    }
    // A key without a model list passes the allow-list with a file batch (what then
    // answers is ownership's business: the file was never uploaded through this key).
    for (path, body) in [("/v1/batches", from_file), (gemini_path, gemini_file)] {
        let status = post(&proxy, path, OPEN, &body).await;
        assert_ne!(status, 403, "{path} {body}");
    }
}
