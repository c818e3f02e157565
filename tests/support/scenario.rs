//! A compaction scenario kit: the strict provider, configs with small windows, and a
//! driver that plays user turns until a compaction is recorded.

use std::path::PathBuf;
use std::sync::Arc;

use mock_upstream::strict::Strict;
use mock_upstream::{MockUpstream, Recorded};
use serde_json::{json, Value};

use super::client::{self, request};
use super::{Proxy, ProxyOptions};

/// The chat-completions path.
pub const CHAT: &str = "/v1/chat/completions";

/// Summaries by a 16k model (so a 4k conversation's history fits), timing out after 1 s.
/// Summaries on the 16k model, each call allowed 1 s; a request waits for its
/// compaction's attempts to end (no `compaction.max_wait` stand-in), so the record it
/// needed is committed when it is answered.
pub const SUMMARY_16K_1S: &str =
    "[compaction]\nsummary_model = \"strict-16k\"\nsummary_timeout = \"1s\"\nmax_wait = \"60s\"\n";

pub fn python() -> PathBuf {
    if let Some(path) = std::env::var_os("PYTHON_FOR_TESTS") {
        return path.into();
    }
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/test.sh",
        venv.display()
    );
    venv
}

/// Runs `tests/clients/SCRIPT ARGS` against `proxy` with the venv's python (or node,
/// for a `.mjs` script); the script must succeed and print one JSON document, which is
/// returned.
pub async fn run_client(proxy: &Proxy, script: &str, args: &[&str]) -> Value {
    run_client_at(proxy.url(), script, args).await
}

/// [`run_client`] against `url`: handoff, or the upstream itself for a control run.
pub async fn run_client_at(url: String, script: &str, args: &[&str]) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/clients")
        .join(script);
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    // A Node client (`.mjs`) takes its SDKs from the agents' pinned install.
    let node = script.extension().is_some_and(|e| e == "mjs");
    let output = tokio::task::spawn_blocking(move || {
        let mut command = if node {
            let mut c = std::process::Command::new("node");
            c.env(
                "HANDOFF_NODE_MODULES",
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/agents/node_modules"),
            );
            c
        } else {
            std::process::Command::new(python())
        };
        command
            .arg(&script)
            .args(&args)
            .env("HANDOFF_URL", url)
            .output()
            .expect("run the client")
    })
    .await
    .expect("client task");
    assert!(
        output.status.success(),
        "the client failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("the client prints JSON")
}

pub async fn strict_mock(window: u64) -> (Arc<Strict>, MockUpstream) {
    let strict = Strict::new(window);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |req| responder.answer(req)).await;
    (strict, mock)
}

pub fn options(window: u64, extra: &str) -> ProxyOptions {
    ProxyOptions {
        extra_toml: format!("[models.\"strict\"]\ncontext_window = {window}\n[models.\"strict-16k\"]\ncontext_window = 16384\n{extra}\n"),
        ..ProxyOptions::default()
    }
}

pub fn records(proxy: &Proxy, id: &str) -> Vec<Value> {
    let path = proxy.conversation_dir(id).join("compactions.jsonl");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn agent_requests(mock: &MockUpstream) -> Vec<Recorded> {
    mock.requests()
        .into_iter()
        .filter(|r| !mock_upstream::strict::is_summary(&r.json()))
        .collect()
}

/// A user turn of about `tokens` tokens that states fact `n`.
pub fn big_user(n: usize, tokens: usize) -> Value {
    let filler: Vec<String> = (0..tokens / 2).map(|i| format!("w{i}")).collect();
    json!({"role": "user", "content": format!("FACT-{n:03} {}", filler.join(" "))})
}

pub async fn chat(proxy: &Proxy, id: &str, messages: &[Value]) -> client::Whole {
    chat_as(proxy, id, "strict", messages).await
}

/// A chat-completions POST of `body` with `headers` (and a JSON content type).
pub async fn post_chat(proxy: &Proxy, headers: &[(&str, &str)], body: &Value) -> client::Whole {
    let mut all = vec![("content-type", "application/json")];
    all.extend_from_slice(headers);
    client::send(request(
        "POST",
        &format!("{}{CHAT}", proxy.url()),
        &all,
        body.to_string(),
    ))
    .await
}

/// One non-streamed request of `model` in conversation `id`.
pub async fn chat_as(proxy: &Proxy, id: &str, model: &str, messages: &[Value]) -> client::Whole {
    client::send(request(
        "POST",
        &format!("{}{CHAT}", proxy.url()),
        &[
            ("content-type", "application/json"),
            ("x-handoff-conversation-id", id),
            ("authorization", "Bearer sk-x"),
        ],
        json!({"model": model, "messages": messages}).to_string(),
    ))
    .await
}

/// Plays user turns of `tokens` tokens until a compaction is recorded; returns the history.
pub async fn drive_until_compaction(
    proxy: &Proxy,
    id: &str,
    tokens: usize,
    limit: usize,
) -> Vec<Value> {
    let mut messages = vec![json!({"role": "system", "content": "be brief"})];
    for n in 0..limit {
        messages.push(big_user(n, tokens));
        let got = chat(proxy, id, &messages).await;
        assert_eq!(got.status, 200, "turn {n}: {}", got.text());
        let reply = got.json()["choices"][0]["message"].clone();
        if reply.get("tool_calls").is_some() {
            let call = reply["tool_calls"][0]["id"].as_str().unwrap().to_owned();
            messages.push(reply);
            messages.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}));
            let got = chat(proxy, id, &messages).await;
            assert_eq!(got.status, 200, "turn {n}: {}", got.text());
            messages.push(got.json()["choices"][0]["message"].clone());
        } else {
            messages.push(reply);
        }
        if !records(proxy, id).is_empty() {
            return messages;
        }
    }
    panic!("no compaction after {limit} turns");
}

/// `strict` served with its agent turns answered after `turn` and its summary calls
/// after `summary` (zero: at once), as a model and a summariser take their time.
pub async fn paced(
    strict: &Arc<Strict>,
    turn: std::time::Duration,
    summary: std::time::Duration,
) -> MockUpstream {
    let answering = Arc::clone(strict);
    MockUpstream::with(move |request| {
        let reply = answering.answer(request);
        let summarising = mock_upstream::strict::is_summary(&request.json());
        let wait = if summarising { summary } else { turn };
        if wait.is_zero() {
            reply
        } else {
            reply.delayed(wait)
        }
    })
    .await
}

/// The lines of conversation `id`'s log, as written.
pub fn log_lines(proxy: &Proxy, id: &str) -> Vec<Value> {
    std::fs::read_to_string(proxy.conversation_dir(id).join("messages.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// The lines of `kind` among `lines`.
pub fn of_kind(lines: &[Value], kind: &str) -> Vec<Value> {
    lines
        .iter()
        .filter(|l| l["kind"] == kind)
        .cloned()
        .collect()
}

/// Serves `strict`'s answers (a strict provider of another API) on a fresh mock.
pub async fn serve_strict<T: Send + Sync + 'static>(
    strict: &Arc<T>,
    answer: fn(&T, &Recorded) -> mock_upstream::Reply,
) -> MockUpstream {
    let responder = Arc::clone(strict);
    MockUpstream::with(move |req| answer(&responder, req)).await
}

/// A proxy config for `model` with a `window`-token context counted as bytes/4, kept
/// in `data` so a restart finds it.
pub fn estimate_model(data: &std::path::Path, model: &str, window: u64) -> ProxyOptions {
    ProxyOptions {
        extra_toml: format!(
            "[models.\"{model}\"]\ncontext_window = {window}\ntokenizer = \"estimate\"\n"
        ),
        data_dir: Some(data.to_owned()),
        ..ProxyOptions::default()
    }
}

/// Runs an agent client `script STATE FIRST LAST` (state in a JSON file) against `proxy`.
pub async fn run_agent(
    proxy: &Proxy,
    script: &str,
    state: &std::path::Path,
    first: u32,
    last: u32,
) -> Value {
    let state = state.to_str().unwrap_or_default().to_owned();
    run_client(
        proxy,
        script,
        &[&state, &first.to_string(), &last.to_string()],
    )
    .await
}

/// Six user turns of about 1,500 tokens, each stating a fact and answered by
/// `reply`, then a question: a history that overflows a small window.
pub fn fact_history(reply: Value) -> Vec<Value> {
    let filler: String = (0..600).map(|i| format!("w{i} ")).collect();
    let mut messages = Vec::new();
    for n in 0..6 {
        messages.push(json!({"role": "user", "content": format!("FACT-{n:03} {filler}")}));
        messages.push(reply.clone());
    }
    messages.push(json!({"role": "user", "content": "what were the facts?"}));
    messages
}

/// Asserts that `needle`, a compacted turn's text, is only in the handoff's ledger:
/// exactly one of `messages` quotes it, and that is the handoff: the assistant
/// message, or (a recent part that opens with the model's turn) the one user message
/// the pair is joined into.
pub fn assert_only_the_ledger_quotes(messages: &Value, needle: &str) {
    let quoting: Vec<&Value> = messages
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m.to_string().contains(needle))
        .collect();
    assert_eq!(quoting.len(), 1, "{quoting:?}");
    let text = quoting[0].to_string();
    let handoff = quoting[0]["role"] == "assistant"
        || (quoting[0]["role"] == "user" && text.contains("Continue from the compacted state"));
    assert!(
        handoff && text.contains("## Ledger (exact, kept by handoff)"),
        "{}",
        quoting[0]
    );
}

/// `options` with compactions run inline only (`compaction.prepare_at = 0`): for tests
/// of the inline and reactive paths, which a background preparation would pre-empt.
pub fn inline_compaction(mut options: ProxyOptions) -> ProxyOptions {
    if options.extra_toml.contains("[compaction]") {
        options.extra_toml =
            options
                .extra_toml
                .replacen("[compaction]", "[compaction]\nprepare_at = 0", 1);
    } else {
        options
            .extra_toml
            .push_str("\n[compaction]\nprepare_at = 0\n");
    }
    options
}

/// One user turn `user` of an agent in conversation `id`: sent, and each tool call of
/// the reply answered with `ok` and sent again, until a reply calls none. Returns each
/// request's latency.
pub async fn agent_turn(
    proxy: &Proxy,
    id: &str,
    messages: &mut Vec<Value>,
    user: Value,
) -> Vec<std::time::Duration> {
    messages.push(user);
    let mut latencies = Vec::new();
    loop {
        let started = std::time::Instant::now();
        let got = chat(proxy, id, messages).await;
        latencies.push(started.elapsed());
        assert_eq!(got.status, 200, "{}", got.text());
        let reply = got.json()["choices"][0]["message"].clone();
        let call = reply["tool_calls"][0]["id"].as_str().map(str::to_owned);
        messages.push(reply);
        match call {
            Some(call) => {
                messages.push(json!({"role": "tool", "tool_call_id": call, "content": "ok"}))
            }
            None => return latencies,
        }
    }
}

/// An upstream that answers each chat request with its last message's text, quoted:
/// the replies carry the users' markers too.
pub async fn echo_mock() -> MockUpstream {
    MockUpstream::with(|req| {
        let body = req.json();
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .and_then(|m| m["content"].as_str())
            .unwrap_or_default()
            .to_owned();
        mock_upstream::Reply::chat_text(&format!("you said: {last}"))
    })
    .await
}

/// Sends the user turn `text` in conversation `id` on a task of its own, and returns
/// once `mock` has it: the request's lines are logged by then, its reply not yet.
pub async fn turn_in_flight(
    proxy: &Proxy,
    mock: &MockUpstream,
    id: &str,
    text: &str,
) -> tokio::task::JoinHandle<client::Whole> {
    let url = format!("{}/v1/chat/completions", proxy.url());
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": text}]});
    let id = id.to_owned();
    let sent = tokio::spawn(async move {
        let headers = [
            ("content-type", "application/json"),
            ("x-handoff-conversation-id", id.as_str()),
        ];
        client::send(request("POST", &url, &headers, body.to_string())).await
    });
    for _ in 0..100 {
        if !mock.requests().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    sent
}
