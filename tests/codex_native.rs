//! Codex CLI, unmodified, configured the way most people point it at a proxy (the
//! built-in OpenAI provider with `openai_base_url`), compacting with the provider's
//! own compaction through handoff. When its context fills up it asks the provider to
//! compact (`compaction_trigger`), gets one sealed `compaction` item, and goes on from
//! its instructions, its prompt, that item and the new items. The scripted model
//! implements that as OpenAI documents it: it refuses an item it did not mint and
//! drops what precedes the latest one.
//!
//! Through handoff the session is one conversation, on one branch, never summarised
//! by handoff, its record replaying what Codex sent byte for byte.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mock_upstream::scripted::{self, ScriptedCoder, Thinking};
use mock_upstream::MockUpstream;
use support::scenario::records;
use support::{Proxy, ProxyOptions};

const FILES: usize = 12;
const WINDOW: u64 = 40_000;
const MODEL: &str = "scripted-codex";
const KEY: &str = "sk-codex-native-5a4b3c2d1e";

fn codex() -> PathBuf {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/agents/node_modules/.bin/codex");
    assert!(
        path.exists(),
        "{} is missing: run scripts/test.sh",
        path.display()
    );
    path
}

/// Runs Codex on the task in `work` with the built-in provider at `base` (handoff,
/// or the hop in front of it), the model's window and Codex's own compaction limit
/// `auto_compact`: only Codex's documented settings, nonessential traffic off. Its
/// output, once it succeeded and said it was done.
async fn run_codex(
    work: &std::path::Path,
    base: &str,
    (window, auto_compact): (u64, u64),
) -> std::process::Output {
    let home = work.join(".home");
    let codex_home = home.join(".codex");
    std::fs::create_dir_all(&codex_home).unwrap();
    std::fs::write(
        codex_home.join("config.toml"),
        format!(
            "model = \"{MODEL}\"\nopenai_base_url = \"{base}/v1\"\n\
             check_for_update_on_startup = false\n\
             model_context_window = {window}\nmodel_auto_compact_token_limit = {auto_compact}\n\
             [analytics]\nenabled = false\n[feedback]\nenabled = false\n"
        ),
    )
    .unwrap();
    let child = Command::new(codex())
        .args([
            "exec",
            "--skip-git-repo-check",
            "--ephemeral",
            &scripted::task_prompt(FILES),
        ])
        .current_dir(work)
        .env("HOME", &home)
        .env("CODEX_HOME", &codex_home)
        .env("CODEX_API_KEY", KEY)
        .env_remove("OPENAI_API_KEY")
        .env_remove("OPENAI_BASE_URL")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start codex");
    tokio::task::spawn_blocking(move || support::wait_bounded(child, Duration::from_secs(240)))
        .await
        .unwrap()
}

/// What a failing assertion shows: Codex's exit and output, and handoff's logs.
fn context_of(output: &std::process::Output, proxy: &Proxy) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}\n--- handoff ---\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
        proxy.logs()
    )
}

/// One Codex session through handoff against the scripted model, with or without
/// the API's own compaction: what each side saw, and Codex's output with handoff's
/// logs for a failing assertion to show.
struct Session {
    model: Arc<ScriptedCoder>,
    mock: MockUpstream,
    proxy: Proxy,
    hop: support::hop::Hop,
    context: String,
}

async fn session(native: bool) -> Session {
    let work = tempfile::tempdir().unwrap();
    scripted::write_files(work.path(), FILES).unwrap();
    let model = ScriptedCoder::new(WINDOW, FILES, work.path().to_owned(), Thinking::Some);
    model.set_native(native);
    let answer = Arc::clone(&model);
    let mock = MockUpstream::with(move |request| answer.answer(request)).await;
    // handoff knows the same window: it would compact this session if it did not
    // leave the provider's compaction to the provider.
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: format!("[models.\"{MODEL}\"]\ncontext_window = {WINDOW}\n"),
            ..ProxyOptions::default()
        },
    );
    let hop = support::hop::Hop::start(&proxy.url()).await;
    // Codex's own limit at 16k: it asks to compact long before the window.
    let output = run_codex(work.path(), &hop.url(), (WINDOW, 16_000)).await;
    let context = context_of(&output, &proxy);
    assert!(output.status.success(), "{context}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains(scripted::FINAL),
        "{context}"
    );
    drop(work);
    Session {
        model,
        mock,
        proxy,
        hop,
        context,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_compacting_with_the_provider_stays_one_conversation_through_handoff() {
    let Session {
        model,
        mock,
        proxy,
        hop,
        context,
    } = session(true).await;
    // The provider compacted; handoff did not, and never summarised its item.
    let provider_compactions = model.compactor.compactions.load(Ordering::SeqCst);
    {
        let seen = model.seen.lock().unwrap();
        assert!(
            seen.over_window.is_empty(),
            "{:?}\n{context}",
            seen.over_window
        );
        assert!(seen.refused.is_empty(), "{:?}\n{context}", seen.refused);
        assert!(seen.summaries.is_empty(), "handoff summarised\n{context}");
    }
    assert!(
        provider_compactions >= 1,
        "Codex never compacted\n{context}"
    );
    // Each trigger reached the provider last in its request, as Codex put it.
    let triggers = (mock.requests().iter())
        .filter(|r| {
            r.json()["input"]
                .as_array()
                .and_then(|i| i.last())
                .is_some_and(|i| i["type"] == "compaction_trigger")
        })
        .count();
    assert_eq!(triggers, provider_compactions, "{context}");

    let listed = proxy.conversations();
    assert_eq!(listed.len(), 1, "one conversation: {listed:?}");
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    assert!(
        listed[0]["branches"].as_u64().unwrap() <= 2,
        "{}",
        listed[0]
    );
    assert!(records(&proxy, &id).is_empty(), "handoff compacted too");
    support::hop::assert_replay_exact(&proxy, &id, &hop.sent());
    proxy.assert_verified(&[&id]);
    let shown = proxy.audit(&["show", &id]);
    let shown = String::from_utf8_lossy(&shown.stdout);
    assert!(
        shown.matches("PROVIDER COMPACTION").count() >= 2 * provider_compactions,
        "each trigger and each item is marked: {shown}"
    );
    println!(
        "NATIVE-ROW | Codex CLI (compaction_trigger) | {} | {provider_compactions} | 0 | {} | exact |",
        hop.sent().len(),
        listed[0]["branches"]
    );
    // The key never reaches disk, nor the logs.
    proxy.assert_secret_nowhere(KEY);
}

/// The same Codex at a self-hosted Responses server without the API's own
/// compaction: the server refuses Codex's first trigger, handoff serves it from then
/// on with its strategy chain, and Codex finishes its task on one conversation; the
/// handle never reaches the model.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_at_a_server_without_compaction_finishes_through_handoff() {
    let Session {
        model,
        mock,
        proxy,
        hop,
        context,
    } = session(false).await;
    let seen = model.seen.lock().unwrap();
    assert!(
        seen.over_window.is_empty(),
        "{:?}\n{context}",
        seen.over_window
    );
    // Only the first trigger reached the server, and was refused: auto learns.
    assert_eq!(seen.refused.len(), 1, "{:?}\n{context}", seen.refused);
    assert!(seen.refused[0].contains("compaction_trigger"), "{context}");
    let summaries = seen.summaries.len();
    assert!(summaries >= 1, "handoff served no compaction\n{context}");
    drop(seen);
    assert_eq!(model.compactor.compactions.load(Ordering::SeqCst), 0);
    let sent = mock.requests();
    let triggers = (hop.sent().iter())
        .filter(|sent| String::from_utf8_lossy(&sent.body).contains("compaction_trigger"))
        .count();
    assert!(triggers >= 1, "Codex never compacted\n{context}");
    assert!(
        sent.iter()
            .all(|r| !String::from_utf8_lossy(&r.body).contains("handoff-compaction.v1.")),
        "a handle reached the model\n{context}"
    );
    let listed = proxy.conversations();
    assert_eq!(listed.len(), 1, "one conversation: {listed:?}");
    let id = listed[0]["id"].as_str().unwrap().to_owned();
    support::hop::assert_replay_exact(&proxy, &id, &hop.sent());
    proxy.assert_verified(&[&id]);
    println!(
        "SERVED-ROW | Codex CLI 0.169.0 (`compaction_trigger`) | {} | {triggers} | {summaries} | 1 | {} | task done, replay exact |",
        hop.sent().len(),
        listed[0]["branches"]
    );
    proxy.assert_secret_nowhere(KEY);
}

/// Codex with the built-in OpenAI provider opens a WebSocket first. Through handoff it
/// keeps it (no fall back to HTTPS): each create is tracked, the chain it holds on the
/// socket (`store: false`, only the new items each turn) is sent upstream from
/// handoff's record over HTTP, and handoff compacts it past the window, where Codex
/// itself never compacts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_over_a_websocket_stays_on_it_and_is_compacted_through_handoff() {
    // A model that serves the mode (handoff opens a socket of its own to it), then one
    // that refuses the upgrade (handoff bridges each create to POST).
    codex_over_a_socket(true).await;
    codex_over_a_socket(false).await;
}

async fn codex_over_a_socket(upstream_sockets: bool) {
    let work = tempfile::tempdir().unwrap();
    scripted::write_files(work.path(), FILES).unwrap();
    let model = ScriptedCoder::new(WINDOW, FILES, work.path().to_owned(), Thinking::Some);
    let answer = Arc::clone(&model);
    let mock = MockUpstream::with(move |request| answer.answer(request)).await;
    mock.serve_sockets(upstream_sockets);
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: format!("[models.\"{MODEL}\"]\ncontext_window = {WINDOW}\n"),
            ..ProxyOptions::default()
        },
    );
    // Codex never compacts by itself here: only handoff can save the session.
    let output = run_codex(work.path(), &proxy.url(), (1_000_000, 900_000)).await;
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let context = context_of(&output, &proxy);
    assert!(output.status.success(), "{context}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains(scripted::FINAL),
        "{context}"
    );
    assert!(
        !stderr.contains("Falling back"),
        "Codex left the socket\n{context}"
    );
    assert!(proxy.logs().contains("WebSocket opened"), "{context}");
    {
        let seen = model.seen.lock().unwrap();
        assert!(
            seen.over_window.is_empty(),
            "{:?}\n{context}",
            seen.over_window
        );
        assert!(seen.refused.is_empty(), "{:?}\n{context}", seen.refused);
    }
    let agent: Vec<_> = (mock.requests().into_iter())
        .filter(|r| r.method == http::Method::POST && !mock_upstream::strict::is_summary(&r.json()))
        .collect();
    let on_socket = agent
        .iter()
        .filter(|r| r.headers.contains_key("x-mock-socket"))
        .count();
    if upstream_sockets {
        // Every create went up handoff's own socket, most as Codex sent them.
        assert_eq!(on_socket, agent.len(), "{context}");
        let continued = (agent.iter())
            .filter(|r| r.headers.contains_key("x-mock-continued"))
            .count();
        assert!(continued >= 1, "{context}");
    } else {
        // Bridged: every create went upstream standing alone, from the record.
        assert_eq!(on_socket, 0, "{context}");
        assert!(
            agent
                .iter()
                .all(|r| r.json().get("previous_response_id").is_none()),
            "{context}"
        );
    }
    let listed = proxy.conversations();
    let main = (listed.iter())
        .max_by_key(|c| c["requests"].as_u64().unwrap_or(0))
        .unwrap();
    let id = main["id"].as_str().unwrap().to_owned();
    let compactions = records(&proxy, &id).len();
    assert!(compactions >= 1, "handoff compacted\n{context}");
    proxy.assert_verified(&[&id]);
    let upstream = if upstream_sockets {
        "a socket of handoff's own"
    } else {
        "bridged to POST"
    };
    println!(
        "SOCKET-ROW | Codex CLI 0.169.0 (WebSocket, store false), upstream: {upstream} | {} | {compactions} | {} | {} |",
        agent.len(),
        listed.len(),
        main["branches"]
    );
    proxy.assert_secret_nowhere(KEY);
}
