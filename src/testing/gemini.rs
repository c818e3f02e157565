//! Google's Gemini API on the in-process harness: a stream in its JSON-array form is
//! relayed and its reply logged as the model's content with its usage, bodies that are
//! not the API's shape get Google's own error shape and go nowhere, and through a
//! shared upstream key one team never reaches another's files or caches, under any
//! spelling Google's parser reads.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use mock_upstream::scripted::{ScriptedCoder, Thinking};
use mock_upstream::{MockUpstream, Reply};
use serde_json::{json, Value};

use super::{sha256_hex, Answer, Harness};
use crate::auth::Secrets;

const STREAM: &str = "/v1beta/models/gemini-mock:streamGenerateContent";
const GENERATE: &str = "/v1beta/models/gemini-mock:generateContent";

/// A user turn of about 600 tokens stating fact `n`.
fn turn(n: usize) -> Value {
    let words: Vec<String> = (0..280).map(|i| format!("w{i}")).collect();
    json!({"role": "user", "parts": [{"text": format!("FACT-{n:03} {}", words.join(" "))}]})
}

fn body(contents: &[Value]) -> Value {
    json!({"contents": contents, "systemInstruction": {"parts": [{"text": "You are terse."}]},
        "generationConfig": {"thinkingConfig": {"thinkingBudget": -1}}})
}

/// Posts `body` to `target` in conversation `id`, with the API key header.
async fn post(proxy: &Harness, target: &str, id: &str, body: &str) -> Answer {
    let headers = [("x-handoff-conversation-id", id), ("x-goog-api-key", "k")];
    proxy.post(target, &headers, body.as_bytes()).await
}

#[tokio::test]
async fn the_json_array_stream_is_logged_and_bad_bodies_get_google_s_errors() {
    let work = tempfile::tempdir().unwrap();
    let model = ScriptedCoder::new(1_000_000, 3, work.path().to_owned(), Thinking::Some);
    let answer = Arc::clone(&model);
    let mock = MockUpstream::with(move |r| answer.answer(r)).await;
    let config = "[models.\"gemini-mock\"]\ncontext_window = 100000\n";
    let proxy = Harness::start(&mock.url(), config).await;

    let got = post(&proxy, STREAM, "array", &body(&[turn(1)]).to_string()).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let chunks = got.json();
    assert!(chunks.as_array().is_some_and(|c| !c.is_empty()), "{chunks}");
    let log = proxy.log("array").await;
    let lines: Vec<Value> = (log.lines.iter())
        .map(|line| serde_json::to_value(line).unwrap())
        .collect();
    let reply = lines.iter().find(|l| l["source"] == "upstream").unwrap();
    assert_eq!(
        reply["message"],
        json!({"role": "model", "parts": [{"text": "Reading notes"}]}),
        "{reply}"
    );
    assert!(
        reply["usage"]["promptTokenCount"].as_u64().unwrap() > 100,
        "{reply}"
    );
    for (bad, why) in [
        ("{not json", "not JSON"),
        (r#"{"contents": "hello"}"#, "contents is not a list"),
        (r#"{"contents": [7]}"#, "a content is not an object"),
    ] {
        let refused = post(&proxy, GENERATE, "bad", bad).await;
        assert_eq!(refused.status, 400, "{why}: {}", refused.text());
        let error = &refused.json()["error"];
        assert_eq!(error["code"], 400, "{why}");
        assert_eq!(error["status"], "INVALID_ARGUMENT", "{why}");
        assert!(
            !error["message"].as_str().unwrap().is_empty(),
            "{why}: {error}"
        );
    }
    assert_eq!(mock.requests().len(), 1, "nothing malformed went upstream");
}

/// The scripted model behind an upstream that stores files and cached contents.
async fn storing_gemini(work: &std::path::Path) -> MockUpstream {
    let model = ScriptedCoder::new(1_000_000, 3, work.to_owned(), Thinking::Some);
    let serial = std::sync::atomic::AtomicUsize::new(0);
    MockUpstream::with(move |request| {
        let n = serial.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let path = request.target.split('?').next().unwrap_or("").to_owned();
        match (request.method.as_str(), path.as_str()) {
            ("POST", "/v1beta/cachedContents") => Reply::json(
                json!({"name": format!("cachedContents/cc{n}"), "model": "models/gemini-mock"}),
            ),
            ("POST", "/upload/v1beta/files") => Reply::json(json!({"file": {
                "name": format!("files/up{n}"), "mimeType": "text/plain",
                "uri": format!("https://generativelanguage.googleapis.com/v1beta/files/up{n}")}})),
            (_, p) if p.contains(':') => model.answer(request),
            _ => Reply::json(json!({"name": path.trim_start_matches("/v1beta/")})),
        }
    })
    .await
}

/// `method target` with `key` in Gemini's key header.
async fn call(
    proxy: &Harness,
    (method, target): (&str, &str),
    key: &str,
    content_type: &str,
    body: &[u8],
) -> Answer {
    let request = Request::builder()
        .method(method)
        .uri(format!("{}{target}", proxy.url()))
        .header("content-type", content_type)
        .header("x-goog-api-key", key)
        .body(Full::new(Bytes::copy_from_slice(body)))
        .unwrap();
    proxy.send(request).await
}

#[tokio::test]
async fn one_team_never_reaches_another_team_s_gemini_files_or_caches() {
    const TEAM_A: &str = "hk-gemini-team-a-0101";
    const TEAM_B: &str = "hk-gemini-team-b-0202";
    let work = tempfile::tempdir().unwrap();
    let mock = storing_gemini(work.path()).await;
    let config = format!(
        "[models.\"gemini-mock\"]\ncontext_window = 100000\n\
         [upstream]\napi_key_env = \"GEMINI_SHARED\"\n\
         [[auth.keys]]\nname = \"team-a\"\nsha256 = \"{}\"\n\
         [[auth.keys]]\nname = \"team-b\"\nsha256 = \"{}\"\nmodels = [\"gemini-mock\"]\n",
        sha256_hex(TEAM_A),
        sha256_hex(TEAM_B)
    );
    let secrets = Secrets::given(&[("GEMINI_SHARED", "AIza-shared-upstream")]);
    let proxy = Harness::start_with(&mock.url(), &config, secrets).await;
    let json_type = "application/json";
    // Team A uploads a file (raw bytes, as the SDKs' media upload sends them) and
    // caches a content.
    let upload = ("POST", "/upload/v1beta/files");
    let uploaded = call(&proxy, upload, TEAM_A, "text/plain", b"some notes").await;
    assert_eq!(uploaded.status, 200, "{}", uploaded.text());
    let file = uploaded.json()["file"]["name"].as_str().unwrap().to_owned();
    let uri = uploaded.json()["file"]["uri"].as_str().unwrap().to_owned();
    let cache_body = json!({"model": "models/gemini-mock", "contents": [turn(1)]}).to_string();
    let caching = ("POST", "/v1beta/cachedContents");
    let cached = call(&proxy, caching, TEAM_A, json_type, cache_body.as_bytes()).await;
    assert_eq!(cached.status, 200, "{}", cached.text());
    let cache = cached.json()["name"].as_str().unwrap().to_owned();
    let before = mock.requests().len();

    // Team B can neither read nor delete them, nor use them in a request, nor list.
    for (method, target) in [
        ("GET", format!("/v1beta/{file}")),
        ("DELETE", format!("/v1beta/{file}")),
        ("GET", format!("/v1beta/{cache}")),
        ("PATCH", format!("/v1beta/{cache}")),
        ("GET", "/v1beta/files/never-made".to_owned()),
    ] {
        let got = call(&proxy, (method, &target), TEAM_B, json_type, b"").await;
        assert_eq!(got.status, 404, "{method} {target}: {}", got.text());
        assert_eq!(got.json()["error"]["status"], "NOT_FOUND");
    }
    for listing in [
        "/v1beta/files",
        "/v1beta/cachedContents",
        "/v1beta/fileSearchStores",
    ] {
        let got = call(&proxy, ("GET", listing), TEAM_B, json_type, b"").await;
        assert_eq!(got.status, 403, "{listing}: {}", got.text());
    }
    let with_cache = json!({"cachedContent": cache, "contents": [turn(2)]}).to_string();
    let with_file = json!({"contents": [{"role": "user", "parts": [
        {"fileData": {"mimeType": "text/plain", "fileUri": uri}}, {"text": "summarise"}]}]})
    .to_string();
    // Google's parser reads the proto's snake_case names as the camelCase ones.
    let snake_cache = json!({"cached_content": cache, "contents": [turn(2)]}).to_string();
    let snake_file = json!({"contents": [{"role": "user", "parts": [
        {"file_data": {"mime_type": "text/plain", "file_uri": uri}}, {"text": "summarise"}]}]})
    .to_string();
    let stores = json!({"contents": [turn(2)], "tools": [{"file_search": {
        "file_search_store_names": ["fileSearchStores/never-made"]}}]})
    .to_string();
    for body in [&with_cache, &with_file, &snake_cache, &snake_file, &stores] {
        for target in [GENERATE, "/v1beta/models/gemini-mock:countTokens"] {
            let got = call(&proxy, ("POST", target), TEAM_B, json_type, body.as_bytes()).await;
            assert_eq!(got.status, 404, "{target} {body}: {}", got.text());
        }
    }
    // Team B's allow-list holds on a model named only in the path, whatever the method.
    for target in [
        "/v1beta/models/gemini-other:countTokens",
        "/v1beta/models/aqa:generateAnswer",
        "/v1beta/tunedModels/gemini-other-tuned:generateContent",
    ] {
        let other = call(&proxy, ("POST", target), TEAM_B, json_type, b"{}").await;
        assert_eq!(other.status, 403, "{target}: {}", other.text());
    }
    assert_eq!(mock.requests().len(), before, "team B reached the upstream");

    // Team A still reaches its own.
    for target in [format!("/v1beta/{file}"), format!("/v1beta/{cache}")] {
        let got = call(&proxy, ("GET", &target), TEAM_A, json_type, b"").await;
        assert_eq!(got.status, 200, "{target}: {}", got.text());
    }
    for body in [&with_cache, &with_file, &snake_cache, &snake_file] {
        let got = call(
            &proxy,
            ("POST", GENERATE),
            TEAM_A,
            json_type,
            body.as_bytes(),
        )
        .await;
        assert_eq!(got.status, 200, "{body}: {}", got.text());
    }
}
