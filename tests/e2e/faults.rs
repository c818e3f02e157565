//! The proxy under faults, on the real binary: slow and half-sent requests, oversized
//! uploads, a second process on one data dir, a full disk, an upstream that resets
//! mid-stream, and hundreds of held streams.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support::client::{self, request};
use crate::support::scenario::post_chat;
use crate::support::{Proxy, ProxyOptions};
use mock_upstream::{MockUpstream, Reply};
use serde_json::{json, Value};

fn with_toml(extra: &str) -> ProxyOptions {
    ProxyOptions {
        extra_toml: extra.into(),
        ..ProxyOptions::default()
    }
}

fn small_chat() -> Value {
    json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}]})
}

/// What arrives within `wait`, and whether the server closed the connection.
fn read_until_closed(stream: &mut TcpStream, wait: Duration) -> (Vec<u8>, bool) {
    stream
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let until = Instant::now() + wait;
    let mut got = Vec::new();
    let mut buffer = [0u8; 4096];
    while Instant::now() < until {
        match stream.read(&mut buffer) {
            Ok(0) => return (got, true),
            Ok(n) => got.extend_from_slice(&buffer[..n]),
            Err(err)
                if matches!(
                    err.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return (got, true),
        }
    }
    (got, false)
}

/// What arrives within `wait`, whether or not the server closes after it.
fn read_for(stream: &mut TcpStream, wait: Duration) -> Vec<u8> {
    read_until_closed(stream, wait).0
}

/// Reads until the server closes; `None` if it is still open after `wait`.
fn closed_within(stream: &mut TcpStream, wait: Duration) -> Option<Vec<u8>> {
    let (got, closed) = read_until_closed(stream, wait);
    closed.then_some(got)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slow_and_unfinished_requests_are_cut_off_while_others_are_served() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        with_toml("[limits]\nheader_timeout = \"2s\"\nbody_timeout = \"2s\"\n"),
    );
    let addr = proxy.addr();
    let attack = std::thread::spawn(move || {
        // 300 connections trickling a request head, 20 that never finish a body, and
        // 20 that send nothing at all.
        let mut trickling: Vec<TcpStream> = (0..300)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\n")
                    .unwrap();
                s
            })
            .collect();
        let mut unfinished: Vec<TcpStream> = (0..20)
            .map(|_| {
                let mut s = TcpStream::connect(addr).unwrap();
                s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: 10000\r\n\r\n{\"model\":").unwrap();
                s
            })
            .collect();
        let mut silent: Vec<TcpStream> =
            (0..20).map(|_| TcpStream::connect(addr).unwrap()).collect();
        for _ in 0..10 {
            for s in &mut trickling {
                let _ = s.write_all(b"x");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
        let open = |streams: &mut Vec<TcpStream>| {
            streams
                .iter_mut()
                .map(|s| closed_within(s, Duration::from_millis(10)).is_none())
                .filter(|open| *open)
                .count()
        };
        let unfinished_answers: Vec<String> = unfinished
            .iter_mut()
            .map(|s| {
                String::from_utf8_lossy(
                    &closed_within(s, Duration::from_secs(5)).unwrap_or_default(),
                )
                .into_owned()
            })
            .collect();
        (open(&mut trickling), open(&mut silent), unfinished_answers)
    });
    // A normal client is served all along.
    let started = Instant::now();
    let mut served = 0;
    while started.elapsed() < Duration::from_secs(3) {
        let got = post_chat(&proxy, &[], &small_chat()).await;
        assert_eq!(got.status, 200, "{}", got.text());
        served += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (trickling_open, silent_open, unfinished) =
        tokio::task::spawn_blocking(move || attack.join().unwrap())
            .await
            .unwrap();
    assert!(served >= 10, "served {served}");
    assert_eq!(
        trickling_open, 0,
        "trickling heads are closed after limits.header_timeout"
    );
    assert_eq!(
        silent_open, 0,
        "silent connections are closed after limits.header_timeout"
    );
    for answer in unfinished {
        assert!(
            answer.starts_with("HTTP/1.1 408"),
            "an unfinished body gets 408: {answer}"
        );
        assert!(answer.contains("request_timeout"), "{answer}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_upload_is_answered_413_that_a_plain_client_reads() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        with_toml("[limits]\nmax_body_bytes = 1048576\n"),
    );
    // Python's urllib sends the whole body before it reads the answer.
    let script = r#"
import json, sys, urllib.request, urllib.error
body = json.dumps({"model": "gpt-4o", "messages": [{"role": "user", "content": "x" * 4_000_000}]}).encode()
req = urllib.request.Request(sys.argv[1] + "/v1/chat/completions", data=body, headers={"content-type": "application/json"})
try:
    urllib.request.urlopen(req)
    print(json.dumps({"status": 200}))
except urllib.error.HTTPError as err:
    print(json.dumps({"status": err.code, "body": json.loads(err.read())}))
"#;
    let url = proxy.url();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("python3")
            .args(["-c", script, &url])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answer: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(answer["status"], 413, "{answer}");
    assert_eq!(
        answer["body"]["error"]["code"], "request_too_large",
        "{answer}"
    );

    // A chunked body that crosses the limit gets the same, read after the whole upload.
    let addr = proxy.addr();
    let raw = tokio::task::spawn_blocking(move || {
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n").unwrap();
        let chunk = vec![b'x'; 64 * 1024];
        for _ in 0..48 {
            s.write_all(format!("{:x}\r\n", chunk.len()).as_bytes()).unwrap();
            s.write_all(&chunk).unwrap();
            s.write_all(b"\r\n").unwrap();
        }
        s.write_all(b"0\r\n\r\n").unwrap();
        String::from_utf8_lossy(&read_for(&mut s, Duration::from_secs(2))).into_owned()
    })
    .await
    .unwrap();
    assert!(raw.starts_with("HTTP/1.1 413"), "{raw}");
    assert!(raw.contains("request_too_large"), "{raw}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_serve_on_a_locked_data_dir_exits_naming_the_holder() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Proxy::start(&mock.url());
    let out = Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(["serve", "--config"])
        .arg(proxy.config_path())
        .args(["--listen", "127.0.0.1:0"])
        .env_remove("HANDOFF_CONFIG")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&proxy.data_dir().display().to_string()),
        "{stderr}"
    );
    assert!(
        stderr.contains(&proxy.pid().to_string()),
        "names the holder: {stderr}"
    );
    // The first one is unharmed, and audit still reads without a lock.
    let got = post_chat(&proxy, &[], &small_chat()).await;
    assert_eq!(got.status, 200);
    proxy.assert_verified(&[]);
}

/// A small tmpfs, unmounted when dropped (even when the test fails).
struct Tmpfs(tempfile::TempDir);

impl Tmpfs {
    fn mount(size: &str) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let mounted = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .is_ok_and(|o| o.status.success());
        mounted.then_some(Self(dir))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_with_503_loses_nothing_and_recovers_without_restart() {
    let Some(disk) = Tmpfs::mount("4m") else {
        eprintln!("SKIPPED: cannot mount a tmpfs here (needs root)");
        return;
    };
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let data = disk.0.path().join("data");
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            data_dir: Some(data.clone()),
            extra_toml: "[store]\nfsync = \"always\"\n".into(),
            ..ProxyOptions::default()
        },
    );
    let filler = disk.0.path().join("filler");
    let mut messages = Vec::new();
    let mut acknowledged = Vec::new();
    let mut refused = 0;
    for n in 0..200 {
        messages
            .push(json!({"role": "user", "content": format!("turn {n} {}", "y".repeat(20_000))}));
        let got = post_chat(
            &proxy,
            &[("x-handoff-conversation-id", "full")],
            &json!({"model": "gpt-4o", "messages": messages}),
        )
        .await;
        match got.status.as_u16() {
            200 => {
                acknowledged.push(messages.last().unwrap().clone());
                messages.push(got.json()["choices"][0]["message"].clone());
                if n == 5 {
                    // Leave almost no room.
                    let _ = Command::new("dd")
                        .args(["if=/dev/zero", "bs=64k"])
                        .arg(format!("of={}", filler.display()))
                        .output();
                }
            }
            503 => {
                assert_eq!(
                    got.json()["error"]["type"],
                    "storage_error",
                    "{}",
                    got.text()
                );
                messages.pop();
                refused += 1;
                if refused == 3 {
                    break;
                }
            }
            other => panic!("unexpected {other}: {}", got.text()),
        }
    }
    assert_eq!(refused, 3, "the full disk was noticed");
    proxy.assert_verified(&[]);
    std::fs::remove_file(&filler).unwrap();
    messages.push(json!({"role": "user", "content": "after the disk was freed"}));
    let got = post_chat(
        &proxy,
        &[("x-handoff-conversation-id", "full")],
        &json!({"model": "gpt-4o", "messages": messages}),
    )
    .await;
    assert_eq!(
        got.status,
        200,
        "served again without a restart: {}",
        got.text()
    );
    acknowledged.push(messages.last().unwrap().clone());
    proxy.assert_kept("full", &acknowledged);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_reset_mid_stream_cuts_the_clients_stream_and_the_log_stays_valid() {
    let mock = MockUpstream::replying(
        Reply::chat_stream(&["Hel", "lo", " there", "!"], Duration::from_millis(20)).cut_at(2),
    )
    .await;
    let proxy = Proxy::start(&mock.url());
    let mut body = small_chat();
    body["stream"] = json!(true);
    let streamed = client::stream(
        request(
            "POST",
            &format!("{}/v1/chat/completions", proxy.url()),
            &[
                ("content-type", "application/json"),
                ("x-handoff-conversation-id", "reset"),
            ],
            body.to_string(),
        ),
        None,
    )
    .await;
    assert!(
        streamed.error.is_some(),
        "the client sees a cut, not a clean end"
    );
    assert!(!streamed.text().contains("[DONE]"));
    proxy.assert_verified(&[]);
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_held_streams_keep_memory_bounded() {
    let deltas: Vec<String> = (0..40).map(|i| format!("d{i} ")).collect();
    let deltas: Vec<&str> = deltas.iter().map(String::as_str).collect();
    let mock =
        MockUpstream::replying(Reply::chat_stream(&deltas, Duration::from_millis(100))).await;
    let proxy = Proxy::start_with(
        &mock.url(),
        ProxyOptions {
            rust_log: "info".into(),
            ..ProxyOptions::default()
        },
    );
    // One request first: the tokenizer tables load once, whatever the load.
    let warm = post_chat(&proxy, &[], &small_chat()).await;
    assert_eq!(warm.status, 200);
    let before = rss_kib(proxy.pid());
    let mut tasks = Vec::new();
    for n in 0..500 {
        let url = proxy.url();
        tasks.push(tokio::spawn(async move {
            let body = json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": format!("stream {n}")}]});
            client::stream(
                request("POST", &format!("{url}/v1/chat/completions"), &[("content-type", "application/json")], body.to_string()),
                None,
            )
            .await
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let held = rss_kib(proxy.pid());
    let mut complete = 0;
    for task in tasks {
        let streamed = task.await.unwrap();
        if streamed.error.is_none() && streamed.text().contains("[DONE]") {
            complete += 1;
        }
    }
    assert_eq!(complete, 500, "every stream completes");
    eprintln!(
        "RSS with 500 streams held: +{} KiB over idle",
        held - before
    );
    // 500 streams in flight cost tens of KB each, not megabytes.
    assert!(
        held - before < 100 * 1024,
        "RSS grew {} MB with 500 streams held",
        (held - before) / 1024
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn audit_in_a_pipeline_stops_quietly_when_the_reader_leaves() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Proxy::start(&mock.url());
    let got = post_chat(&proxy, &[], &small_chat()).await;
    assert_eq!(got.status, 200);
    // `handoff audit list | head -0`: the reader is gone before the first line.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_handoff"))
        .args(["audit", "list", "--config"])
        .arg(proxy.config_path())
        .stdout(writer)
        .output()
        .unwrap();
    assert!(out.status.success(), "{:?}", out.status);
    assert!(
        out.stderr.is_empty(),
        "no 'Broken pipe' message: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
