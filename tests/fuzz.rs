//! Property-based fuzzing on stable Rust (proptest), seeded from the real tool-calling
//! conversations in tests/fixtures/conversations. Each target must never panic, and
//! where a round trip exists it must give back the same bytes.
//!
//! CI runs a bounded number of cases; `scripts/fuzz.sh CASES` runs as many as you like.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::OnceLock;

use bytes::Bytes;
use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use handoff::base::chunks::Chunks;
use handoff::base::line::{encode, Entry, Line, RequestLine};
use handoff::compaction::unit::split_into_units;
use handoff::dialect::{ChatRequest, DialectKind, Message};
use handoff::store::read_log_file;
use proptest::prelude::*;
use serde_json::{json, Value};

/// The conversations' messages and tools, loaded once.
fn conversations() -> &'static Vec<(Vec<Value>, Value)> {
    static LOADED: OnceLock<Vec<(Vec<Value>, Value)>> = OnceLock::new();
    LOADED.get_or_init(|| {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/conversations");
        let mut paths: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .collect();
        paths.sort();
        paths
            .iter()
            .map(|p| {
                let doc: Value = serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap();
                (
                    doc["messages"].as_array().unwrap().clone(),
                    doc["tools"].clone(),
                )
            })
            .collect()
    })
}

fn config() -> ProptestConfig {
    // PROPTEST_CASES overrides; CI keeps the default bounded.
    ProptestConfig {
        cases: std::env::var("PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(64),
        ..ProptestConfig::default()
    }
}

/// A window of a real conversation: (conversation, start, length).
fn window() -> impl Strategy<Value = Vec<Value>> {
    (0..conversations().len(), 0usize..64, 1usize..64).prop_map(|(c, start, len)| {
        let messages = &conversations()[c].0;
        let start = start % messages.len();
        let end = (start + len).min(messages.len());
        messages[start..end].to_vec()
    })
}

/// The conversation's messages in Anthropic's shape (text blocks, tool_use and
/// tool_result blocks), alternating roles.
fn anthropic_messages(messages: &[Value]) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for m in messages {
        let (role, blocks) = match m["role"].as_str() {
            Some("assistant") => {
                let mut blocks = Vec::new();
                if let Some(text) = m["content"].as_str().filter(|t| !t.is_empty()) {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    let input: Value = serde_json::from_str(
                        call["function"]["arguments"].as_str().unwrap_or("{}"),
                    )
                    .unwrap_or(json!({}));
                    blocks.push(json!({"type": "tool_use", "id": call["id"], "name": call["function"]["name"], "input": input}));
                }
                ("assistant", blocks)
            }
            Some("tool") => (
                "user",
                vec![
                    json!({"type": "tool_result", "tool_use_id": m["tool_call_id"], "content": m["content"]}),
                ],
            ),
            _ => (
                "user",
                vec![json!({"type": "text", "text": m["content"].as_str().unwrap_or("")})],
            ),
        };
        if blocks.is_empty() {
            continue;
        }
        match out.last_mut() {
            Some(last) if last["role"] == role => {
                last["content"].as_array_mut().unwrap().extend(blocks);
            }
            _ => out.push(json!({"role": role, "content": blocks})),
        }
    }
    out
}

/// The conversation's messages as Responses input items.
fn responses_items(messages: &[Value]) -> Vec<Value> {
    let mut out = Vec::new();
    for m in messages {
        match m["role"].as_str() {
            Some("assistant") => {
                if let Some(text) = m["content"].as_str().filter(|t| !t.is_empty()) {
                    out.push(json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}));
                }
                for call in m["tool_calls"].as_array().into_iter().flatten() {
                    out.push(json!({"type": "function_call", "call_id": call["id"], "name": call["function"]["name"], "arguments": call["function"]["arguments"]}));
                }
            }
            Some("tool") => out.push(
                json!({"type": "function_call_output", "call_id": m["tool_call_id"], "output": m["content"]}),
            ),
            _ => out.push(json!({"role": "user", "content": m["content"]})),
        }
    }
    out
}

/// The body in `dialect`'s shape, compact as serde writes it.
fn body_of(dialect: DialectKind, messages: &[Value], tools: &Value) -> Bytes {
    let body = match dialect {
        DialectKind::OpenAiChat => {
            json!({"model": "gpt-4o", "messages": messages, "tools": tools})
        }
        DialectKind::Anthropic => json!({
            "model": "claude-x", "max_tokens": 1024, "system": "be brief",
            "messages": anthropic_messages(messages),
        }),
        DialectKind::Responses => {
            json!({"model": "gpt-4o", "input": responses_items(messages), "store": false})
        }
        other => panic!("no fuzzed body for {other:?}"),
    };
    Bytes::from(serde_json::to_vec(&body).unwrap())
}

fn dialects() -> impl Strategy<Value = DialectKind> {
    prop_oneof![
        Just(DialectKind::OpenAiChat),
        Just(DialectKind::Anthropic),
        Just(DialectKind::Responses),
    ]
}

/// The body again from its parsed messages: the list spliced back from their raw bytes.
/// `body` in frames, cut at `cuts`.
fn framed(body: &Bytes, cuts: &[prop::sample::Index]) -> Chunks {
    let mut at: Vec<usize> = cuts.iter().map(|cut| cut.index(body.len() + 1)).collect();
    at.sort_unstable();
    let mut chunks = Chunks::default();
    let mut from = 0;
    for to in at.into_iter().chain(std::iter::once(body.len())) {
        chunks.push(body.slice(from..to));
        from = to;
    }
    chunks
}

fn rendered(dialect: DialectKind, body: &Bytes, request: &ChatRequest) -> Vec<u8> {
    let field = format!("\"{}\":", dialect.get().list_field());
    let at = body
        .windows(field.len())
        .position(|w| w == field.as_bytes())
        .unwrap()
        + field.len();
    // The array alone; more fields may follow it.
    let mut de = serde_json::Deserializer::from_slice(&body[at..]);
    let list: &serde_json::value::RawValue = serde::Deserialize::deserialize(&mut de).unwrap();
    let end = at + list.get().len();
    // Messages that stand for top-level fields (Anthropic's `system`) are not in the list.
    let listed: Vec<&[u8]> = request.messages[request.top_level..]
        .iter()
        .map(|m| m.raw.as_bytes())
        .collect();
    let mut out = body[..at].to_vec();
    out.push(b'[');
    out.extend_from_slice(&listed.join(&b','));
    out.push(b']');
    out.extend_from_slice(&body[end..]);
    out
}

proptest! {
    #![proptest_config(config())]

    /// Every dialect's parser reads real conversations and gives back the same bytes.
    #[test]
    fn parsers_round_trip_real_conversations(
        dialect in dialects(),
        messages in window(),
        c in 0usize..6,
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..4),
    ) {
        let tools = &conversations()[c % conversations().len()].1;
        let body = body_of(dialect, &messages, tools);
        // A window may open with a tool result or cut a call from its result: a clean
        // error is fine, a panic is not. The body arrives in frames cut anywhere.
        if let Ok(request) = dialect.get().parse_body(&framed(&body, &cuts)) {
            prop_assert_eq!(rendered(dialect, &body, &request), body.to_vec());
        }
    }

    /// Damaged bodies (bytes flipped, cut, or spliced) never panic a parser.
    #[test]
    fn parsers_survive_damaged_bodies(
        dialect in dialects(),
        messages in window(),
        cut in any::<prop::sample::Index>(),
        flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..8),
        flips_at in prop::collection::vec(any::<prop::sample::Index>(), 0..3),
    ) {
        let mut body = body_of(dialect, &messages, &Value::Null).to_vec();
        for (at, byte) in flips {
            let i = at.index(body.len());
            body[i] = byte;
        }
        body.truncate(cut.index(body.len() + 1));
        let _ = dialect.get().parse_body(&framed(&Bytes::from(body), &flips_at));
    }

    /// Units cover the messages in order, without gaps or overlaps.
    #[test]
    fn units_tile_any_message_sequence(messages in window()) {
        let body = body_of(DialectKind::OpenAiChat, &messages, &Value::Null);
        // Units are cut on what parses, checked or not.
        let parsed: Vec<Message> = match DialectKind::OpenAiChat.get().parse_body(&body.into()) {
            Ok(request) => request.messages,
            Err(_) => return Ok(()),
        };
        let units = split_into_units(&parsed);
        let mut next = 0;
        for unit in &units {
            prop_assert_eq!(unit.start, next);
            prop_assert!(unit.end > unit.start);
            next = unit.end;
        }
        prop_assert_eq!(next, parsed.len());
    }

    /// A log with a torn or damaged tail loses nothing before the damage.
    #[test]
    fn the_log_reader_keeps_every_whole_line(
        count in 1usize..40,
        cut in any::<prop::sample::Index>(),
        garbage in prop::collection::vec(any::<u8>(), 0..200),
    ) {
        let lines: Vec<Line> = (0..count)
            .map(|n| Line::now(Entry::Request(RequestLine {
                dialect: None,
                top_level: None,
                server_held: None,
                model: format!("model-{n}"),
                head: None,
                pinned: None,
                floated: Vec::new(),
                stream: n % 2 == 0,
                new_messages: n,
                forms: Vec::new(),
                inline_forms: Vec::new(),
                carried: None,
                hooks: None,
                asked: None,
            })))
            .collect();
        let bytes = encode(&lines).unwrap();
        let cut = cut.index(bytes.len() + 1);
        let mut damaged = bytes[..cut].to_vec();
        damaged.extend_from_slice(&garbage);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("messages.jsonl");
        std::fs::write(&path, &damaged).unwrap();
        let log = read_log_file(dir.path(), &path).unwrap();
        let whole = bytes[..cut].iter().filter(|b| **b == b'\n').count();
        // Garbage may complete a cut line into something unreadable, never into a line.
        prop_assert!(log.lines.len() >= whole, "{} of {} whole lines read", log.lines.len(), whole);
        for (read, written) in log.lines.iter().zip(&lines) {
            prop_assert_eq!(serde_json::to_value(read).unwrap(), serde_json::to_value(written).unwrap());
        }
    }

    /// A stream's reply is the same however its bytes are split into frames.
    #[test]
    fn stream_assembly_ignores_frame_boundaries(
        dialect in dialects(),
        text in "[ -~]{0,200}",
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let events: Vec<String> = match dialect {
            DialectKind::OpenAiChat => {
                let deltas: Vec<String> = text.as_bytes().chunks(7).map(|c| String::from_utf8_lossy(c).into_owned()).collect();
                let deltas: Vec<&str> = deltas.iter().map(String::as_str).collect();
                mock_upstream::chat_stream_frames(&deltas)
            }
            DialectKind::Anthropic => mock_upstream::anthropic::stream_events(
                "claude-x", &[json!({"type": "text", "text": text})], "end_turn", 10,
            ),
            DialectKind::Responses => mock_upstream::responses::stream_events(&json!({
                "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-4o",
                "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                            "content": [{"type": "output_text", "text": text, "annotations": []}]}],
                "usage": {"input_tokens": 3, "output_tokens": 4, "total_tokens": 7},
            })),
            other => panic!("no fuzzed stream for {other:?}"),
        };
        let stream: Vec<u8> = events.concat().into_bytes();
        let mut points: Vec<usize> = cuts.iter().map(|c| c.index(stream.len() + 1)).collect();
        points.sort_unstable();
        points.dedup();
        let mut frames = Vec::new();
        let mut from = 0;
        for at in points.into_iter().chain([stream.len()]) {
            frames.push(Bytes::copy_from_slice(&stream[from..at]));
            from = at;
        }
        let whole = assemble(dialect, vec![Bytes::from(stream.clone())]);
        let split = assemble(dialect, frames);
        prop_assert_eq!(split, whole);
    }
}

/// The replies a dialect assembles from `frames`, as JSON for comparison.
fn assemble(dialect: DialectKind, frames: Vec<Bytes>) -> Vec<String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut reply = dialect.get().stream_reply();
        let mut events = std::pin::pin!(futures_util::stream::iter(
            frames.into_iter().map(Ok::<_, std::convert::Infallible>)
        )
        .eventsource());
        while let Some(Ok(event)) = events.next().await {
            reply.push(&event.event, &event.data);
        }
        let assembled = reply.finish();
        assembled
            .replies
            .iter()
            .map(|r| r.message.get().to_owned())
            .collect()
    })
}

#[test]
fn the_seeds_parse_in_every_dialect() {
    // The round-trip property is vacuous if windows never parse: whole conversations must.
    for (messages, tools) in conversations() {
        for dialect in [
            DialectKind::OpenAiChat,
            DialectKind::Anthropic,
            DialectKind::Responses,
        ] {
            let body = body_of(dialect, messages, tools);
            let request = dialect
                .get()
                .parse_body(&body.clone().into())
                .unwrap_or_else(|err| panic!("{dialect:?}: {err}"));
            assert!(!request.messages.is_empty());
            assert_eq!(rendered(dialect, &body, &request), body.to_vec());
        }
    }
}
