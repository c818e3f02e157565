//! The asks on create handoff serves where the upstream lacks them, on the in-process
//! harness, against strict upstreams without context management (the fields are extra
//! inputs, the items and blocks unknown tags): the Responses `context_management`
//! compaction, the Messages `compact_20260112` (streamed, paused), and the clearing
//! edits Claude Code sends. Every turn is served, the compaction comes first in the
//! reply as the API documents it, and no ask, block or handle reaches the upstream.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use mock_upstream::anthropic::StrictAnthropic;
use mock_upstream::responses::StrictResponses;
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

use crate::audit::summarize;
use crate::dialect::{DialectKind, HANDLE_PREFIX};
use crate::testing::{Answer, Harness};

const MESSAGES: &str = "/v1/messages";

fn config(native: &str, model: &str, window: u64) -> String {
    format!("[upstream]\nnative_compaction = \"{native}\"\n[models.\"{model}\"]\ncontext_window = {window}\ntokenizer = \"estimate\"\n[compaction]\nprepare_at = 0\n")
}

/// The events of a streamed answer, as JSON.
fn events(got: &Answer) -> Vec<Value> {
    (got.text().lines())
        .filter_map(|line| line.strip_prefix("data: "))
        .filter_map(|data| serde_json::from_str(data).ok())
        .collect()
}

/// A Messages answer as the SDK assembles it, streamed or not.
fn message_of(got: &Answer, stream: bool) -> Value {
    if !stream {
        return got.json();
    }
    let events = events(got);
    let mut assembler = DialectKind::Anthropic.get().stream_reply();
    for event in &events {
        assembler.push("", &event.to_string());
    }
    let assembled = assembler.finish();
    let mut message: Value = serde_json::from_str(assembled.replies[0].message.get()).unwrap();
    let delta = events
        .iter()
        .rev()
        .find(|e| e["type"] == "message_delta")
        .unwrap();
    message["stop_reason"] = delta["delta"]["stop_reason"].clone();
    message["usage"] = delta["usage"].clone();
    message["context_management"] = delta["context_management"].clone();
    message
}

async fn without_anthropic_native() -> (Arc<StrictAnthropic>, MockUpstream) {
    let strict = StrictAnthropic::new(400_000);
    strict.set_native(false);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| responder.answer(request)).await;
    (strict, mock)
}

async fn post_messages(proxy: &Harness, body: &Value, beta: &str) -> Answer {
    let headers = [
        ("x-api-key", "sk-ant-served"),
        ("anthropic-version", "2023-06-01"),
        ("anthropic-beta", beta),
    ];
    proxy
        .post(MESSAGES, &headers, body.to_string().as_bytes())
        .await
}

/// A Messages agent session, planting a fact a turn in 15,000 tokens of filler, its
/// every request asking `context_management`; the assistant's replies are kept as
/// the SDK keeps them. The replies that carried a compaction block, and the last.
async fn messages_session(
    proxy: &Harness,
    edits: &Value,
    stream: bool,
    turns: usize,
) -> (Vec<Value>, Vec<Value>) {
    let filler = "lorem ipsum ".repeat(5_000);
    let mut messages: Vec<Value> = Vec::new();
    let mut compacted = Vec::new();
    let mut last = Value::Null;
    let beta = "compact-2026-01-12,context-management-2025-06-27";
    for turn in 0..turns {
        messages.push(json!({"role": "user", "content": format!("FACT-{turn:03} {filler}")}));
        loop {
            let body = json!({"model": "claude-mock", "max_tokens": 1000, "stream": stream,
                              "messages": messages, "context_management": edits});
            let got = post_messages(proxy, &body, beta).await;
            assert_eq!(got.status, 200, "{}", got.text());
            let reply = message_of(&got, stream);
            let content = reply["content"].as_array().unwrap().clone();
            if content.first().is_some_and(|b| b["type"] == "compaction") {
                compacted.push(reply.clone());
            }
            messages.push(json!({"role": "assistant", "content": content}));
            last = reply.clone();
            match reply["stop_reason"].as_str() {
                Some("tool_use") => {
                    let id =
                        content.iter().find(|b| b["type"] == "tool_use").unwrap()["id"].clone();
                    messages.push(json!({"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": id, "content": "found"}]}));
                }
                // Paused after the compaction: sent again to go on.
                Some("compaction") => {}
                _ => break,
            }
        }
    }
    compacted.push(last);
    (compacted, messages)
}

/// What went upstream: no ask, no compaction block, no handle, no served beta flag.
fn nothing_asked_upstream(mock: &MockUpstream, strict: &StrictAnthropic, refused: usize) {
    let sent = mock.requests();
    let after: Vec<_> = sent.iter().skip(refused).collect();
    assert!(after.iter().all(|r| {
        let body = r.json();
        body.get("context_management").is_none()
            && !body.to_string().contains(HANDLE_PREFIX)
            && !body["messages"].to_string().contains("\"compaction\"")
    }));
    let betas = strict.betas.lock().unwrap().clone();
    assert!(
        betas
            .iter()
            .skip(refused)
            .all(|b| !b.contains("compact-") && !b.contains("context-management-")),
        "{betas:?}"
    );
}

#[tokio::test]
async fn a_compaction_edit_is_served_first_in_the_reply_streamed_or_not() {
    for stream in [false, true] {
        let (strict, mock) = without_anthropic_native().await;
        let proxy = Harness::start(&mock.url(), &config("auto", "claude-mock", 400_000)).await;
        let edits = json!({"edits": [{"type": "compact_20260112",
            "trigger": {"type": "input_tokens", "value": 50_000}}]});
        let (compacted, _) = messages_session(&proxy, &edits, stream, 6).await;
        // The upstream refused the first ask, once: handoff serves them from then on.
        let refused = strict.refused.lock().unwrap().clone();
        assert_eq!(refused.len(), 1, "{refused:?}");
        assert!(refused[0].contains("context_management"), "{refused:?}");
        // Past the trigger, the reply opened with the compaction block: the handoff's
        // text readable, the handle sealed, the iterations reported.
        assert!(compacted.len() >= 2, "{} compactions", compacted.len() - 1);
        let first = &compacted[0];
        let block = &first["content"][0];
        assert!(
            block["content"].as_str().unwrap().contains("FACT-000"),
            "{block}"
        );
        assert!(block["encrypted_content"]
            .as_str()
            .unwrap()
            .starts_with(HANDLE_PREFIX));
        let iterations = first["usage"]["iterations"].as_array().unwrap();
        assert_eq!(iterations[0]["type"], "compaction");
        assert!(
            iterations[0]["input_tokens"].as_u64().unwrap() > 0,
            "{iterations:?}"
        );
        assert_eq!(iterations[1]["type"], "message");
        assert_eq!(
            first["content"][1]["type"], "text",
            "the reply goes on after the block"
        );
        // The model read every planted fact, and never a handle or an ask.
        nothing_asked_upstream(&mock, &strict, 1);
        let sent = mock.requests();
        let read = sent.last().unwrap().json()["messages"].to_string();
        for fact in 0..6 {
            assert!(
                read.contains(&format!("FACT-{fact:03}")),
                "FACT-{fact:03} lost"
            );
        }
        // One conversation, one branch.
        let ids = proxy.conversations().await;
        assert_eq!(ids.len(), 1, "{ids:?}");
        let log = proxy.log(ids[0].as_str()).await;
        assert_eq!(summarize(&ids[0], &log).branches, 1);
    }
}

#[tokio::test]
async fn a_paused_compaction_answers_the_block_alone_and_the_next_request_goes_on() {
    let (strict, mock) = without_anthropic_native().await;
    let proxy = Harness::start(&mock.url(), &config("serve", "claude-mock", 400_000)).await;
    let edits = json!({"edits": [{"type": "compact_20260112", "pause_after_compaction": true,
        "trigger": {"type": "input_tokens", "value": 50_000}}]});
    let (compacted, messages) = messages_session(&proxy, &edits, true, 5).await;
    let paused = &compacted[0];
    assert_eq!(paused["stop_reason"], "compaction");
    assert_eq!(paused["content"].as_array().map(Vec::len), Some(1));
    assert!(
        strict.refused.lock().unwrap().is_empty(),
        "served: nothing refused"
    );
    nothing_asked_upstream(&mock, &strict, 0);
    // The list the client holds has the block alone in an assistant message; what
    // the model read after it starts with the handoff and ends with the last fact.
    assert!(messages.iter().any(|m| m["content"]
        .as_array()
        .is_some_and(|c| c.len() == 1 && c[0]["type"] == "compaction")));
    let read = mock.requests().last().unwrap().json()["messages"].to_string();
    assert!(
        read.contains("FACT-000") && read.contains("FACT-004"),
        "{read}"
    );
    // The on-demand compaction: one block, stopped for it, nothing upstream.
    let before = mock.requests().len();
    let body = json!({"model": "claude-mock", "max_tokens": 1000, "messages": messages,
                      "compaction": {"instructions": "keep the facts"}});
    let got = post_messages(&proxy, &body, "compact-2026-09-04").await;
    assert_eq!(got.status, 200, "{}", got.text());
    let answer = got.json();
    assert_eq!(answer["stop_reason"], "compaction");
    assert_eq!(answer["content"][0]["type"], "compaction");
    assert!(mock.requests()[before..]
        .iter()
        .all(mock_upstream_is_summary));
}

fn mock_upstream_is_summary(request: &mock_upstream::Recorded) -> bool {
    mock_upstream::strict::is_summary(&request.json())
}

#[tokio::test]
async fn edits_are_checked_as_the_api_checks_them_and_refused_in_its_shape() {
    let (_strict, mock) = without_anthropic_native().await;
    let proxy = Harness::start(&mock.url(), &config("serve", "claude-mock", 400_000)).await;
    for edits in [
        json!({"edits": [{"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": 1000}}]}),
        json!({"edits": [{"type": "clear_everything_20990101"}]}),
        json!({"edits": [{"type": "clear_tool_uses_20250919", "keep": {"type": "tool_uses", "value": "three"}}]}),
    ] {
        let body = json!({"model": "claude-mock", "max_tokens": 100, "context_management": edits,
                          "messages": [{"role": "user", "content": "hi"}]});
        let got = post_messages(&proxy, &body, "context-management-2025-06-27").await;
        assert_eq!(got.status, 400, "{}", got.text());
        let error = got.json();
        assert_eq!(error["type"], "error", "{error}");
        assert_eq!(error["error"]["type"], "invalid_request_error", "{error}");
        assert!(
            error["error"]["message"]
                .as_str()
                .unwrap()
                .contains("context_management.edits.0"),
            "{error}"
        );
    }
    // A forged handle in a compaction block is refused the same way, naming it.
    let forged = format!("{HANDLE_PREFIX}e30.AAAA");
    let body = json!({"model": "claude-mock", "max_tokens": 100, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "compaction", "content": "all of it", "encrypted_content": forged}]},
        {"role": "user", "content": "go on"}]});
    let got = post_messages(&proxy, &body, "compact-2026-01-12").await;
    assert_eq!(got.status, 400, "{}", got.text());
    let error = got.json();
    assert_eq!(error["type"], "error", "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("messages.1"),
        "{error}"
    );
    assert!(mock.requests().is_empty(), "nothing went upstream");
}

#[tokio::test]
async fn claude_codes_thinking_edit_is_taken_off_and_tool_uses_are_cleared() {
    let (strict, mock) = without_anthropic_native().await;
    let proxy = Harness::start(&mock.url(), &config("auto", "claude-mock", 400_000)).await;
    // Claude Code with thinking on: `keep: "all"`, nothing to apply, the field to go.
    let keep_all = json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]});
    let mut messages = vec![json!({"role": "user", "content": "list the files"})];
    let mut applied = Vec::new();
    for turn in 0..8 {
        let edits = if turn < 3 {
            keep_all.clone()
        } else {
            json!({"edits": [{"type": "clear_tool_uses_20250919",
                "trigger": {"type": "tool_uses", "value": 1}, "keep": {"type": "tool_uses", "value": 1}}]})
        };
        let body = json!({"model": "claude-mock", "max_tokens": 2000, "stream": turn % 2 == 1,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "context_management": edits, "messages": messages});
        let got = post_messages(
            &proxy,
            &body,
            "context-management-2025-06-27,interleaved-thinking-2025-05-14",
        )
        .await;
        assert_eq!(got.status, 200, "{}", got.text());
        let reply = message_of(&got, turn % 2 == 1);
        if let Some(edits) = reply["context_management"]["applied_edits"].as_array() {
            applied.extend(edits.iter().cloned());
        }
        let content = reply["content"].as_array().unwrap().clone();
        let id = content
            .iter()
            .find(|b| b["type"] == "tool_use")
            .map(|b| b["id"].clone());
        messages.push(json!({"role": "assistant", "content": content}));
        match id {
            Some(id) => {
                messages.push(json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": format!("file-{turn}.rs")}]}))
            }
            None => messages.push(json!({"role": "user", "content": format!("and step {turn}?")})),
        }
    }
    // Refused once (auto learns), then every request served; the other beta flag kept.
    assert_eq!(strict.refused.lock().unwrap().len(), 1);
    nothing_asked_upstream(&mock, &strict, 1);
    let betas = strict.betas.lock().unwrap().clone();
    assert!(
        betas
            .iter()
            .skip(1)
            .all(|b| b == "interleaved-thinking-2025-05-14"),
        "{betas:?}"
    );
    // The clearing edit was applied to what the model read, and reported.
    assert!(
        applied
            .iter()
            .any(|e| e["type"] == "clear_tool_uses_20250919"
                && e["cleared_tool_uses"].as_u64() >= Some(1)),
        "{applied:?}"
    );
    let read = mock.requests().last().unwrap().json()["messages"].to_string();
    assert!(read.contains(crate::native::asks::CLEARED), "{read}");
    // The record keeps what the client sent: the results in full.
    let ids = proxy.conversations().await;
    let log = proxy.log(ids[0].as_str()).await;
    assert!(format!("{:?}", log.lines).contains("file-0.rs"));
}

fn user_item(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

#[tokio::test]
async fn a_responses_context_management_compaction_comes_first_and_the_numbers_move_on() {
    for stream in [false, true] {
        let strict = StrictResponses::new(6000);
        strict.set_native(false);
        let responder = Arc::clone(&strict);
        let mock = MockUpstream::with(move |request| responder.answer(request)).await;
        let proxy = Harness::start(&mock.url(), &config("auto", "gpt-mock", 6000)).await;
        let filler: String = (0..300).map(|i| format!("w{i} ")).collect();
        let mut history: Vec<Value> = Vec::new();
        let mut compacted = None;
        for turn in 0..6 {
            history.push(user_item(&format!("FACT-{turn:03} {filler}")));
            let body = json!({"model": "gpt-mock", "input": history, "store": false, "stream": stream,
                              "context_management": [{"type": "compaction", "compact_threshold": 2000}]});
            let got = proxy
                .post(
                    "/v1/responses",
                    &[("authorization", "Bearer sk-served")],
                    body.to_string().as_bytes(),
                )
                .await;
            assert_eq!(got.status, 200, "{}", got.text());
            let output = if stream {
                let events = events(&got);
                let numbers: Vec<u64> = events
                    .iter()
                    .filter_map(|e| e["sequence_number"].as_u64())
                    .collect();
                assert!(numbers.windows(2).all(|w| w[1] == w[0] + 1), "{numbers:?}");
                let done: Vec<u64> = (events.iter())
                    .filter(|e| e["type"] == "response.output_item.done")
                    .filter_map(|e| e["output_index"].as_u64())
                    .collect();
                let completed = events
                    .iter()
                    .find(|e| e["type"] == "response.completed")
                    .unwrap();
                let output = completed["response"]["output"].as_array().unwrap().clone();
                assert_eq!(
                    done,
                    (0..output.len() as u64).collect::<Vec<_>>(),
                    "every item at its index"
                );
                output
            } else {
                got.json()["output"].as_array().unwrap().clone()
            };
            if output[0]["type"] == "compaction" {
                assert!(
                    output.len() >= 2,
                    "the reply goes on after the item: {output:?}"
                );
                compacted.get_or_insert(turn);
            }
            for item in output {
                let mut item = item;
                if let Some(fields) = item.as_object_mut() {
                    fields.remove("id");
                    fields.remove("status");
                }
                if item["type"] == "function_call" {
                    history.push(item.clone());
                    history.push(json!({"type": "function_call_output", "call_id": item["call_id"], "output": "ok"}));
                } else {
                    history.push(item);
                }
            }
        }
        assert!(
            compacted.is_some(),
            "past the threshold, a compaction was served"
        );
        let sent = mock.requests();
        assert!(sent.iter().skip(1).all(|r| {
            let body = r.json();
            body.get("context_management").is_none() && !body.to_string().contains(HANDLE_PREFIX)
        }));
        let read = sent.last().unwrap().json()["input"].to_string();
        for fact in 0..6 {
            assert!(
                read.contains(&format!("FACT-{fact:03}")),
                "FACT-{fact:03} lost: {read}"
            );
        }
        let ids = proxy.conversations().await;
        assert_eq!(ids.len(), 1, "{ids:?}");
        let log = proxy.log(ids[0].as_str()).await;
        assert_eq!(summarize(&ids[0], &log).branches, 1);
    }
}
