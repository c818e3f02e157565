//! Erasure is final: a request in flight when its conversation is erased does not bring
//! it back, and no link planted below the data dir is followed for deletion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::support::scenario::chat;
use crate::support::{Proxy, ProxyOptions};
use mock_upstream::{MockUpstream, Reply};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_lands_after_the_erasure_does_not_bring_the_conversation_back() {
    let mock =
        MockUpstream::with(|_| Reply::chat_text("late").delayed(Duration::from_millis(1500))).await;
    let proxy = Proxy::start(&mock.url());
    let in_flight =
        crate::support::scenario::turn_in_flight(&proxy, &mock, "in-flight", "ERASE-ME-in-flight")
            .await;
    let folder = proxy.conversation_dir("in-flight");
    assert!(folder.join("messages.jsonl").is_file());
    let erased = proxy.audit(&["erase", "--conversation", "in-flight", "--json"]);
    assert!(erased.status.success(), "{erased:?}");
    assert!(!folder.exists());

    let answered = in_flight.await.unwrap();
    assert_eq!(answered.status, 200, "{}", answered.text());
    // The reply is logged after the client has it: wait for what became of it.
    proxy.wait_for_log("its reply is not logged", Duration::from_secs(10));
    assert!(
        !folder.exists(),
        "the reply brought the erased conversation back"
    );
    assert!(proxy.conversations().is_empty());
    for (path, bytes) in crate::support::read_tree(&proxy.data_dir()) {
        assert!(
            !String::from_utf8_lossy(&bytes).contains("ERASE-ME-in-flight"),
            "{}",
            path.display()
        );
    }
    // The conversation starts again, whole, with the next request.
    let got = chat(
        &proxy,
        "in-flight",
        &[json!({"role": "user", "content": "again"})],
    )
    .await;
    assert_eq!(got.status, 200);
    assert_eq!(proxy.replay("in-flight", None).len(), 2);
}

/// What a link points at, with a file that must outlive every deletion.
fn precious(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    let file = dir.join(name);
    std::fs::write(&file, "not handoff's").unwrap();
    file
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_below_the_data_dir_are_never_followed_for_deletion() {
    let outside = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    std::fs::set_permissions(
        &data_dir,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    // `upkeep` as a link: emptied at every start before.
    let upkeep_target = precious(&outside.path().join("upkeep"), "removed-keep-me");
    std::os::unix::fs::symlink(outside.path().join("upkeep"), data_dir.join("upkeep")).unwrap();

    let mock = MockUpstream::with(|_| Reply::chat_text("fine")).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            data_dir: Some(data_dir.clone()),
            ..Default::default()
        },
    );
    // A pinned set long enough to be stored as a block of the tenant.
    let system = json!({"role": "system", "content": "be precise. ".repeat(200)});
    let got = chat(
        &proxy,
        "with-block",
        &[system, json!({"role": "user", "content": "hi"})],
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert!(
        upkeep_target.is_file(),
        "upkeep's link was followed at start"
    );

    // `tenants/<t>/blocks` as a link to a folder holding a file of a block's name.
    let blocks = proxy
        .conversation_dir("with-block")
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("blocks");
    let names: Vec<String> = std::fs::read_dir(&blocks)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    let moved = outside.path().join("blocks");
    std::fs::rename(&blocks, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &blocks).unwrap();
    // With `upkeep` a link, an erasure refuses rather than move a folder through it.
    let refused = proxy.audit(&["erase", "--conversation", "with-block", "--json"]);
    assert!(!refused.status.success(), "{refused:?}");
    assert!(proxy.conversation_dir("with-block").is_dir());
    assert_eq!(
        std::fs::read_dir(outside.path().join("upkeep"))
            .unwrap()
            .count(),
        1
    );
    std::fs::remove_file(data_dir.join("upkeep")).unwrap();
    let erased = proxy.audit(&["erase", "--conversation", "with-block", "--json"]);
    assert!(erased.status.success(), "{erased:?}");
    assert!(!proxy.conversation_dir("with-block").exists());
    assert!(
        moved.join(&names[0]).is_file(),
        "a block was deleted through a link"
    );
    assert!(upkeep_target.is_file());
}

/// A compression keeps the folder it swapped out for a while, for readers still in it;
/// an erasure takes that folder at once too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erasure_takes_the_folder_a_compression_swapped_out() {
    let mock = MockUpstream::with(|_| Reply::chat_text("fine")).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            extra_toml: "[store]\ncompress_after = \"1s\"\nupkeep_interval = \"300ms\"\n".into(),
            ..Default::default()
        },
    );
    let marker = "ERASE-ME-compressed";
    let got = chat(
        &proxy,
        "compressed",
        &[json!({"role": "user", "content": marker})],
    )
    .await;
    assert_eq!(got.status, 200);
    let dir = proxy.conversation_dir("compressed");
    for _ in 0..100 {
        if dir.join("messages.jsonl.zst").is_file() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        dir.join("messages.jsonl.zst").is_file(),
        "compressed in time"
    );
    let upkeep = proxy.data_dir().join("upkeep");
    let swapped_out = |upkeep: &std::path::Path| {
        crate::support::read_tree(upkeep)
            .into_iter()
            .filter(|(_, bytes)| String::from_utf8_lossy(bytes).contains(marker))
            .count()
    };
    assert!(
        swapped_out(&upkeep) > 0,
        "the old folder is kept for readers"
    );
    let erased = proxy.audit(&["erase", "--conversation", "compressed", "--json"]);
    assert!(erased.status.success(), "{erased:?}");
    assert_eq!(
        swapped_out(&upkeep),
        0,
        "the swapped-out folder outlived the erasure"
    );
}
