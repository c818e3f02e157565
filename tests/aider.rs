//! aider 0.86.2 (PyPI `aider-chat`, installed into `.venv-aider` by scripts/test.sh),
//! unmodified, through the real binary for whole sessions in its ask and diff modes,
//! with its own history summarisation on (its default) and off, against a scripted
//! text-editing model with a strict window and its own tokenizer (bytes / 5).
//!
//! aider re-sends, on every request, its system prompt, few-shot examples, a message
//! holding the files in the chat, its history and the new turn (with its edit rules
//! appended). The default `compaction.pin` profile keeps the examples and the files
//! message in every view; handoff asks for the usage aider does not, so counts are
//! calibrated; the user's edit of a file half-way continues the same conversation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use mock_upstream::text_coder::TextCoder;
use mock_upstream::MockUpstream;
use serde_json::Value;
use support::scenario::records;
use support::{message_lines, Proxy, ProxyOptions};

const KEY: &str = "sk-aider-secret-5e4d3c2b1a09";
const TURNS: u64 = 12;
const CHANGE_AT: u64 = 7;
/// aider's first few-shot example in its edit modes.
const EXAMPLE: &str = "Change get_factorial() to use math.factorial";

fn python() -> PathBuf {
    let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".venv-aider/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/test.sh",
        venv.display()
    );
    venv
}

/// Runs one aider session through `proxy`; returns its turns' JSON lines.
fn run_aider(proxy_url: &str, dir: &std::path::Path, mode: &str, history: &str) -> Vec<Value> {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/aider_session.py");
    let mut child = Command::new(python())
        .arg(script)
        .args([mode, &TURNS.to_string(), &CHANGE_AT.to_string(), history])
        .current_dir(dir)
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", dir)
        .env("OPENAI_API_BASE", format!("{proxy_url}/v1"))
        .env("OPENAI_API_KEY", KEY)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start aider");
    let deadline = std::time::Instant::now() + Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "aider {mode} failed: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

async fn session(mode: &str, history: &str) {
    let work = tempfile::tempdir().unwrap();
    std::fs::write(
        work.path().join("facts.md"),
        "# Facts\n\nFACT_A = amber-17\nFACT_B = birch-88\n",
    )
    .unwrap();
    std::fs::write(work.path().join("counter.py"), "COUNT = 0\n").unwrap();
    let facts = ["amber-17", "cobalt-42", "birch-88"]
        .map(str::to_owned)
        .to_vec();
    let model = TextCoder::new(WINDOW, facts, EXAMPLE);
    let answer = Arc::clone(&model);
    let mock = MockUpstream::with(move |request| answer.answer(request)).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: format!(
                "[models.\"text-coder\"]\ncontext_window = {WINDOW}\n[compaction]\nstrategy = \"extract\"\n"
            ),
            ..ProxyOptions::default()
        },
    );
    // aider talks to a recording hop in front of handoff: what it sent is known byte
    // for byte, whatever view handoff forwarded.
    let hop = support::hop::Hop::start(&proxy.url()).await;
    let lines = tokio::task::spawn_blocking({
        let (url, dir) = (hop.url(), work.path().to_owned());
        let mode = mode.to_owned();
        let history = history.to_owned();
        move || run_aider(&url, &dir, &mode, &history)
    })
    .await
    .unwrap();
    let context = format!(
        "aider {mode}, history {history}\n--- handoff ---\n{}",
        proxy.logs()
    );
    assert_eq!(lines.len() as u64, TURNS, "every turn answered\n{context}");

    // Every task request the model saw: served, with the files' current contents and
    // (in the edit modes) the few-shot examples, asking for usage.
    let turns = model.turns();
    let tasks: Vec<_> = turns.iter().filter(|t| t.turn.is_some()).collect();
    assert!(
        turns.iter().all(|t| !t.over_window),
        "the model refused for its window: {turns:?}\n{context}"
    );
    for n in 1..=TURNS {
        assert!(
            tasks.iter().any(|t| t.turn == Some(n)),
            "turn {n} never reached the model\n{context}"
        );
    }
    for task in &tasks {
        let n = task.turn.unwrap_or(0);
        let current = if n >= CHANGE_AT {
            "cobalt-42"
        } else {
            "amber-17"
        };
        assert!(
            task.facts_seen.iter().any(|f| f == current)
                && task.facts_seen.iter().any(|f| f == "birch-88"),
            "turn {n}: the files message is missing: {task:?}\n{context}"
        );
        if mode != "ask" {
            assert!(
                task.examples,
                "turn {n}: the examples are missing: {task:?}"
            );
        }
        assert!(
            task.asked_usage,
            "turn {n}: handoff did not ask for usage: {task:?}"
        );
    }
    let refused = support::refused_lines(&proxy);
    assert!(
        refused.is_empty(),
        "handoff refused: {refused:?}\n{context}"
    );

    // One conversation for the session (aider's own summaries aside), compacted, with
    // every reply logged with the usage handoff asked for.
    let dirs = proxy.conversation_dirs();
    let compacted: Vec<String> = dirs
        .iter()
        .map(|d| d.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|id| !records(&proxy, id).is_empty())
        .collect();
    assert!(
        !compacted.is_empty(),
        "the session never compacted\n{context}"
    );
    let client_summaries = turns.iter().filter(|t| t.client_summary).count();
    if history == "off" {
        assert_eq!(client_summaries, 0, "{context}");
        assert_eq!(dirs.len(), 1, "one conversation: {dirs:?}\n{context}");
    }
    for id in &compacted {
        let replies: Vec<Value> = message_lines(&proxy, id)
            .into_iter()
            .filter(|l| l["source"] == "upstream")
            .collect();
        assert!(!replies.is_empty());
        assert!(
            replies.iter().all(|l| l["usage"]["prompt_tokens"].is_u64()),
            "replies logged without usage: {replies:?}"
        );
    }
    // The replay keeps every original: it ends with the last turn the model saw,
    // verbatim, and its answer, after more than the compacted view held.
    let last_view = mock
        .requests()
        .into_iter()
        .rev()
        .map(|r| r.json())
        .find(|b| b.to_string().contains(&format!("Turn {TURNS}.")))
        .unwrap();
    let view = last_view["messages"].as_array().unwrap();
    let owner = compacted
        .iter()
        .find(|id| {
            let replay = proxy.replay(id, None);
            replay.len() >= 2 && replay[replay.len() - 2] == view[view.len() - 1]
        })
        .unwrap_or_else(|| panic!("no replay ends with the last turn\n{context}"));
    let replay = proxy.replay(owner, None);
    assert!(
        replay.len() > view.len(),
        "the replay keeps what the view dropped"
    );
    assert_eq!(replay[replay.len() - 1]["role"], "assistant");
    // It is aider's last request byte for byte: its turns without the edit rules it
    // appended only while asking them, its replies as stripped as it re-sent them.
    support::hop::assert_replay_exact(&proxy, owner, &hop.sent());
    println!(
        "RECORD-ROW | aider {mode} (history {history}) | {} | exact",
        support::hop::record_row(&proxy, owner)
    );
    // The files message is put back where aider sent it: after the edit history.
    let text = |m: &Value| m["content"].as_str().unwrap_or("").to_owned();
    let files_at = replay
        .iter()
        .rposition(|m| text(m).starts_with("I have *added these files to the chat*"))
        .unwrap();
    let opening_at = replay
        .iter()
        .position(|m| text(m).starts_with("Turn "))
        .unwrap();
    if mode == "ask" {
        assert!(files_at < opening_at, "ask mode sends the files first");
    } else {
        assert!(files_at > opening_at, "the replay moved the files message");
    }
    // One branch, and each compaction builds on the one before: nothing twice.
    let listed = proxy.conversations();
    let branches = listed
        .iter()
        .find(|c| c["id"] == owner.as_str())
        .map(|c| c["branches"].clone())
        .unwrap_or(Value::Null);
    assert_eq!(branches, 1, "{context}");
    let chained = records(&proxy, owner);
    for pair in chained.windows(2) {
        assert_eq!(
            pair[1]["source"]["start"], pair[0]["source"]["end_exclusive"],
            "a compaction started over: {chained:?}"
        );
    }
    if let Ok(dir) = std::env::var("AIDER_DUMP") {
        let lines: Vec<Value> = message_lines(&proxy, owner);
        std::fs::write(
            format!("{dir}/{mode}-{history}.json"),
            Value::from(lines).to_string(),
        )
        .unwrap();
        let records = Value::from(records(&proxy, owner));
        std::fs::write(
            format!("{dir}/{mode}-{history}-records.json"),
            records.to_string(),
        )
        .unwrap();
    }
    // The key never reaches disk.
    for (path, bytes) in support::read_tree(&proxy.data_dir()) {
        assert!(
            !String::from_utf8_lossy(&bytes).contains(KEY),
            "the key is in {}",
            path.display()
        );
    }
    println!(
        "AIDER-ROW mode={mode} history={history} requests={} tasks={} client_summaries={client_summaries} conversations={} branches={branches} compactions={}",
        turns.len(),
        tasks.len(),
        dirs.len(),
        compacted.iter().map(|id| records(&proxy, id).len()).sum::<usize>()
    );
}

/// Fits aider's prompts and a few turns, not the whole session.
const WINDOW: u64 = 4_000;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_ask_mode_keeps_its_files_through_compactions() {
    session("ask", "on").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_diff_mode_keeps_its_files_and_examples_with_its_history_summaries() {
    session("diff", "on").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aider_diff_mode_without_its_own_summaries_is_one_conversation() {
    session("diff", "off").await;
}
