//! A key's model allow-list holds on batches, on the in-process harness: every model
//! a batch's inline requests name is checked, and a batch over an uploaded file (whose
//! lines handoff does not read) is refused to a key with a model list.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use mock_upstream::{MockUpstream, Reply};
use serde_json::{json, Value};

use crate::testing::{sha256_hex, Harness};

const LISTED: &str = "hk-listed-0123456789";
const OPEN: &str = "hk-open-9876543210";

async fn post(proxy: &Harness, path: &str, key: &str, body: &Value) -> u16 {
    proxy.post_as(path, key, body).await.status.as_u16()
}

#[tokio::test]
async fn a_model_allow_list_holds_on_every_kind_of_batch() {
    let mock =
        MockUpstream::with(|_| Reply::json(json!({"id": "batch_1", "name": "batches/b1"}))).await;
    let keys = format!(
        "[[auth.keys]]\nname = \"listed\"\nsha256 = \"{}\"\nmodels = [\"allowed-model\"]\n\
         [[auth.keys]]\nname = \"open\"\nsha256 = \"{}\"\n",
        sha256_hex(LISTED),
        sha256_hex(OPEN)
    );
    let proxy = Harness::start(&mock.url(), &keys).await;
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

    for (path, body) in [
        ("/v1/messages/batches", anthropic("other-model")),
        (gemini_path, gemini("other-model")),
        ("/v1/batches", from_file.clone()),
        (gemini_path, gemini_file.clone()),
    ] {
        assert_eq!(
            post(&proxy, path, LISTED, &body).await,
            403,
            "{path} {body}"
        );
    }
    assert!(
        mock.requests().is_empty(),
        "a refused batch reached the upstream"
    );

    let allowed = [
        ("/v1/messages/batches", anthropic("allowed-model"), LISTED),
        (gemini_path, gemini("allowed-model"), LISTED),
        // A key without a model list may run a batch over a file.
        ("/v1/batches", from_file, OPEN),
        (gemini_path, gemini_file, OPEN),
    ];
    for (path, body, key) in &allowed {
        assert_eq!(post(&proxy, path, key, body).await, 200, "{path} {body}");
    }
    assert_eq!(mock.requests().len(), allowed.len());
}
