//! Every reply reaches the log of originals: before the client sees its end, whole or
//! cut short, and echoed back by real SDKs without forking the conversation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::support::client::{self, request};
use crate::support::scenario::{run_client, CHAT};
use crate::support::{access_lines, message_lines, Proxy};
use mock_upstream::{agent_reply_as, tool_call_frames, AgentStyle, MockUpstream, Reply};
use serde_json::{json, Value};

/// The user text of a conversation's first message, and its upstream replies.
fn replies_by_question(proxy: &Proxy) -> Vec<(String, Vec<Value>)> {
    let mut out = Vec::new();
    for dir in proxy.conversation_dirs() {
        let id = dir.file_name().unwrap().to_string_lossy().into_owned();
        let lines = message_lines(proxy, &id);
        let question = lines
            .iter()
            .find(|l| l["source"] == "client")
            .map(|l| l["message"]["content"].as_str().unwrap().to_owned())
            .unwrap();
        let replies = lines
            .into_iter()
            .filter(|l| l["source"] == "upstream")
            .collect();
        out.push((question, replies));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_streamed_reply_is_logged_before_a_client_that_closes_at_done_sees_it() {
    let mock = MockUpstream::with(|req| {
        let question = req.json()["messages"][0]["content"]
            .as_str()
            .unwrap()
            .to_owned();
        let n = question
            .split_whitespace()
            .nth(1)
            .unwrap()
            .trim_end_matches(':')
            .to_owned();
        let frames = if question.contains("call a tool") {
            tool_call_frames(&format!("call_{n}"), "lookup", &format!("{{\"n\": {n}}}"))
        } else {
            mock_upstream::chat_stream_frames(&["Hello ", "number ", &n])
        };
        Reply::Sse {
            frames,
            gap: Duration::ZERO,
            cut_after: None,
        }
    })
    .await;
    let proxy = Proxy::start_with(
        &mock.url(),
        crate::support::ProxyOptions {
            rust_log: "info".into(),
            ..Default::default()
        },
    );

    let got = run_client(&proxy, "openai_close_after_done.py", &["500", "4"]).await;
    // Read at once: the client has closed, so every reply must already be on disk.
    let logged = replies_by_question(&proxy);

    let got = got.as_array().unwrap();
    assert_eq!(got.len(), 500);
    assert_eq!(logged.len(), 500, "one conversation per client");
    for (question, replies) in &logged {
        let n: usize = question
            .split_whitespace()
            .nth(1)
            .unwrap()
            .trim_end_matches(':')
            .parse()
            .unwrap();
        assert_eq!(
            replies.len(),
            1,
            "{question}: logged exactly once: {replies:?}"
        );
        let reply = &replies[0];
        assert_eq!(reply["complete"], true, "{reply}");
        let client_saw = &got[n];
        let message = &reply["message"];
        if n.is_multiple_of(2) {
            assert_eq!(
                message["content"],
                Value::Null,
                "tool-call replies carry content: null"
            );
            assert_eq!(message["tool_calls"][0]["id"], format!("call_{n}"));
            assert_eq!(
                message["tool_calls"][0]["function"]["arguments"],
                client_saw["calls"][0]["arguments"]
            );
        } else {
            assert_eq!(message["content"], client_saw["text"]);
            assert_eq!(message["content"], format!("Hello number {n}"));
        }
    }
    let complete = access_lines(&proxy)
        .iter()
        .filter(|l| l.contains("outcome=\"complete\""))
        .count();
    assert_eq!(complete, 500, "the access log calls every stream complete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_mid_stream_leaves_its_partial_reply_logged_as_incomplete() {
    let words: Vec<String> = (0..40).map(|i| format!("w{i} ")).collect();
    let deltas: Vec<&str> = words.iter().map(String::as_str).collect();
    let mock = MockUpstream::replying(Reply::chat_stream(&deltas, Duration::from_millis(25))).await;
    let proxy = Proxy::start(&mock.url());

    let body = json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "count slowly"}]});
    let req = request(
        "POST",
        &format!("{}{CHAT}", proxy.url()),
        &[
            ("content-type", "application/json"),
            ("x-handoff-conversation-id", "gone"),
        ],
        body.to_string(),
    );
    // The role frame and three words, then the client hangs up.
    let seen = client::stream(req, Some(4)).await;
    let sent_bytes: usize = seen.frames.iter().map(|(_, b)| b.len()).sum();
    mock.wait_for_aborted_stream(Duration::from_secs(10)).await;

    let reply = wait_for_reply(&proxy, "gone");
    assert_eq!(reply["complete"], false, "{reply}");
    assert_eq!(reply["incomplete"], "client_gone");
    let text = reply["message"]["content"].as_str().unwrap();
    assert!(
        text.starts_with("w0 w1 w2 "),
        "what arrived is kept: {text:?}"
    );
    assert!(!text.contains("w39"), "the reply was cut: {text:?}");

    let verify = proxy.audit(&["verify", "gone"]);
    let out = String::from_utf8_lossy(&verify.stdout);
    assert!(
        verify.status.success(),
        "an incomplete reply is no error: {out}"
    );
    assert!(
        out.contains("note: incomplete reply (client_gone)"),
        "{out}"
    );

    let line = wait_for_access(&proxy, "conversation=\"gone\"");
    assert!(line.contains("outcome=\"client_gone\""), "{line}");
    let bytes: usize = field(&line, "bytes").parse().unwrap();
    assert!(
        bytes >= sent_bytes && bytes < sent_bytes + 200 * 36,
        "bytes={bytes} counts what was sent, the client read {sent_bytes}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_reports_what_each_client_was_sent() {
    let mock = MockUpstream::with(|req| {
        if req.json()["messages"][0]["content"] == "cut" {
            Reply::chat_stream(&["Hel", "lo", " there"], Duration::from_millis(20)).cut_at(3)
        } else if req.json()["stream"] == true {
            Reply::chat_stream(&["Hel", "lo"], Duration::ZERO)
        } else {
            Reply::chat_text("Hello!")
        }
    })
    .await;
    let proxy = Proxy::start(&mock.url());
    let url = format!("{}{CHAT}", proxy.url());
    let ask = |id: &str, stream: bool| {
        request(
            "POST",
            &url,
            &[("content-type", "application/json"), ("x-handoff-conversation-id", id)],
            json!({"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": id}]})
                .to_string(),
        )
    };

    let plain = client::send(ask("plain", false)).await;
    assert_eq!(plain.status, 200);
    let line = wait_for_access(&proxy, "conversation=\"plain\"");
    assert!(line.contains("outcome=\"complete\""), "{line}");
    assert_eq!(
        field(&line, "bytes"),
        plain.body.len().to_string(),
        "{line}"
    );

    let streamed = client::stream(ask("streamed", true), None).await;
    assert!(streamed.error.is_none());
    let line = wait_for_access(&proxy, "conversation=\"streamed\"");
    assert!(line.contains("outcome=\"complete\""), "{line}");
    assert_eq!(
        field(&line, "bytes"),
        streamed.text().len().to_string(),
        "{line}"
    );

    let cut = client::stream(ask("cut", true), None).await;
    assert!(cut.error.is_some(), "the client sees the cut");
    let line = wait_for_access(&proxy, "conversation=\"cut\"");
    assert!(line.contains("outcome=\"upstream_cut\""), "{line}");
    // A reset connection may discard what the client had not read yet: the proxy counts
    // what it sent, at least what the client saw, and no more than the upstream's frames.
    let bytes: usize = field(&line, "bytes").parse().unwrap();
    let upstream_sent: usize = mock_upstream::chat_stream_frames(&["Hel", "lo", " there"])[..3]
        .iter()
        .map(String::len)
        .sum();
    assert!(
        (cut.text().len()..=upstream_sent).contains(&bytes),
        "{line}: client saw {}, upstream sent {upstream_sent}",
        cut.text().len()
    );
    let reply = wait_for_reply(&proxy, "cut");
    assert_eq!(reply["complete"], false);
    assert_eq!(reply["incomplete"], "upstream_cut");
    assert_eq!(
        reply["message"]["content"], "Hello",
        "what arrived before the cut"
    );

    let health = client::send(request(
        "GET",
        &format!("{}/handoff/health", proxy.url()),
        &[],
        "",
    ))
    .await;
    let line = wait_for_access(&proxy, "path=/handoff/health");
    assert!(line.contains("outcome=\"complete\""), "{line}");
    assert_eq!(
        field(&line, "bytes"),
        health.body.len().to_string(),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_echoed_by_the_openai_sdk_keep_one_branch() {
    let serial = AtomicUsize::new(0);
    let style = AgentStyle {
        spaced_arguments: true,
        empty_text: true,
        ..Default::default()
    };
    let mock = MockUpstream::with(move |req| {
        agent_reply_as(req, serial.fetch_add(1, Ordering::SeqCst), style)
    })
    .await;
    let proxy = Proxy::start(&mock.url());

    let got = run_client(&proxy, "openai_echo_forms.py", &["10"]).await;

    let conversations = proxy.conversations();
    assert_eq!(conversations.len(), 1, "{conversations:?}");
    let summary = &conversations[0];
    assert_eq!(summary["branches"], 1, "echoes must not fork: {summary}");
    let id = summary["id"].as_str().unwrap();
    let lines = message_lines(&proxy, id);
    let messages = got["messages"].as_array().unwrap();
    // Everything the client holds, less its last (unsent) user turn or tool result.
    let sent = messages.len() - 1;
    assert_eq!(lines.len(), sent, "one line per message, no duplicates");
    let assistants = lines
        .iter()
        .filter(|l| l["message"]["role"] == "assistant")
        .count();
    assert_eq!(
        assistants, 10,
        "each reply logged once, none again as an echo"
    );
    for pair in lines.windows(2) {
        assert_eq!(pair[1]["parent"], pair[0]["digest"], "the log is one chain");
    }
    // The echoes really differed from what was logged: the test exercises the merge.
    let echoed_differently = messages
        .iter()
        .zip(&lines)
        .filter(|(echo, line)| {
            crate::support::canonical(echo) != crate::support::canonical(&line["message"])
        })
        .count();
    if echoed_differently < 5 {
        for (echo, line) in messages.iter().zip(&lines) {
            eprintln!("client {echo}\nlogged {}\n", line["message"]);
        }
    }
    assert!(
        echoed_differently >= 5,
        "only {echoed_differently} echoes differed"
    );
    proxy.assert_verified(&[id]);
}

/// Waits for the first upstream reply of `id` to be logged.
fn wait_for_reply(proxy: &Proxy, id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let lines = message_lines(proxy, id);
        if let Some(reply) = lines.into_iter().find(|l| l["source"] == "upstream") {
            return reply;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reply logged for {id}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits for the access line that contains `needle`.
fn wait_for_access(proxy: &Proxy, needle: &str) -> String {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(line) = access_lines(proxy).into_iter().find(|l| l.contains(needle)) {
            return line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no access line with {needle}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The value of `name=` in a log line.
fn field<'l>(line: &'l str, name: &str) -> &'l str {
    line.split_whitespace()
        .find_map(|part| part.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("no {name}= in {line}"))
}

/// A small tmpfs, unmounted when dropped, even when the test fails.
struct SmallDisk {
    path: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl SmallDisk {
    /// A 4 MB tmpfs left with about `free` bytes; `None` where mounting is not allowed.
    fn mount(free: u64) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("disk");
        std::fs::create_dir(&path).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=4m", "tmpfs"])
            .arg(&path)
            .output();
        if !mounted.as_ref().is_ok_and(|o| o.status.success()) {
            eprintln!("SKIPPED: cannot mount a tmpfs here (needs root): {mounted:?}");
            return None;
        }
        let disk = Self { path, _dir: dir };
        let df = std::process::Command::new("df")
            .args(["-B1", "--output=avail"])
            .arg(&disk.path)
            .output()
            .unwrap();
        let avail: u64 = String::from_utf8_lossy(&df.stdout)
            .lines()
            .nth(1)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let filler = vec![b'x'; (avail - free) as usize];
        std::fs::write(disk.path.join("filler"), filler).unwrap();
        Some(disk)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_that_cannot_be_logged_never_ends_cleanly_while_the_store_is_required() {
    // The secret, the lock file and two short questions fit in the 16 KB left (a page
    // per file on tmpfs); an 18 KB answer does not.
    let Some(disk) = SmallDisk::mount(16 * 1024) else {
        return;
    };
    let answer = "lorem ipsum dolor sit amet ".repeat(700);
    let words: Vec<String> = answer.split_inclusive(' ').map(str::to_owned).collect();
    let chunks: Vec<String> = words.chunks(50).map(|c| c.concat()).collect();
    let reply_text = answer.clone();
    let mock = MockUpstream::with(move |req| {
        if req.json()["stream"] == true {
            let deltas: Vec<&str> = chunks.iter().map(String::as_str).collect();
            Reply::chat_stream(&deltas, Duration::ZERO)
        } else {
            Reply::chat_text(&reply_text)
        }
    })
    .await;
    let ask = |proxy: &Proxy, id: &str, stream: bool| {
        request(
            "POST",
            &format!("{}{CHAT}", proxy.url()),
            &[("content-type", "application/json"), ("x-handoff-conversation-id", id)],
            json!({"model": "gpt-4o", "stream": stream, "messages": [{"role": "user", "content": "a short question"}]})
                .to_string(),
        )
    };
    let options = |disk: &SmallDisk, extra: &str| crate::support::ProxyOptions {
        data_dir: Some(disk.path.join("data")),
        extra_toml: extra.to_owned(),
        ..Default::default()
    };

    let mut proxy = Proxy::start_with(&mock.url(), options(&disk, ""));
    let plain = client::send(ask(&proxy, "full-json", false)).await;
    assert_eq!(
        plain.status, 503,
        "a reply that is not in the log is not answered"
    );
    assert_eq!(plain.json()["error"]["type"], "storage_error");

    let streamed = client::stream(ask(&proxy, "full-stream", true), None).await;
    assert_eq!(streamed.status, 200);
    assert!(
        streamed.error.is_some(),
        "the stream must be cut, not closed cleanly"
    );
    assert!(!streamed.text().contains("[DONE]"), "the end is never sent");
    assert!(
        streamed.text().contains("lorem ipsum"),
        "what came before the end was relayed"
    );

    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("handoff_replies_unlogged_total{cause=\"storage\"} 2"),
        "{}",
        metrics
    );
    assert!(proxy.logs().contains("the reply could not be logged"));
    proxy.kill9();

    // Not required: the reply is relayed, and the failure still counted and warned about.
    let disk = SmallDisk::mount(12 * 1024).unwrap();
    let proxy = Proxy::start_with(&mock.url(), options(&disk, "[store]\nrequired = false\n"));
    let relayed = client::send(ask(&proxy, "relayed", false)).await;
    assert_eq!(relayed.status, 200);
    assert_eq!(relayed.json()["choices"][0]["message"]["content"], answer);
    proxy.wait_for_log("the reply could not be logged", Duration::from_secs(5));
    let metrics = proxy.metrics().await;
    assert!(
        metrics.contains("handoff_replies_unlogged_total{cause=\"storage\"} 1"),
        "{}",
        metrics
    );
}
