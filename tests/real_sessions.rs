//! The shared real conversations (`../shared/data/conversations`, bfcl tool-calling
//! sessions with real tool outputs), chained per tool set into long sessions and
//! replayed through `handoff eval` at windows down to where the biggest newest unit
//! is 90% of the window: handoff refuses none of their requests.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use mock_upstream::strict::text_tokens;
use serde_json::{json, Value};

fn shared_conversations() -> Option<PathBuf> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/data/conversations");
    dir.is_dir().then_some(dir)
}

/// The conversations grouped by tool set, each group chained into one session: the
/// first file's messages, then every later file's without its system messages.
fn chained_sessions(dir: &std::path::Path) -> Vec<Value> {
    let mut groups: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    names.sort();
    for path in names {
        let file: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        groups
            .entry(file["tools"].to_string())
            .or_default()
            .push(file);
    }
    groups
        .into_values()
        .filter(|files| files.len() >= 2)
        .map(|files| {
            let mut messages: Vec<Value> = Vec::new();
            for (index, file) in files.iter().enumerate() {
                for message in file["messages"].as_array().unwrap() {
                    if index > 0 && message["role"] == "system" {
                        continue;
                    }
                    messages.push(message.clone());
                }
            }
            json!({"tools": files[0]["tools"], "messages": messages})
        })
        .collect()
}

#[test]
fn chained_real_sessions_are_never_refused_down_to_a_ninety_percent_newest_unit() {
    let Some(dir) = shared_conversations() else {
        println!("SKIPPED: ../shared/data/conversations is not beside the checkout");
        return;
    };
    let sessions = chained_sessions(&dir);
    assert!(sessions.len() >= 5, "{} sessions", sessions.len());
    let work = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut biggest = 0;
    for (index, session) in sessions.iter().enumerate() {
        let tools = text_tokens(&session["tools"].to_string());
        for message in session["messages"].as_array().unwrap() {
            let unit = text_tokens(&message["content"].to_string()) + tools;
            biggest = biggest.max(unit);
        }
        let path = work.path().join(format!("session_{index:02}.json"));
        std::fs::write(&path, session.to_string()).unwrap();
        files.push(path);
    }
    // The biggest newest unit (with the tools it rides with) is 90% of the smallest one.
    let tightest = (biggest as f64 / 0.9).ceil() as u64;
    // 8192 too: there the biggest tool results are over the window, and are rescued.
    for window in [8_192, tightest, 32_768] {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_handoff"));
        command.args(["eval", "--chain", "extract", "--json"]);
        command.args(["--window", &window.to_string()]);
        for file in &files {
            command.arg("--file").arg(file);
        }
        let output = command
            .current_dir(work.path())
            .env_remove("HANDOFF_CONFIG")
            .output()
            .unwrap();
        assert!(
            output.status.success(),
            "{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let report: Value = serde_json::from_slice(&output.stdout).unwrap();
        let conversations = report["conversations"].as_array().unwrap();
        let requests: u64 = conversations
            .iter()
            .map(|c| c["requests"].as_u64().unwrap())
            .sum();
        let compactions: usize = conversations
            .iter()
            .map(|c| c["compactions"].as_array().map_or(0, Vec::len))
            .sum();
        let errors: Vec<&Value> = conversations
            .iter()
            .flat_map(|c| c["errors"].as_array().into_iter().flatten())
            .collect();
        println!("REAL-SESSIONS window={window} sessions={} requests={requests} compactions={compactions} refusals={}", conversations.len(), errors.len());
        assert!(errors.is_empty(), "window {window}: {errors:?}");
        assert!(compactions > 0, "window {window} compacted nothing");
    }
}
