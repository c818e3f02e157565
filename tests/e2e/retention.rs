//! The retained log over time, on the disk store, through the real binary: retention
//! prunes whole idle conversations (never a held or a live one), erasure leaves no
//! trace of a marker anywhere, cold conversations are compressed and read back
//! byte-identical, and `store prune`/`stats` work with the server up or down.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::time::Duration;

use crate::support::client::{self, request};
use crate::support::scenario::{chat, echo_mock, options};
use crate::support::{read_tree, Proxy, ProxyOptions};
use serde_json::{json, Value};

/// A few turns of conversation `id`, each user turn carrying `marker`; the history.
async fn converse(proxy: &Proxy, id: &str, marker: &str, turns: usize) -> Vec<Value> {
    converse_from(proxy, id, marker, turns, Vec::new()).await
}

/// [`converse`] after the messages `history` opens with (a system prompt).
async fn converse_from(
    proxy: &Proxy,
    id: &str,
    marker: &str,
    turns: usize,
    mut history: Vec<Value>,
) -> Vec<Value> {
    for turn in 0..turns {
        history.push(json!({"role": "user", "content": format!("{marker} turn {turn}")}));
        let got = chat(proxy, id, &history).await;
        assert_eq!(got.status, 200, "{}", got.text());
        history.push(got.json()["choices"][0]["message"].clone());
    }
    history
}

fn stdout_json(output: &std::process::Output) -> Value {
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).expect("JSON")
}

/// Every file under `dir` whose bytes contain `needle`.
fn files_with(dir: &Path, needle: &str) -> Vec<String> {
    read_tree(dir)
        .into_iter()
        .filter(|(_, bytes)| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
        .map(|(path, _)| path.display().to_string())
        .collect()
}

fn tombstones(proxy: &Proxy) -> Vec<Value> {
    std::fs::read_to_string(proxy.data_dir().join("tombstones.jsonl"))
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `handoff eval` of one logged conversation with extract at a small window, without
/// its timings.
fn eval_of(proxy: &Proxy, id: &str) -> Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args([
            "eval",
            "--conversation",
            id,
            "--chain",
            "extract",
            "--window",
            "120",
        ])
        .args(["--probe", "turn [0-9]", "--json"])
        .arg("--config")
        .arg(proxy.config_path())
        .env_remove("HANDOFF_CONFIG")
        .output()
        .unwrap();
    let mut value = stdout_json(&output);
    fn strip(value: &mut Value) {
        match value {
            Value::Object(map) => {
                map.retain(|key, _| !key.ends_with("_ms"));
                map.values_mut().for_each(strip);
            }
            Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut value);
    // It read the texts: the probe found the turns in the originals.
    assert_eq!(value["conversations"][0]["requests"], 6, "{value}");
    assert!(value["conversations"][0]["recall"].is_object(), "{value}");
    value
}

async fn admin(proxy: &Proxy, method: &str, path: &str) -> client::Whole {
    client::send(request(method, &format!("{}{path}", proxy.url()), &[], "")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_prunes_idle_conversations_whole_but_never_a_held_or_a_live_one() {
    let mock = echo_mock().await;
    let proxy = Proxy::start_with(
        &mock.url(),
        options(
            8192,
            "[store]\nretention = \"3s\"\nupkeep_interval = \"300ms\"",
        ),
    );
    converse(&proxy, "idle", "IDLE", 3).await;
    converse(&proxy, "kept", "KEPT", 3).await;
    // Put on hold through the CLI while the server runs: it goes to the admin API.
    let held = stdout_json(&proxy.audit(&["hold", "kept", "--reason", "litigation", "--json"]));
    assert_eq!(held["held"], json!(true));
    assert!(proxy.conversation_dir("kept").join("hold.json").is_file());

    // "live" is written to all along; "idle" and "kept" are not.
    let mut live = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(6);
    while std::time::Instant::now() < deadline {
        live.push(json!({"role": "user", "content": format!("LIVE {}", live.len())}));
        let got = chat(&proxy, "live", &live).await;
        assert_eq!(got.status, 200);
        live.push(got.json()["choices"][0]["message"].clone());
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    assert!(
        !proxy.conversation_dir("idle").exists(),
        "the idle conversation is pruned"
    );
    assert!(
        proxy
            .conversation_dir("kept")
            .join("messages.jsonl")
            .is_file(),
        "held"
    );
    let replayed = proxy.replay("live", None);
    assert_eq!(replayed, live, "the live conversation is whole");
    proxy.assert_verified(&[]);

    let pruned: Vec<Value> = tombstones(&proxy)
        .into_iter()
        .filter(|t| t["action"] == "prune")
        .collect();
    assert_eq!(pruned.len(), 1, "{pruned:?}");
    assert_eq!(pruned[0]["conversations"], json!(["idle"]));
    assert_eq!(pruned[0]["by"], "retention");
    assert!(pruned[0]["bytes"].as_u64().unwrap() > 0);
    assert!(proxy
        .metrics()
        .await
        .contains("handoff_pruned_conversations_total 1"));

    // Released, it goes at the next pass.
    let released = stdout_json(&proxy.audit(&["hold", "kept", "--release", "--json"]));
    assert_eq!(released["held"], json!(false));
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while proxy.conversation_dir("kept").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "a released hold is pruned"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A request that continues a pruned conversation starts it anew, whole.
    let again = converse(&proxy, "idle", "IDLE", 1).await;
    let replayed = proxy.replay("idle", None);
    assert_eq!(replayed, again);
    proxy.assert_verified(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasure_leaves_no_trace_of_the_conversation_on_disk_or_in_the_logs() {
    let mock = echo_mock().await;
    let proxy = Proxy::start_with(&mock.url(), options(8192, ""));
    let marker = "ERASE-ME-7f3a91";
    // Its long system prompt is stored once for the tenant: it must go too.
    let system =
        json!({"role": "system", "content": format!("{marker} {}", "be precise. ".repeat(200))});
    let history = converse_from(&proxy, "secret-chat", marker, 4, vec![system]).await;
    converse(&proxy, "other-chat", "KEEP-ME", 2).await;
    assert!(!files_with(&proxy.data_dir(), marker).is_empty());

    let erased = stdout_json(&proxy.audit(&["erase", "--conversation", "secret-chat", "--json"]));
    assert_eq!(erased["erased"], json!(["secret-chat"]));
    assert_eq!(files_with(&proxy.data_dir(), marker), Vec::<String>::new());
    assert!(
        !proxy.logs().contains(marker),
        "no log line names the content"
    );
    let stones = tombstones(&proxy);
    assert_eq!(stones.len(), 1);
    assert_eq!(stones[0]["action"], "erase");
    assert!(stones[0]["by"].as_str().unwrap().starts_with("admin:"));
    assert_eq!(stones[0]["conversations"], json!(["secret-chat"]));
    // The other conversation is whole.
    assert_eq!(proxy.replay("other-chat", None).len(), 4);
    proxy.assert_verified(&[]);

    // Continuing the erased conversation starts a new one: the whole request is logged
    // again, not just its last turn glued to a history that is gone.
    let mut next = history.clone();
    next.push(json!({"role": "user", "content": "after the erasure"}));
    let got = chat(&proxy, "secret-chat", &next).await;
    assert_eq!(got.status, 200);
    next.push(got.json()["choices"][0]["message"].clone());
    assert_eq!(proxy.replay("secret-chat", None), next);
    proxy.assert_verified(&[]);

    // An unknown conversation is a clear error, and erases nothing.
    let unknown = proxy.audit(&["erase", "--conversation", "no-such-chat"]);
    assert!(!unknown.status.success());
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("no-such-chat"));
    let bad = admin(&proxy, "POST", "/handoff/erase?conversation=..%2F..%2Fetc").await;
    assert_eq!(bad.status, 400, "{}", bad.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn erasing_a_key_takes_its_tenant_and_leaves_the_others() {
    let mock = echo_mock().await;
    let keys = "[auth]\n[[auth.keys]]\nname = \"alice\"\nkey_env = \"ALICE_KEY\"\n[[auth.keys]]\nname = \"bob\"\nkey_env = \"BOB_KEY\"\n";
    let mut opts = options(8192, keys);
    opts.env = vec![
        ("ALICE_KEY".into(), "hk-alice-secret".into()),
        ("BOB_KEY".into(), "hk-bob-secret".into()),
    ];
    let proxy = Proxy::start_with(&mock.url(), opts);
    for (key, who) in [("hk-alice-secret", "ALICE"), ("hk-bob-secret", "BOB")] {
        for n in 0..3 {
            let got = crate::support::scenario::post_chat(
                &proxy,
                &[
                    ("authorization", &format!("Bearer {key}")),
                    ("x-handoff-conversation-id", &format!("{who}-{n}")),
                ],
                &json!({"model": "strict", "messages": [{"role": "user", "content": format!("{who} private {n}")}]}),
            )
            .await;
            assert_eq!(got.status, 200, "{}", got.text());
        }
    }
    let erased = stdout_json(&proxy.audit(&["erase", "--key", "alice", "--json"]));
    assert_eq!(erased["erased"].as_array().unwrap().len(), 3);
    assert_eq!(
        files_with(&proxy.data_dir(), "ALICE private"),
        Vec::<String>::new()
    );
    assert_eq!(files_with(&proxy.data_dir(), "BOB private").len(), 3);
    let stats = stdout_json(&proxy.store(&["stats", "--json"]));
    let tenants: Vec<&str> = stats["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants, ["bob"]);
    assert_eq!(stats["tenants"][0]["conversations"], 3);
    assert_eq!(stats["tenants"][0]["requests"], 3);
    let unknown = proxy.audit(&["erase", "--key", "carol"]);
    assert!(!unknown.status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cold_conversation_is_compressed_and_reads_back_byte_identical() {
    let mock = echo_mock().await;
    let proxy = Proxy::start_with(
        &mock.url(),
        options(
            8192,
            "[store]\ncompress_after = \"1s\"\nupkeep_interval = \"300ms\"",
        ),
    );
    let mut history = converse(&proxy, "cold", "COLD", 6).await;
    let before = proxy.replay_raw(&["replay", "cold"]);
    let shown = proxy.audit(&["show", "cold"]).stdout;
    let timeline = admin(&proxy, "GET", "/handoff/conversations/cold/timeline")
        .await
        .text();
    let stats_before = stdout_json(&proxy.store(&["stats", "--json"]));
    let evaluated = eval_of(&proxy, "cold");

    let dir = proxy.conversation_dir("cold");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !dir.join("messages.jsonl.zst").is_file() {
        assert!(std::time::Instant::now() < deadline, "compressed in time");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        std::fs::metadata(dir.join("messages.jsonl")).unwrap().len(),
        0
    );
    assert!(
        files_with(&dir, "COLD turn").is_empty(),
        "the text is compressed"
    );
    assert_eq!(proxy.replay_raw(&["replay", "cold"]), before);
    assert_eq!(proxy.audit(&["show", "cold"]).stdout, shown);
    let after = admin(&proxy, "GET", "/handoff/conversations/cold/timeline")
        .await
        .text();
    assert_eq!(after, timeline);
    assert_eq!(eval_of(&proxy, "cold"), evaluated);
    proxy.assert_verified(&[]);
    let stats = stdout_json(&proxy.store(&["stats", "--json"]));
    assert_eq!(stats["tenants"][0]["compressed"], 1);
    assert_eq!(
        stats["tenants"][0]["requests"],
        stats_before["tenants"][0]["requests"]
    );
    assert_eq!(
        stats["tenants"][0]["bytes_raw"],
        stats_before["tenants"][0]["bytes_raw"]
    );

    // It goes on: new lines land in the plain log after the compressed ones.
    history.push(json!({"role": "user", "content": "COLD back again"}));
    let got = chat(&proxy, "cold", &history).await;
    assert_eq!(got.status, 200);
    assert!(std::fs::metadata(dir.join("messages.jsonl")).unwrap().len() > 0);
    let upstream_saw = mock.requests().last().unwrap().json();
    assert_eq!(upstream_saw["messages"], json!(history));
    history.push(got.json()["choices"][0]["message"].clone());
    assert_eq!(proxy.replay("cold", None), history);
    proxy.assert_verified(&[]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_and_stats_work_on_a_stopped_server_and_a_dry_run_changes_nothing() {
    let mock = echo_mock().await;
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().join("data");
    let opts = ProxyOptions {
        data_dir: Some(data_dir.clone()),
        ..options(8192, "")
    };
    let mut proxy = Proxy::start_with(&mock.url(), opts);
    for n in 0..4 {
        converse(&proxy, &format!("c{n}"), "OLD", 2).await;
    }
    proxy.signal("TERM");
    proxy.wait_exit(Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(1200)).await;

    let dry = stdout_json(&proxy.store(&["prune", "--older-than", "1s", "--dry-run", "--json"]));
    assert_eq!(dry["pruned"].as_array().unwrap().len(), 4);
    assert_eq!(
        proxy.conversation_dirs().len(),
        4,
        "a dry run removes nothing"
    );
    let stats = stdout_json(&proxy.store(&["stats", "--json"]));
    assert_eq!(stats["tenants"][0]["conversations"], 4);
    assert_eq!(stats["tenants"][0]["requests"], 8);

    let done = stdout_json(&proxy.store(&["prune", "--older-than", "1s", "--json"]));
    assert_eq!(done["pruned"].as_array().unwrap().len(), 4);
    assert!(proxy.conversation_dirs().is_empty());
    let stats = stdout_json(&proxy.store(&["stats", "--json"]));
    assert_eq!(stats["tenants"], json!([]));
    let table = proxy.store(&["stats"]);
    assert!(String::from_utf8_lossy(&table.stdout).contains("bytes stored"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_prompt_many_conversations_open_with_is_stored_once_and_replays_exactly() {
    let mock = echo_mock().await;
    let proxy = Proxy::start_with(&mock.url(), options(8192, ""));
    // Spaced as a client sends it: the replay gives these bytes back.
    let prompt = format!(
        "You are a coding agent.   {}",
        "Follow the repository's style.\n".repeat(120)
    );
    let system = json!({"role": "system", "content": prompt});
    let mut histories = Vec::new();
    for n in 0..5 {
        let history = converse_from(
            &proxy,
            &format!("agent-{n}"),
            "TASK",
            2,
            vec![system.clone()],
        )
        .await;
        histories.push(history);
    }
    let blocks: Vec<_> = crate::support::read_tree(&proxy.data_dir())
        .into_iter()
        .filter(|(path, _)| path.components().any(|c| c.as_os_str() == "blocks"))
        .collect();
    assert_eq!(blocks.len(), 1, "one block for the five conversations");
    assert_eq!(
        files_with(&proxy.data_dir(), "Follow the repository's style.").len(),
        1,
        "the prompt is in the block only"
    );
    for (n, history) in histories.iter().enumerate() {
        let raw = proxy.replay_raw(&["replay", &format!("agent-{n}")]);
        assert_eq!(raw.len(), history.len());
        assert_eq!(raw[0], system.to_string(), "byte for byte");
    }
    proxy.assert_verified(&[]);
    // Erasing one keeps the block the others name; erasing all removes it.
    stdout_json(&proxy.audit(&["erase", "--conversation", "agent-0", "--json"]));
    assert_eq!(
        files_with(&proxy.data_dir(), "Follow the repository's style.").len(),
        1
    );
    assert_eq!(
        proxy.replay_raw(&["replay", "agent-1"])[0],
        system.to_string()
    );
    for n in 1..5 {
        stdout_json(&proxy.audit(&["erase", "--conversation", &format!("agent-{n}"), "--json"]));
    }
    assert!(files_with(&proxy.data_dir(), "Follow the repository's style.").is_empty());
}
