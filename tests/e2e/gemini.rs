//! Google's Gemini API end to end, through the real binary against the scripted Gemini
//! model: the key the Gemini way (`x-goog-api-key`, `?key=`, proxy keys, the upstream's
//! own key, written nowhere on disk or in the logs), reactive compaction with a summary
//! call in Gemini's shape, and a hook's reroute, which moves the model in the
//! path. The JSON-array stream, Google's error shape and the teams' files and caches
//! are tested in-process (`src/testing/gemini.rs`); Gemini CLI itself runs in
//! `tests/agents.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use crate::support::client::{self, request, Whole};
use crate::support::{access_lines, message_lines, read_tree, Proxy, ProxyOptions};
use mock_upstream::scripted::{ScriptedCoder, Thinking};
use mock_upstream::MockUpstream;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

const MODEL: &str = "gemini-mock";
const STREAM: &str = "/v1beta/models/gemini-mock:streamGenerateContent";
const GENERATE: &str = "/v1beta/models/gemini-mock:generateContent";

/// The scripted model with a window of `window` tokens.
async fn gemini(window: u64) -> (Arc<ScriptedCoder>, MockUpstream, tempfile::TempDir) {
    let work = tempfile::tempdir().unwrap();
    let model = ScriptedCoder::new(window, 3, work.path().to_owned(), Thinking::Some);
    let answer = Arc::clone(&model);
    let mock = MockUpstream::with(move |r| answer.answer(r)).await;
    (model, mock, work)
}

fn options(window: u64, extra: &str, env: &[(&str, &str)]) -> ProxyOptions {
    ProxyOptions {
        extra_toml: format!(
            "[models.\"{MODEL}\"]\ncontext_window = {window}\n[models.\"gemini-cheap\"]\ncontext_window = {window}\n{extra}"
        ),
        env: env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        ..ProxyOptions::default()
    }
}

/// A user turn of about 600 tokens stating fact `n`.
fn turn(n: usize) -> Value {
    let words: Vec<String> = (0..280).map(|i| format!("w{i}")).collect();
    json!({"role": "user", "parts": [{"text": format!("FACT-{n:03} {}", words.join(" "))}]})
}

fn body(contents: &[Value]) -> Value {
    json!({"contents": contents, "systemInstruction": {"parts": [{"text": "You are terse."}]},
        "generationConfig": {"thinkingConfig": {"thinkingBudget": -1}}})
}

async fn post(proxy: &Proxy, target: &str, id: &str, key: Option<&str>, body: &str) -> Whole {
    let mut headers = vec![
        ("content-type", "application/json"),
        ("x-handoff-conversation-id", id),
    ];
    if let Some(key) = key {
        headers.push(("x-goog-api-key", key));
    }
    client::send(request(
        "POST",
        &format!("{}{target}", proxy.url()),
        &headers,
        body.to_owned(),
    ))
    .await
}

fn on_disk(proxy: &Proxy, secret: &str) -> Vec<String> {
    read_tree(proxy.dir())
        .into_iter()
        .filter(|(_, bytes)| String::from_utf8_lossy(bytes).contains(secret))
        .map(|(path, _)| path.display().to_string())
        .collect()
}

fn tenant_of(line: &str) -> String {
    line.split("tenant=\"")
        .nth(1)
        .unwrap_or("")
        .split('"')
        .next()
        .unwrap_or("")
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_in_the_query_goes_upstream_as_the_header_and_is_written_nowhere() {
    const SECRET: &str = "AIza-query-secret-5e1f";
    let (_model, mock, _work) = gemini(1_000_000).await;
    let proxy = Proxy::start_with(&mock.url(), options(100_000, "", &[]));
    let contents = [turn(1)];
    // As SSE, the key in the query (percent-encoded), then the same key in the header.
    let encoded = SECRET.replace('-', "%2D");
    let target = format!("{STREAM}?alt=sse&key={encoded}");
    let streamed = post(&proxy, &target, "q-key", None, &body(&contents).to_string()).await;
    assert_eq!(streamed.status, 200, "{}", streamed.text());
    assert!(streamed.text().starts_with("data: "), "{}", streamed.text());
    let same = post(
        &proxy,
        GENERATE,
        "h-key",
        Some(SECRET),
        &body(&contents).to_string(),
    )
    .await;
    assert_eq!(same.status, 200, "{}", same.text());
    // The parameter's name spelt with escapes is the same parameter to the API.
    let spelt = format!("{GENERATE}?%6B%65y={SECRET}");
    let same = post(&proxy, &spelt, "s-key", None, &body(&contents).to_string()).await;
    assert_eq!(same.status, 200, "{}", same.text());
    // Pass-through too: the models list and a token count.
    let listed = client::send(request(
        "GET",
        &format!("{}/v1beta/models?key={SECRET}&pageSize=5", proxy.url()),
        &[],
        String::new(),
    ))
    .await;
    // The scripted model has no models list: its own 404 came back through.
    assert_eq!(listed.status, 404, "{}", listed.text());
    let counted = post(
        &proxy,
        &format!("/v1beta/models/{MODEL}:countTokens?key={SECRET}"),
        "count",
        None,
        &json!({"contents": contents}).to_string(),
    )
    .await;
    assert_eq!(counted.status, 200, "{}", counted.text());
    assert!(counted.json()["totalTokens"].as_u64().unwrap() > 100);

    let seen = mock.requests();
    assert_eq!(seen.len(), 5, "{seen:?}");
    for request in &seen {
        assert!(
            !request.target.contains('?')
                || request.target.contains("alt=sse")
                || request.target.contains("pageSize"),
            "{}",
            request.target
        );
        assert!(!request.target.contains("key="), "{}", request.target);
        assert_eq!(
            request.headers["x-goog-api-key"], SECRET,
            "{}",
            request.target
        );
    }
    assert_eq!(seen[0].target, format!("{STREAM}?alt=sse"));
    assert_eq!(seen[2].target, GENERATE);
    assert_eq!(seen[3].target, "/v1beta/models?pageSize=5");
    // One key is one tenant, in the query or in the header.
    let access = access_lines(&proxy);
    let tenants: Vec<String> = access.iter().map(|l| tenant_of(l)).collect();
    assert_eq!(tenants.len(), 5, "{access:?}");
    assert!(
        !tenants[0].is_empty() && tenants.iter().all(|t| *t == tenants[0]),
        "{access:?}"
    );
    assert!(access.iter().all(|l| !l.contains(SECRET)), "{access:?}");
    // The streamed reply was tracked and logged.
    let lines = message_lines(&proxy, "q-key");
    assert!(lines.iter().any(|l| l["source"] == "upstream"), "{lines:?}");
    assert!(
        on_disk(&proxy, SECRET).is_empty(),
        "{:?}",
        on_disk(&proxy, SECRET)
    );
    assert!(!proxy.logs().contains(SECRET));
    // A key that cannot be a header is refused in Google's shape, not forwarded.
    let bad = post(&proxy, &format!("{GENERATE}?key=%0Abad"), "bad", None, "{}").await;
    assert_eq!(bad.status, 401, "{}", bad.text());
    assert_eq!(bad.json()["error"]["status"], "UNAUTHENTICATED");
    assert_eq!(mock.requests().len(), 5);
}

fn sha256_hex(text: &str) -> String {
    Sha256::digest(text.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_keys_and_the_upstream_s_own_key_work_the_gemini_way() {
    const TEAM: &str = "hk-team-gemini-77aa";
    const UPSTREAM: &str = "AIza-upstream-only-3c3c";
    let (_model, mock, _work) = gemini(1_000_000).await;
    let extra = format!(
        "[[auth.keys]]\nname = \"team-g\"\nsha256 = \"{}\"\n\
         [dialects.gemini]\nbase_url = \"{}\"\napi_key_env = \"GEMINI_UPSTREAM_FOR_TEST\"\n",
        sha256_hex(TEAM),
        mock.url()
    );
    let proxy = Proxy::start_with(
        &mock.url(),
        options(100_000, &extra, &[("GEMINI_UPSTREAM_FOR_TEST", UPSTREAM)]),
    );
    let contents = [turn(1)];
    let by_query = post(
        &proxy,
        &format!("{GENERATE}?key={TEAM}"),
        "team",
        None,
        &body(&contents).to_string(),
    )
    .await;
    assert_eq!(by_query.status, 200, "{}", by_query.text());
    let by_header = post(
        &proxy,
        GENERATE,
        "team",
        Some(TEAM),
        &body(&contents).to_string(),
    )
    .await;
    assert_eq!(by_header.status, 200, "{}", by_header.text());
    let wrong = post(
        &proxy,
        &format!("{GENERATE}?key=not-a-team-key"),
        "x",
        None,
        "{}",
    )
    .await;
    assert_eq!(wrong.status, 401, "{}", wrong.text());
    assert_eq!(wrong.json()["error"]["code"], 401);
    assert_eq!(wrong.json()["error"]["status"], "UNAUTHENTICATED");
    let none = post(&proxy, GENERATE, "x", None, "{}").await;
    assert_eq!(none.status, 401, "{}", none.text());
    let seen = mock.requests();
    assert_eq!(seen.len(), 2);
    for request in &seen {
        assert_eq!(request.headers["x-goog-api-key"], UPSTREAM);
        assert!(!request.target.contains("key="), "{}", request.target);
    }
    let access = access_lines(&proxy);
    assert!(
        access
            .iter()
            .filter(|l| l.contains("tenant=\"team-g\""))
            .count()
            >= 2,
        "{access:?}"
    );
    for secret in [TEAM, UPSTREAM] {
        assert!(on_disk(&proxy, secret).is_empty(), "{secret}");
        assert!(!proxy.logs().contains(secret), "{secret}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_overflow_is_compacted_and_retried_with_a_summary_in_gemini_s_shape() {
    const KEY: &str = "AIza-overflow-key-9b9b";
    // The model holds ~4,000 tokens; handoff believes in 100,000, so only the API's
    // own error can tell it.
    let (model, mock, _work) = gemini(4_000).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        options(100_000, "[compaction]\nstrategy = \"summarize\"\n", &[]),
    );
    // The bulk is in the model's answers: what the user asked is kept whole.
    let mut contents = Vec::new();
    for n in 0..10 {
        contents.push(json!({"role": "user", "parts": [{"text": format!("Tell me fact {n}.")}]}));
        let mut answer = turn(n);
        answer["role"] = json!("model");
        contents.push(answer);
    }
    contents.push(json!({"role": "user", "parts": [{"text": "Which facts did I state?"}]}));
    let target = format!("{STREAM}?alt=sse");
    let got = post(
        &proxy,
        &target,
        "overflow",
        Some(KEY),
        &body(&contents).to_string(),
    )
    .await;
    assert_eq!(got.status, 200, "{}\n{}", got.text(), proxy.logs());
    assert!(
        !model.seen.lock().unwrap().over_window.is_empty(),
        "the model refused first"
    );
    let seen = mock.requests();
    let summaries: Vec<_> = seen
        .iter()
        .filter(|r| mock_upstream::strict::is_summary(&r.json()))
        .collect();
    assert!(!summaries.is_empty(), "{seen:?}");
    for summary in &summaries {
        // Its own path, not streamed, the client's key, Gemini's body.
        assert_eq!(summary.target, GENERATE);
        assert_eq!(summary.headers["x-goog-api-key"], KEY);
        let body = summary.json();
        assert!(
            body["contents"].is_array() && body.get("messages").is_none(),
            "{body}"
        );
    }
    let retried = seen.last().unwrap();
    assert_eq!(retried.target, target);
    let sent = retried.json();
    let first = sent["contents"][0]["parts"][0]["text"].as_str().unwrap();
    assert!(first.contains("compacted by handoff"), "{sent}");
    assert_eq!(sent["contents"][1]["role"], "model", "{sent}");
    assert_eq!(sent["systemInstruction"], body(&[])["systemInstruction"]);
    let records = crate::support::scenario::records(&proxy, "overflow");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["handoff"]["role"], "model");
    assert_eq!(
        records[0]["reason"], "context_length_exceeded",
        "{}",
        records[0]
    );
    // The replay is what the client sent: every original, then the reply.
    let replay = proxy.replay("overflow", None);
    assert_eq!(replay.len(), contents.len() + 1);
    assert_eq!(
        Value::from(replay[..contents.len()].to_vec()),
        Value::from(contents.clone())
    );
    proxy.assert_verified(&["overflow"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hook_s_reroute_moves_the_model_in_the_path() {
    let (_main_model, main, _w1) = gemini(1_000_000).await;
    let (_cheap_model, cheap, _w2) = gemini(1_000_000).await;
    let extra = format!(
        "[middleware]\nchain = [\"router\"]\n[middleware.hooks.router]\nkind = \"tag\"\n\
         [[middleware.hooks.router.rules]]\ncontent = \"(?i)translate\"\ntags = {{ task = \"translation\" }}\nreroute = \"gemini-cheap\"\n\
         [[routes]]\nmatch = \"gemini-cheap\"\nupstream = \"{}\"\n",
        cheap.url()
    );
    let proxy = Proxy::start_with(&main.url(), options(100_000, &extra, &[]));
    let ask =
        [json!({"role": "user", "parts": [{"text": "Translate 'good morning' into French"}]})];
    let target = format!("{STREAM}?alt=sse");
    let got = post(
        &proxy,
        &target,
        "reroute",
        Some("k"),
        &body(&ask).to_string(),
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(main.requests().is_empty());
    let moved = cheap.requests();
    assert_eq!(moved.len(), 1);
    assert_eq!(
        moved[0].target,
        "/v1beta/models/gemini-cheap:streamGenerateContent?alt=sse"
    );
    assert_eq!(moved[0].json(), body(&ask), "the body is the client's");
    let log =
        std::fs::read_to_string(proxy.conversation_dir("reroute").join("messages.jsonl")).unwrap();
    let request: Value = log
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|l| l["kind"] == "request")
        .unwrap();
    assert_eq!(request["model"], "gemini-cheap", "{request}");
    assert_eq!(request["hooks"]["model_from"], MODEL, "{request}");
}
