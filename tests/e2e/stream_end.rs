//! A streamed reply ends where its final event ends: however many chunks that event
//! spans, and whatever follows it in the same chunk. Checked with a raw client (the
//! exact bytes) and with the official SDKs (what they parse), for every dialect.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use crate::support::client::{self, request};
use crate::support::scenario::run_client;
use crate::support::{access_lines, message_lines, Proxy};
use mock_upstream::{
    anthropic, chat_stream_frames, gemini, responses, MockUpstream, Recorded, Reply,
};
use serde_json::{json, Value};

/// What the mock sends after the final event, in the same chunk: never the client's.
const TRAILING: &str = "event: ping\ndata: {\"type\":\"ping\"}\n\n";

/// A dialect's whole stream, and where its final event starts; a Responses final
/// event echoes `tools` tools of ~500 bytes each.
fn stream_of(dialect: &str, tools: usize) -> (String, usize) {
    let events = match dialect {
        "chat" => {
            let mut frames = chat_stream_frames(&["Hel", "lo"]);
            let usage = json!({"id": "chatcmpl-mock", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
                "usage": {"prompt_tokens": 77, "completion_tokens": 2, "total_tokens": 79}});
            frames.insert(frames.len() - 1, format!("data: {usage}\n\n"));
            frames
        }
        "responses" => {
            // The final event echoes the tools, as the real API does: ~20 KB.
            let tools: Vec<Value> = (0..tools)
                .map(|i| json!({"type": "function", "name": format!("tool_{i}"), "description": "d".repeat(480), "parameters": {"type": "object"}}))
                .collect();
            let response = json!({"id": "resp_split", "object": "response", "created_at": 1, "model": "gpt-mock",
                "status": "completed", "tools": tools,
                "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                            "content": [{"type": "output_text", "text": "Hello", "annotations": []}]}],
                "usage": {"input_tokens": 77, "output_tokens": 2, "total_tokens": 79,
                          "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}}});
            responses::stream_events(&response)
        }
        "gemini" => {
            let parts = [json!({"text": "Hel"}), json!({"text": "lo"})];
            let mut chunks = gemini::chunks("gemini-mock", &parts, 77, 1);
            // The final event carries usage and the finish reason, and more text.
            if let Some(last) = chunks.last_mut() {
                last["usageMetadata"]["promptTokenCount"] = json!(77);
            }
            gemini::sse_events(&chunks)
        }
        _ => anthropic::stream_events(
            "claude-mock",
            &[json!({"type": "text", "text": "Hello"})],
            "end_turn",
            77,
        ),
    };
    let last = events.last().map_or(0, String::len);
    let whole: String = events.concat();
    let final_at = whole.len() - last;
    (whole, final_at)
}

/// The offset a request asks the stream to be split at ("split N").
fn requested_split(request: &Recorded) -> usize {
    let body = request.json();
    let text = body["messages"][0]["content"]
        .as_str()
        .or_else(|| body["input"].as_str())
        .or_else(|| body["contents"][0]["parts"][0]["text"].as_str())
        .unwrap_or("split 0")
        .to_owned();
    text.trim_start_matches("split ").parse().unwrap_or(0)
}

async fn splitting_mock(dialect: &'static str, tools: usize) -> MockUpstream {
    MockUpstream::with(move |request| {
        let (whole, _) = stream_of(dialect, tools);
        let at = requested_split(request).min(whole.len());
        let (head, tail) = whole.split_at(at);
        Reply::Sse {
            frames: vec![head.to_owned(), format!("{tail}{TRAILING}")],
            gap: Duration::from_millis(2),
            cut_after: None,
        }
    })
    .await
}

/// Every offset from just before the final event to the end of the stream.
fn offsets(dialect: &str, tools: usize) -> Vec<usize> {
    let (whole, final_at) = stream_of(dialect, tools);
    (final_at.saturating_sub(3)..=whole.len()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_gets_exactly_the_reply_and_the_log_its_usage() {
    for (dialect, path) in [
        ("chat", "/v1/chat/completions"),
        ("responses", "/v1/responses"),
        ("anthropic", "/v1/messages"),
        (
            "gemini",
            "/v1beta/models/gemini-mock:streamGenerateContent?alt=sse",
        ),
    ] {
        let mock = splitting_mock(dialect, 40).await;
        let proxy = Proxy::start(&mock.url());
        let (whole, final_at) = stream_of(dialect, 40);
        let split = final_at + 5;
        let body = match dialect {
            "responses" => {
                json!({"model": "gpt-mock", "stream": true, "input": format!("split {split}")})
            }
            "gemini" => {
                json!({"contents": [{"role": "user", "parts": [{"text": format!("split {split}")}]}]})
            }
            _ => {
                json!({"model": "m", "max_tokens": 64, "stream": true, "messages": [{"role": "user", "content": format!("split {split}")}]})
            }
        };
        let id = format!("split-{dialect}");
        let streamed = client::stream(
            request(
                "POST",
                &format!("{}{path}", proxy.url()),
                &[
                    ("content-type", "application/json"),
                    ("x-handoff-conversation-id", &id),
                ],
                body.to_string(),
            ),
            None,
        )
        .await;
        assert_eq!(streamed.status, 200, "{dialect}");
        assert!(streamed.error.is_none(), "{dialect}: {:?}", streamed.error);
        assert_eq!(
            streamed.text(),
            whole,
            "{dialect}: the client gets the whole final event and nothing after it"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let reply = loop {
            let lines = message_lines(&proxy, &id);
            if let Some(reply) = lines.into_iter().find(|l| l["source"] == "upstream") {
                break reply;
            }
            assert!(std::time::Instant::now() < deadline, "{dialect}: no reply");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert_eq!(reply["complete"], true, "{dialect}: {reply}");
        let input = reply["usage"]["input_tokens"]
            .as_u64()
            .or_else(|| reply["usage"]["prompt_tokens"].as_u64())
            .or_else(|| reply["usage"]["promptTokenCount"].as_u64());
        assert_eq!(
            input,
            Some(77),
            "{dialect}: usage read from the stream: {reply}"
        );
        // The access line is written once the body is over: wait for it.
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        let access = loop {
            if let Some(line) = access_lines(&proxy).into_iter().find(|l| l.contains(&id)) {
                break line;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{dialect}: no access line"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(access.contains("outcome=\"complete\""), "{access}");
        assert!(
            access.contains(&format!("bytes={}", whole.len())),
            "{dialect}: the access log counts what the client got: {access}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_official_sdks_read_final_events_split_at_every_offset() {
    for dialect in ["chat", "responses", "anthropic"] {
        // One tool: a final event of ~1.4 KB, split at every one of its offsets.
        let mock = splitting_mock(dialect, 1).await;
        let proxy = Proxy::start(&mock.url());
        let offsets = offsets(dialect, 1);
        let args: Vec<String> = std::iter::once(dialect.to_owned())
            .chain(offsets.iter().map(usize::to_string))
            .collect();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let seen = run_client(&proxy, "final_event_splits.py", &args).await;
        let seen = seen.as_array().unwrap();
        assert_eq!(seen.len(), offsets.len(), "{dialect}");
        for read in seen {
            assert_eq!(read["text"], "Hello", "{dialect}: {read}");
            assert_eq!(read["usage"], 77, "{dialect}: {read}");
        }
    }
}

/// `@google/genai`'s own stream reader, through handoff, with the final event split at
/// each of its offsets and an event after it that is not the client's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_genai_sdk_reads_gemini_s_final_event_split_at_every_offset() {
    let mock = splitting_mock("gemini", 1).await;
    let proxy = Proxy::start(&mock.url());
    let offsets = offsets("gemini", 1);
    let args: Vec<String> = offsets.iter().map(usize::to_string).collect();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let seen = run_client(&proxy, "genai_final_event_splits.mjs", &args).await;
    let seen = seen.as_array().unwrap();
    assert_eq!(seen.len(), offsets.len());
    for read in seen {
        assert_eq!(read["text"], "Hello", "{read}");
        assert_eq!(read["usage"], 77, "{read}");
        assert_eq!(read["finish"], "STOP", "{read}");
    }
    // Every request was tracked, and every reply logged whole.
    let replies = mock.requests().len();
    assert_eq!(replies, offsets.len());
}
