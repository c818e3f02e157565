//! Real coding agents, unmodified, through the real binary: Claude Code, Codex CLI,
//! opencode and Gemini CLI (installed from npm at pinned versions by scripts/test.sh
//! into tests/agents) each run a tool-using task of `FILES` file reads against a scripted
//! model that speaks its wire format as strictly as the real provider. Each agent is
//! configured only through its own documented settings: the base URL, a provider
//! entry, its own auto-compaction off and nonessential traffic off.
//!
//! Without handoff the task dies of the window; through handoff, with `extract` and
//! with `summarize`, the agent finishes, with at least two compactions, no request
//! refused by the model or by handoff, one conversation, one branch, a replay that
//! ends with what the agent last sent, and the key nowhere on disk.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mock_upstream::scripted::{self, ScriptedCoder, Thinking};
use mock_upstream::MockUpstream;
use serde_json::Value;
use support::scenario::records;
use support::{Proxy, ProxyOptions};

const FILES: usize = 12;
const KEY: &str = "sk-agent-secret-0f9e8d7c6b5a";

/// One agent, and the model window its task overflows.
#[derive(Debug, Clone, Copy)]
enum Agent {
    ClaudeCode,
    Codex,
    OpenCode,
    GeminiCli,
}

impl Agent {
    fn model(self) -> &'static str {
        match self {
            Agent::ClaudeCode => "scripted-claude",
            Agent::Codex => "scripted-codex",
            Agent::OpenCode => "scripted-coder",
            Agent::GeminiCli => "gemini-scripted",
        }
    }

    /// Fits the agent's system prompt and tools and a few files, not all of them.
    fn window(self) -> u64 {
        match self {
            Agent::ClaudeCode => 48_000,
            Agent::Codex => 40_000,
            Agent::OpenCode => 40_000,
            Agent::GeminiCli => 40_000,
        }
    }
}

fn bin(name: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/agents/node_modules/.bin")
        .join(name);
    assert!(
        path.exists(),
        "{} is missing: run scripts/test.sh",
        path.display()
    );
    path
}

/// Runs `agent` on the task in `work` against `base` (handoff or the model itself).
fn run(agent: Agent, base: &str, work: &Path, files: usize) -> Output {
    run_with(agent, base, work, files, &[])
}

/// [`run`], with `env` set for the agent too.
fn run_with(agent: Agent, base: &str, work: &Path, files: usize, env: &[(&str, &str)]) -> Output {
    let home = work.join(".home");
    std::fs::create_dir_all(&home).unwrap();
    let prompt = scripted::task_prompt(files);
    let mut command = match agent {
        Agent::ClaudeCode => {
            let mut c = Command::new(bin("claude"));
            c.args([
                "-p",
                &prompt,
                "--model",
                agent.model(),
                "--allowedTools",
                "Read",
            ])
            .args(["--max-turns", "100", "--output-format", "text"])
            .env("ANTHROPIC_BASE_URL", base)
            .env("ANTHROPIC_API_KEY", KEY)
            .env("CLAUDE_CONFIG_DIR", home.join(".claude"))
            .env("CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC", "1")
            .env("DISABLE_AUTOUPDATER", "1")
            .env("DISABLE_AUTO_COMPACT", "1")
            .env("DISABLE_COMPACT", "1")
            .env("CLAUDE_CODE_MAX_OUTPUT_TOKENS", "4096");
            c
        }
        Agent::Codex => {
            let codex_home = home.join(".codex");
            std::fs::create_dir_all(&codex_home).unwrap();
            std::fs::write(
                codex_home.join("config.toml"),
                format!(
                    "model = \"{model}\"\nmodel_provider = \"handoff\"\n\
                     check_for_update_on_startup = false\n\
                     # Codex never compacts by itself: only handoff can save the session.\n\
                     model_context_window = 1000000\nmodel_auto_compact_token_limit = 900000\n\
                     [model_providers.handoff]\nname = \"handoff\"\nbase_url = \"{base}/v1\"\n\
                     wire_api = \"responses\"\nenv_key = \"HANDOFF_AGENT_KEY\"\n\
                     request_max_retries = 0\nstream_max_retries = 0\n\
                     # Nonessential traffic off: no update check, analytics or feedback.\n\
                     [analytics]\nenabled = false\n[feedback]\nenabled = false\n",
                    model = agent.model()
                ),
            )
            .unwrap();
            let mut c = Command::new(bin("codex"));
            // Its default read-only sandbox: reading files is all the task needs.
            c.args(["exec", "--skip-git-repo-check", "--ephemeral", &prompt])
                .env("CODEX_HOME", &codex_home)
                .env("HANDOFF_AGENT_KEY", KEY);
            c
        }
        Agent::OpenCode => {
            let config = serde_json::json!({
                "$schema": "https://opencode.ai/config.json",
                "provider": {"handoff": {
                    "npm": "@ai-sdk/openai-compatible", "name": "handoff",
                    "options": {"baseURL": format!("{base}/v1"), "apiKey": KEY},
                    "models": {agent.model(): {"name": agent.model(), "limit": {"context": 1_000_000, "output": 4096}}}
                }},
                "model": format!("handoff/{}", agent.model()),
                "autoupdate": false, "share": "disabled",
                "compaction": {"auto": false, "prune": false}
            });
            std::fs::write(work.join("opencode.json"), config.to_string()).unwrap();
            let mut c = Command::new(bin("opencode"));
            c.args(["run", &prompt])
                .env("XDG_CONFIG_HOME", home.join(".config"))
                .env("XDG_DATA_HOME", home.join(".local/share"))
                .env("XDG_CACHE_HOME", home.join(".cache"))
                .env("XDG_STATE_HOME", home.join(".local/state"))
                .env("OPENCODE_DISABLE_AUTOUPDATE", "1")
                .env("OPENCODE_DISABLE_LSP_DOWNLOAD", "1");
            c
        }
        Agent::GeminiCli => {
            // Its documented settings: an API key (the base URL alone selects its
            // "gateway" auth, which headless runs refuse), its own compression out of
            // reach, telemetry, usage statistics and updates off.
            let gemini_home = home.join(".gemini");
            std::fs::create_dir_all(&gemini_home).unwrap();
            let settings = serde_json::json!({
                "general": {"disableAutoUpdate": true, "disableUpdateNag": true},
                "security": {"auth": {"selectedType": "gemini-api-key"}},
                "telemetry": {"enabled": false},
                "privacy": {"usageStatisticsEnabled": false},
                "model": {"chatCompression": {"contextPercentageThreshold": 0.99}}
            });
            std::fs::write(gemini_home.join("settings.json"), settings.to_string()).unwrap();
            let mut c = Command::new(bin("gemini"));
            c.args([
                "-p",
                &prompt,
                "-m",
                agent.model(),
                "--output-format",
                "json",
            ])
            .env("GEMINI_API_KEY", KEY)
            .env("GOOGLE_GEMINI_BASE_URL", base)
            .env("GEMINI_CLI_TRUST_WORKSPACE", "true");
            c
        }
    };
    // PWD too: opencode takes its project directory from it, not from the process's cwd.
    command
        .current_dir(work)
        .env("PWD", work)
        .env("HOME", &home)
        .env_remove("OPENAI_API_KEY")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("GOOGLE_API_KEY")
        .stdin(Stdio::null());
    if let Agent::ClaudeCode = agent {
        command.env("ANTHROPIC_API_KEY", KEY);
    }
    command.envs(env.iter().copied());
    let child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the agent");
    support::wait_bounded(child, Duration::from_secs(240))
}

/// `value` in its echo form, the way handoff's echo class compares messages: without
/// `cache_control` annotations, with an empty `content` of an assistant's tool-call
/// message as null (opencode echoes the model's null as ""), and without Gemini's
/// thought parts and function-call ids (Gemini CLI drops the one and adds the other).
fn echo_form(value: Value) -> Value {
    match value {
        Value::Object(mut map) => {
            if let Some(Value::Array(parts)) = map.get_mut("parts") {
                parts.retain(|p| p["thought"] != true);
            }
            if let Some(Value::Object(call)) = map.get_mut("functionCall") {
                call.remove("id");
            }
            let calls = map.get("tool_calls").is_some_and(Value::is_array);
            Value::Object(
                map.into_iter()
                    .filter(|(k, _)| k != "cache_control")
                    .map(|(k, v)| match (k.as_str(), v) {
                        ("content", Value::String(text)) if calls && text.is_empty() => {
                            (k, Value::Null)
                        }
                        (_, v) => (k, echo_form(v)),
                    })
                    .collect(),
            )
        }
        Value::Array(items) => Value::Array(items.into_iter().map(echo_form).collect()),
        other => other,
    }
}

fn said(output: &Output) -> String {
    format!(
        "exit {:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
        output.status.code(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

async fn model_for(
    agent: Agent,
    work: &Path,
    thinking: Thinking,
    files: usize,
) -> (Arc<ScriptedCoder>, MockUpstream) {
    scripted::write_files(work, files).unwrap();
    let model = ScriptedCoder::new(agent.window(), files, work.to_owned(), thinking);
    let answer = Arc::clone(&model);
    let mock = MockUpstream::with(move |request| answer.answer(request)).await;
    (model, mock)
}

/// Without handoff the session dies of the window.
async fn control(agent: Agent) {
    let work = tempfile::tempdir().unwrap();
    let (model, mock) = model_for(agent, work.path(), Thinking::Some, FILES).await;
    let output = tokio::task::spawn_blocking({
        let (url, dir) = (mock.url(), work.path().to_owned());
        move || run(agent, &url, &dir, FILES)
    })
    .await
    .unwrap();
    let seen = model.seen.lock().unwrap();
    assert!(
        !seen.over_window.is_empty(),
        "{agent:?} without handoff should overflow the window: {}",
        said(&output)
    );
    assert!(
        !String::from_utf8_lossy(&output.stdout).contains(scripted::FINAL),
        "{agent:?} finished without handoff: {}",
        said(&output)
    );
}

/// Through handoff with `strategy`, a task of `files` reads: the agent finishes and
/// the log is exact.
/// What a `redact` hook takes out of the agents' sessions when one is on: the
/// settings the files they read name (`k3_17`), and emails (Claude Code's attribution
/// reminder names one), which its `emails` detector finds.
const SETTING: &str = "k[0-9]+_[0-9]+";

/// The hooks of a run: none, or a `redact` hook on every request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hooks {
    None,
    Redact,
}

async fn through_handoff(agent: Agent, strategy: &str, thinking: Thinking, files: usize) {
    through_handoff_with(agent, strategy, thinking, files, Hooks::None).await;
}

async fn through_handoff_with(
    agent: Agent,
    strategy: &str,
    thinking: Thinking,
    files: usize,
    hooks: Hooks,
) {
    let work = tempfile::tempdir().unwrap();
    let (model, mock) = model_for(agent, work.path(), thinking, files).await;
    let mut extra_toml = format!(
        "[models.\"{}\"]\ncontext_window = {}\n[compaction]\nstrategy = \"{strategy}\"\n",
        agent.model(),
        agent.window()
    );
    if hooks == Hooks::Redact {
        extra_toml.push_str(&format!(
            "[middleware]\nchain = [\"secrets\"]\n[middleware.hooks.secrets]\nkind = \"redact\"\n\
             detectors = [\"emails\"]\npatterns = {{ setting = '{SETTING}' }}\n"
        ));
    }
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml,
            ..ProxyOptions::default()
        },
    );
    // The agent talks to a recording hop in front of handoff: what it sent is known
    // byte for byte, whatever view handoff forwarded.
    let hop = support::hop::Hop::start(&proxy.url()).await;
    let output = tokio::task::spawn_blocking({
        let (url, dir) = (hop.url(), work.path().to_owned());
        move || run(agent, &url, &dir, files)
    })
    .await
    .unwrap();
    let context = format!(
        "{agent:?} with {strategy}, hooks {hooks:?}: {}\n--- handoff ---\n{}",
        said(&output),
        proxy.logs()
    );
    assert!(output.status.success(), "{context}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("DONE"),
        "{context}"
    );
    {
        let seen = model.seen.lock().unwrap();
        assert!(
            seen.over_window.is_empty(),
            "the model refused: {:?}\n{context}",
            seen.over_window
        );
        assert!(
            seen.refused.is_empty(),
            "the model refused: {:?}\n{context}",
            seen.refused
        );
        assert!(seen.agent_turns > files, "{context}");
        if strategy == "summarize" {
            assert!(!seen.summaries.is_empty(), "{context}");
        }
        for headers in &seen.summaries {
            for name in headers.keys() {
                let name = name.as_str();
                assert!(
                    !(name.contains("session")
                        || name.starts_with("x-codex")
                        || name.starts_with("x-stainless")
                        || name == "originator"),
                    "a summary call carried the client's {name}"
                );
            }
            let agent_ua = headers
                .get("user-agent")
                .and_then(|v| v.to_str().ok())
                .unwrap_or("");
            assert!(
                agent_ua.starts_with("handoff/"),
                "summary user-agent {agent_ua}"
            );
        }
    }
    let refused = support::refused_lines(&proxy);
    assert!(
        refused.is_empty(),
        "handoff refused: {refused:?}\n{context}"
    );

    let dirs = proxy.conversation_dirs();
    let agent_dirs: Vec<&PathBuf> = dirs
        .iter()
        .filter(|d| !records(&proxy, &d.file_name().unwrap().to_string_lossy()).is_empty())
        .collect();
    assert_eq!(
        agent_dirs.len(),
        1,
        "one compacted conversation: {dirs:?}\n{context}"
    );
    let id = agent_dirs[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    let compactions = records(&proxy, &id);
    assert!(
        compactions.len() >= 2,
        "{} compactions\n{context}",
        compactions.len()
    );
    assert!(
        compactions.iter().all(|r| r["strategy"] == strategy),
        "{compactions:?}"
    );
    // AGENT_DUMP=DIR keeps what the model received and the records, to look into a run.
    if let Ok(dir) = std::env::var("AGENT_DUMP") {
        for (i, r) in mock.requests().iter().enumerate() {
            std::fs::write(format!("{dir}/{agent:?}-{strategy}-{i:03}.json"), &r.body).unwrap();
        }
        let records = Value::from(records(&proxy, &id));
        std::fs::write(
            format!("{dir}/{agent:?}-{strategy}-records.json"),
            records.to_string(),
        )
        .unwrap();
        // The data dir too: a recorded session for `handoff eval --data-dir`.
        let data = proxy.data_dir();
        for (path, bytes) in support::read_tree(&data) {
            let to = std::path::Path::new(&dir)
                .join(format!("{agent:?}-{strategy}-data"))
                .join(path.strip_prefix(&data).unwrap());
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::write(to, bytes).unwrap();
        }
    }
    let listed = proxy.conversations();
    let entry = listed.iter().find(|c| c["id"] == id.as_str()).unwrap();
    assert_eq!(entry["branches"], 1, "{entry}");

    // The replay holds every original: it ends with the model's final answer, after the
    // newest messages the upstream saw, verbatim.
    let replay = proxy.replay(&id, None);
    let last_seen = mock
        .requests()
        .into_iter()
        .rev()
        .find(|r| {
            let body = r.json();
            let declares = |name: &str| body["tools"].to_string().contains(name);
            body["tools"].is_array()
                && (!r.target.contains(":") || declares("\"read_file\""))
                && !body
                    .to_string()
                    .contains(mock_upstream::strict::SUMMARY_PROMPT_START)
        })
        .unwrap()
        .json();
    let view: Vec<Value> = last_seen["messages"]
        .as_array()
        .or_else(|| last_seen["input"].as_array())
        .or_else(|| last_seen["contents"].as_array())
        .cloned()
        .unwrap();
    assert!(
        replay.len() > view.len(),
        "the replay keeps what the view dropped"
    );
    // The newest unit (a call and its result) is always sent verbatim.
    let tail = &view[view.len() - 2..];
    let replayed_tail = &replay[replay.len() - 3..replay.len() - 1];
    // Each original is kept as first logged, and agents echo some in another form: Claude
    // Code drops the cache breakpoint of older messages, opencode writes null as "".
    assert_eq!(
        echo_form(Value::from(replayed_tail.to_vec())),
        echo_form(Value::from(tail.to_vec())),
        "the replay ends with what the agent last sent"
    );
    assert!(replay.last().unwrap().to_string().contains(scripted::FINAL));
    // And it is the agent's last request byte for byte, each message as it sent it (but
    // for what a redact hook took out, which is a marker there and says so).
    if hooks == Hooks::Redact {
        let redacted =
            regex::Regex::new(&format!("{SETTING}|{}", handoff_hook_redact::EMAILS)).unwrap();
        support::hop::assert_replay_exact_but(&proxy, &id, &hop.sent(), Some(&redacted));
        for request in mock.requests() {
            let body = String::from_utf8_lossy(&request.body);
            assert!(!redacted.is_match(&body), "a setting went upstream: {body}");
        }
        let replayed = proxy.audit(&["replay", &id]);
        let note = String::from_utf8_lossy(&replayed.stderr);
        assert!(
            note.contains("setting ×") && note.contains("by \"secrets\""),
            "the replay says what was redacted: {note}"
        );
    } else {
        support::hop::assert_replay_exact(&proxy, &id, &hop.sent());
        println!(
            "RECORD-ROW | {agent:?} | {strategy} | {} | exact",
            support::hop::record_row(&proxy, &id)
        );
    }

    // The figures of BENCHMARKS.md's agent table: of the facts the agent showed the model
    // (its tools may shorten a file: Codex keeps the head and tail of long output), those
    // its last view still holds, in the handoff or verbatim.
    let facts = |text: &str| -> std::collections::HashSet<String> {
        text.match_indices("FACT-")
            .filter_map(|(at, _)| text.get(at..at + 11).map(str::to_owned))
            .collect()
    };
    let shown: std::collections::HashSet<String> = mock
        .requests()
        .iter()
        .flat_map(|r| facts(&String::from_utf8_lossy(&r.body)))
        .collect();
    let kept = facts(&last_seen.to_string()).len();
    let turns = model.seen.lock().unwrap().agent_turns;
    println!(
        "AGENT-ROW | {agent:?} | {strategy} | {turns} | {} | 0 | {} | {:.0}% of {} |",
        compactions.len(),
        entry["branches"],
        100.0 * kept as f64 / shown.len().max(1) as f64,
        shown.len()
    );
    proxy.assert_verified(&[&id]);

    if let Agent::GeminiCli = agent {
        // Other Gemini clients send the key as `?key=`: one such request, tracked.
        let body =
            serde_json::json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]});
        let got = support::client::send(support::client::request(
            "POST",
            &format!(
                "{}/v1beta/models/{}:generateContent?key={KEY}",
                proxy.url(),
                agent.model()
            ),
            &[("content-type", "application/json")],
            body.to_string(),
        ))
        .await;
        assert_eq!(got.status, 200, "{}", got.text());
        let last = mock.requests().pop().unwrap();
        assert!(!last.target.contains("key="), "{}", last.target);
        assert_eq!(last.headers["x-goog-api-key"], KEY);
    }

    // The key never reaches disk, nor the logs (access lines included).
    proxy.assert_secret_nowhere(KEY);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_needs_handoff_and_finishes_through_it() {
    control(Agent::ClaudeCode).await;
    through_handoff(Agent::ClaudeCode, "extract", Thinking::Some, FILES).await;
    through_handoff(Agent::ClaudeCode, "summarize", Thinking::Every, FILES).await;
}

/// Each agent finishes with a `redact` hook on: what it took out never went upstream,
/// compaction worked on the redacted session, and the replay says what was taken out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_agents_finish_with_a_redact_hook_on() {
    for agent in [
        Agent::ClaudeCode,
        Agent::Codex,
        Agent::OpenCode,
        Agent::GeminiCli,
    ] {
        through_handoff_with(agent, "extract", Thinking::Some, FILES, Hooks::Redact).await;
    }
}

/// One 40-turn tool loop with thinking on some turns: it compacts as often as it needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forty_turn_thinking_loop_of_claude_code_compacts_as_often_as_it_needs() {
    through_handoff(Agent::ClaudeCode, "extract", Thinking::Some, 40).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn codex_needs_handoff_and_finishes_through_it() {
    control(Agent::Codex).await;
    through_handoff(Agent::Codex, "extract", Thinking::Some, FILES).await;
    through_handoff(Agent::Codex, "summarize", Thinking::Some, FILES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_cli_needs_handoff_and_finishes_through_it() {
    control(Agent::GeminiCli).await;
    through_handoff(Agent::GeminiCli, "extract", Thinking::Some, FILES).await;
    through_handoff(Agent::GeminiCli, "summarize", Thinking::Some, FILES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_needs_handoff_and_finishes_through_it() {
    control(Agent::OpenCode).await;
    through_handoff(Agent::OpenCode, "extract", Thinking::Some, FILES).await;
    through_handoff(Agent::OpenCode, "summarize", Thinking::Some, FILES).await;
}

/// Claude Code's thinking, as its users switch it on.
const THINKING_ON: &[(&str, &str)] = &[("MAX_THINKING_TOKENS", "4000")];

/// Claude Code with thinking on asks the API to keep its thinking
/// (`context_management` `clear_thinking_20251015`, `keep: "all"`); an
/// Anthropic-compatible endpoint of another provider refuses the field. Without
/// handoff Claude Code cannot run there; through handoff (`native_compaction`
/// `auto`) the endpoint refuses the first ask, handoff serves it from then on, and
/// Claude Code finishes on one conversation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn claude_code_thinking_at_an_endpoint_without_context_management_finishes_through_handoff() {
    let agent = Agent::ClaudeCode;
    let work = tempfile::tempdir().unwrap();
    let (model, mock) = model_for(agent, work.path(), Thinking::Some, FILES).await;
    model.set_native(false);
    let output = tokio::task::spawn_blocking({
        let (url, dir) = (mock.url(), work.path().to_owned());
        move || run_with(agent, &url, &dir, FILES, THINKING_ON)
    })
    .await
    .unwrap();
    {
        let seen = model.seen.lock().unwrap();
        assert!(
            seen.refused
                .iter()
                .any(|r| r.contains("context_management")),
            "Claude Code sent no context_management: {}",
            said(&output)
        );
        assert!(!String::from_utf8_lossy(&output.stdout).contains(scripted::FINAL));
    }

    let work = tempfile::tempdir().unwrap();
    let (model, mock) = model_for(agent, work.path(), Thinking::Some, FILES).await;
    model.set_native(false);
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: format!(
                "[models.\"{}\"]\ncontext_window = {}\n",
                agent.model(),
                agent.window()
            ),
            ..ProxyOptions::default()
        },
    );
    let hop = support::hop::Hop::start(&proxy.url()).await;
    let output = tokio::task::spawn_blocking({
        let (url, dir) = (hop.url(), work.path().to_owned());
        move || run_with(agent, &url, &dir, FILES, THINKING_ON)
    })
    .await
    .unwrap();
    let context = format!("{}\n--- handoff ---\n{}", said(&output), proxy.logs());
    assert!(output.status.success(), "{context}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("DONE"),
        "{context}"
    );
    let asked = (hop.sent().iter())
        .filter(|sent| String::from_utf8_lossy(&sent.body).contains("context_management"))
        .count();
    assert!(asked > 0, "{context}");
    let summaries = {
        let seen = model.seen.lock().unwrap();
        assert!(
            seen.over_window.is_empty(),
            "{:?}\n{context}",
            seen.over_window
        );
        assert_eq!(
            seen.refused.len(),
            1,
            "refused once, then served: {:?}\n{context}",
            seen.refused
        );
        seen.summaries.len()
    };
    let unasked = (mock.requests().iter().skip(1))
        .all(|r| !String::from_utf8_lossy(&r.body).contains("context_management"));
    assert!(unasked, "{context}");
    let listed = proxy.conversations();
    let agent_conversation = (listed.iter())
        .max_by_key(|c| c["requests"].as_u64().unwrap_or(0))
        .unwrap();
    let id = agent_conversation["id"].as_str().unwrap().to_owned();
    proxy.assert_verified(&[&id]);
    println!(
        "SERVED-ROW | Claude Code (thinking on: `clear_thinking_20251015` keep all, in {asked} requests) | {} | 0 | {summaries} | 1 | {} | task done, verified |",
        hop.sent().len(),
        agent_conversation["branches"]
    );
}
