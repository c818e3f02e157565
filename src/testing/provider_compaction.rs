//! The providers' own compaction through handoff, on the in-process harness: items sent
//! back in the forms real clients use continue their branch, a request that asks the
//! provider to compact is not compacted a second time (unless it would not fit), and a
//! provider's compaction artefact is never inside what handoff summarises.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::{Arc, Mutex};

use mock_upstream::{MockUpstream, Recorded, Reply};
use serde_json::{json, Value};

use crate::audit::summarize;
use crate::testing::Harness;

/// `gpt-mock` with a `window`-token window counted as bytes/4; summaries by itself.
fn config(window: u64) -> String {
    format!("[models.\"gpt-mock\"]\ncontext_window = {window}\ntokenizer = \"estimate\"\n[models.\"claude-mock\"]\ncontext_window = {window}\ntokenizer = \"estimate\"\n")
}

/// A provider that answers every request with `output` (Responses) or `content`
/// (Messages) and remembers the bodies it saw.
async fn provider(
    reply: impl Fn(&Value) -> Value + Send + Sync + 'static,
) -> (MockUpstream, Arc<Mutex<Vec<Value>>>) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&seen);
    let mock = MockUpstream::with(move |request: &Recorded| {
        let body = request.json();
        log.lock().unwrap().push(body.clone());
        Reply::json(reply(&body))
    })
    .await;
    (mock, seen)
}

/// A Responses reply of `output` items.
fn response(output: Value) -> Value {
    json!({"id": "resp_1", "object": "response", "status": "completed", "model": "gpt-mock",
           "output": output, "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}})
}

/// A Messages reply of `content` blocks.
fn message(content: Value) -> Value {
    json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-mock",
           "content": content, "stop_reason": "end_turn",
           "usage": {"input_tokens": 10, "output_tokens": 5}})
}

async fn post(proxy: &Harness, path: &str, id: &str, body: &Value) -> Value {
    let headers = [
        (crate::base::id::CONVERSATION_HEADER, id),
        ("authorization", "Bearer sk-native"),
        ("x-api-key", "sk-native"),
        ("anthropic-version", "2023-06-01"),
    ];
    let got = proxy
        .post(path, &headers, body.to_string().as_bytes())
        .await;
    assert_eq!(got.status.as_u16(), 200, "{}", got.text());
    got.json()
}

/// Branches of conversation `id`.
async fn branches(proxy: &Harness, id: &str) -> usize {
    let log = proxy.log(id).await;
    let id = proxy.conversation(id).await.unwrap();
    summarize(&id, &log).branches
}

#[tokio::test]
async fn items_sent_back_without_output_fields_or_with_a_clients_own_continue_the_branch() {
    let call = json!({"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "lookup",
                      "arguments": "{\"q\":\"x\"}", "status": "completed"});
    let answer = json!({"type": "message", "id": "msg_2", "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": "found it", "annotations": [], "logprobs": []}]});
    let replies = [call.clone(), answer.clone()];
    let turn = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let next = Arc::clone(&turn);
    let (mock, _) = provider(move |_| {
        let n = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        response(json!([replies[n.min(1)].clone()]))
    })
    .await;
    let proxy = Harness::start(&mock.url(), &config(100_000)).await;
    let user = json!({"type": "message", "role": "user", "content": "look x up"});
    post(
        &proxy,
        "/v1/responses",
        "echo",
        &json!({"model": "gpt-mock", "input": [user]}),
    )
    .await;
    // The Vercel AI SDK: the call without its id and status.
    let bare = json!({"type": "function_call", "call_id": "call_1", "name": "lookup", "arguments": "{\"q\":\"x\"}"});
    let output = json!({"type": "function_call_output", "call_id": "call_1", "output": "x=1"});
    post(
        &proxy,
        "/v1/responses",
        "echo",
        &json!({"model": "gpt-mock", "input": [user, bare, output]}),
    )
    .await;
    // Codex: the call and the answer with its own metadata on them, keys reordered.
    let mut codex_call = call.clone();
    codex_call["internal_chat_message_metadata_passthrough"] = json!({"turn_id": "t1"});
    let mut codex_answer = answer.clone();
    codex_answer["internal_chat_message_metadata_passthrough"] = json!({"turn_id": "t1"});
    let follow = json!({"type": "message", "role": "user", "content": "thanks"});
    let input = json!([user, codex_call, output, codex_answer, follow]);
    post(
        &proxy,
        "/v1/responses",
        "echo",
        &json!({"model": "gpt-mock", "input": input}),
    )
    .await;
    assert_eq!(branches(&proxy, "echo").await, 1);
    assert_eq!(proxy.conversations().await.len(), 1);
}

#[tokio::test]
async fn a_request_that_asks_the_provider_to_compact_is_not_compacted_twice() {
    let (mock, seen) = provider(|_| response(json!([
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]}]))).await;
    let proxy = Harness::start(&mock.url(), &config(4_000)).await;
    // About 3,300 tokens: over the trigger (0.9 of the budget), within the window.
    let mut input: Vec<Value> = (0..6)
        .flat_map(|n| {
            [
                json!({"type": "message", "role": "user", "content": format!("FACT-{n} {}", "word ".repeat(420))}),
                json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "noted"}]}),
            ]
        })
        .collect();
    input.push(json!({"type": "message", "role": "user", "content": "go on"}));
    let body = json!({"model": "gpt-mock", "input": input,
                      "context_management": [{"type": "compaction", "compact_threshold": 3000}]});
    post(&proxy, "/v1/responses", "native", &body).await;
    settle().await;
    let sent = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(sent["input"], body["input"], "sent as the client sent it");
    assert!(
        proxy.records("native").await.is_empty(),
        "no compaction of handoff's"
    );
    let log = proxy.log("native").await;
    let decision = log
        .lines
        .iter()
        .find_map(|l| match &l.entry {
            crate::base::line::Entry::Decision(d) => Some(d.clone()),
            _ => None,
        })
        .unwrap();
    assert_eq!(decision.over.as_deref(), Some("provider_compacts"));
    assert_eq!(seen.lock().unwrap().len(), 1, "no summary call");

    // Without context_management, the same request is handoff's to compact (it fits
    // the input budget, so it goes on while the compaction runs).
    let plain = json!({"model": "gpt-mock", "input": input});
    post(&proxy, "/v1/responses", "plain", &plain).await;
    assert_eq!(records_soon(&proxy, "plain").await, 1);
}

#[tokio::test]
async fn an_anthropic_request_with_a_compact_edit_is_not_compacted_twice() {
    let (mock, seen) = provider(|_| message(json!([{"type": "text", "text": "ok"}]))).await;
    let proxy = Harness::start(&mock.url(), &config(4_000)).await;
    let mut messages: Vec<Value> = (0..6)
        .flat_map(|n| {
            [
                json!({"role": "user", "content": format!("FACT-{n} {}", "word ".repeat(440))}),
                json!({"role": "assistant", "content": "noted"}),
            ]
        })
        .collect();
    messages.push(json!({"role": "user", "content": "go on"}));
    let body = json!({"model": "claude-mock", "max_tokens": 400, "messages": messages,
                      "context_management": {"edits": [{"type": "compact_20260112",
                          "trigger": {"type": "input_tokens", "value": 3000}}]}});
    post(&proxy, "/v1/messages", "native-messages", &body).await;
    settle().await;
    let sent = seen.lock().unwrap().last().cloned().unwrap();
    assert_eq!(
        sent["messages"], body["messages"],
        "sent as the client sent it"
    );
    assert_eq!(seen.lock().unwrap().len(), 1, "no summary call");
    assert!(proxy.records("native-messages").await.is_empty());
    // Its request line keeps what it asked, so a replay asks the provider the same.
    let log = proxy.log("native-messages").await;
    let asked = (log.lines.iter())
        .find_map(|line| match &line.entry {
            crate::base::line::Entry::Request(request) => request.asked.clone(),
            _ => None,
        })
        .expect("the request line keeps what it asked");
    let kept: Value = serde_json::from_str(asked.context_management.unwrap().get()).unwrap();
    assert_eq!(kept, body["context_management"]);
    // Clearing tool uses is not compacting: that request is handoff's to compact.
    let mut clearing = body.clone();
    clearing["context_management"] = json!({"edits": [{"type": "clear_tool_uses_20250919"}]});
    post(&proxy, "/v1/messages", "clearing", &clearing).await;
    assert_eq!(records_soon(&proxy, "clearing").await, 1);
}

/// Time for a compaction started in the background, had one been, to call its
/// summariser and commit.
async fn settle() {
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
}

/// Conversation `id`'s records once one committed (a compaction that runs while its
/// request goes on), or none after a few seconds.
async fn records_soon(proxy: &Harness, id: &str) -> usize {
    for _ in 0..100 {
        let records = proxy.records(id).await.len();
        if records > 0 {
            return records;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    0
}

#[tokio::test]
async fn a_provider_compaction_item_is_never_inside_what_handoff_summarises() {
    let (mock, seen) = provider(|body| {
        let summary = mock_upstream::strict::is_summary(body);
        let text = if summary {
            "## Goal\nKeep going.\n## Completed work\nSome.\n## Pending work\nNone.\n## State in progress\nNone.\n## Files, commands and tests\nNone.\n## Key tool results\nNone.\n## User preferences and constraints\nNone.\n## Risks and next checks\nNone."
        } else {
            "ok"
        };
        response(json!([{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": text}]}]))
    })
    .await;
    let inline = format!("{}[compaction]\nprepare_at = 0\n", config(4_000));
    let proxy = Harness::start(&mock.url(), &inline).await;
    // Early turns, the provider's compaction item, and more turns after it than the
    // trigger allows: the provider counts from the item on.
    let turns = |from: usize, to: usize| -> Vec<Value> {
        (from..to)
            .flat_map(|n| {
                [
                    json!({"type": "message", "role": "user", "content": format!("FACT-{n} {}", "word ".repeat(300))}),
                    json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "noted"}]}),
                ]
            })
            .collect()
    };
    let compaction =
        json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAA-opaque-ENC"});
    let mut input = turns(0, 4);
    input.push(compaction.clone());
    input.extend(turns(4, 16));
    input.push(json!({"type": "message", "role": "user", "content": "go on"}));
    post(
        &proxy,
        "/v1/responses",
        "boundary",
        &json!({"model": "gpt-mock", "input": input}),
    )
    .await;
    let bodies = seen.lock().unwrap().clone();
    for body in bodies
        .iter()
        .filter(|b| mock_upstream::strict::is_summary(b))
    {
        let text = body.to_string();
        assert!(
            !text.contains("gAAAAA-opaque-ENC") && !text.contains("[compaction]"),
            "{text}"
        );
    }
    assert!(
        bodies.iter().any(mock_upstream::strict::is_summary),
        "compacted"
    );
    let sent = bodies
        .iter()
        .rev()
        .find(|b| !mock_upstream::strict::is_summary(b))
        .unwrap();
    let items = sent["input"].as_array().unwrap();
    assert!(
        items[1]["content"].to_string().contains("## Goal"),
        "the view opens with the handoff pair"
    );
    assert!(
        items.contains(&compaction),
        "the item keeps its bytes in the view"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_starts_from_the_providers_compaction_item_stays_in_its_conversation() {
    let compaction = json!({"type": "compaction", "id": "cmp_7", "encrypted_content": "gAAAAA-minted",
                            "created_by": "server"});
    let minted = compaction.clone();
    let (mock, _) = provider(move |_| {
        response(json!([minted.clone(),
            {"type": "message", "id": "msg_7", "role": "assistant", "status": "completed",
             "content": [{"type": "output_text", "text": "done", "annotations": []}]}]))
    })
    .await;
    let proxy = Harness::start(&mock.url(), &config(100_000)).await;
    // No conversation header: the conversation is named by its opening.
    let headers = [("authorization", "Bearer sk-native")];
    let first = json!({"model": "gpt-mock", "input": [
        {"type": "message", "role": "user", "content": "refactor the parser"}],
        "context_management": [{"type": "compaction", "compact_threshold": 50000}]});
    let got = proxy
        .post("/v1/responses", &headers, first.to_string().as_bytes())
        .await;
    assert_eq!(got.status.as_u16(), 200, "{}", got.text());
    // The client drops what came before the compaction item, as OpenAI's guide says,
    // and sends the item back without its output-only fields.
    let next = json!({"model": "gpt-mock", "input": [
        {"type": "compaction", "encrypted_content": "gAAAAA-minted"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
        {"type": "message", "role": "user", "content": "now the tests"}],
        "context_management": [{"type": "compaction", "compact_threshold": 50000}]});
    let got = proxy
        .post("/v1/responses", &headers, next.to_string().as_bytes())
        .await;
    assert_eq!(got.status.as_u16(), 200, "{}", got.text());
    let conversations = proxy.conversations().await;
    assert_eq!(conversations.len(), 1, "{conversations:?}");
    let id = conversations[0].clone();
    assert_eq!(
        branches(&proxy, id.as_str()).await,
        1,
        "it continues its branch"
    );
    // The record marks where the provider compacted: audit show, the timeline, the chart.
    let timeline = proxy.timeline(id.as_str()).await;
    let compacted: Vec<u64> = (timeline["chart"].as_array().unwrap().iter())
        .filter(|r| r["provider_compacted"] == true)
        .map(|r| r["number"].as_u64().unwrap())
        .collect();
    let messages: Vec<(Value, Value)> = (timeline["events"].as_array().unwrap().iter())
        .filter(|e| e["type"] == "message")
        .map(|e| (e["source"].clone(), e["provider_compaction"].clone()))
        .collect();
    assert_eq!(
        compacted,
        [1, 2],
        "each reply carried the item: {messages:?}"
    );
    let shown = proxy
        .audit(id.as_str(), |audit, id, tenant, out| {
            audit.show(id, Some(tenant), out)
        })
        .await;
    assert!(shown.matches("PROVIDER COMPACTION").count() >= 2, "{shown}");
    // An item no reply minted is another conversation.
    let forged = json!({"model": "gpt-mock", "input": [
        {"type": "compaction", "encrypted_content": "gAAAAA-forged"},
        {"type": "message", "role": "user", "content": "now the tests"}]});
    let got = proxy
        .post("/v1/responses", &headers, forged.to_string().as_bytes())
        .await;
    assert_eq!(got.status.as_u16(), 200, "{}", got.text());
    assert_eq!(proxy.conversations().await.len(), 2);
}

/// A Responses provider that compacts as the API documents `compaction_trigger`: one
/// `compaction` item minted per trigger, a message for anything else.
async fn compacting_provider() -> (MockUpstream, Arc<Mutex<Vec<Value>>>) {
    let minted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    provider(move |body| {
        let input = body["input"].as_array().cloned().unwrap_or_default();
        if input.last().is_some_and(|i| i["type"] == "compaction_trigger") {
            let n = minted.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
            return response(json!([{"type": "compaction", "id": format!("cmp_{n}"),
                "encrypted_content": format!("gAAAAA-sealed-{n}"), "created_by": "server"}]));
        }
        response(json!([{"type": "message", "id": format!("msg_{}", input.len()),
            "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": format!("answer {}", input.len()), "annotations": []}]}]))
    })
    .await
}

/// An output item as a client sends it back: without the fields only output has.
fn echoed(mut item: Value) -> Value {
    if let Some(fields) = item.as_object_mut() {
        for field in ["id", "status", "created_by"] {
            fields.remove(field);
        }
    }
    item
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_across_two_provider_compactions_is_one_branch_that_replays_as_sent() {
    let (mock, seen) = compacting_provider().await;
    let proxy = Harness::start(&mock.url(), &config(100_000)).await;
    let headers = [
        ("authorization", "Bearer sk-native"),
        ("x-codex-beta-features", "remote_compaction_v2"),
    ];
    let send = |input: Vec<Value>| {
        let body = json!({"model": "gpt-mock", "instructions": "You are Codex.",
            "input": input, "stream": false});
        let proxy = &proxy;
        async move {
            let got = proxy
                .post("/v1/responses", &headers, body.to_string().as_bytes())
                .await;
            assert_eq!(got.status.as_u16(), 200, "{}", got.text());
            got.json()["output"].as_array().unwrap().clone()
        }
    };
    // What Codex keeps across a compaction: its developer message and the user's prompt.
    let kept = vec![
        json!({"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "sandbox: workspace-write"}]}),
        json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": "fix the failing test"}]}),
    ];
    let user = |text: &str| json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]});
    let trigger = json!({"type": "compaction_trigger"});
    let mut history = kept.clone();
    for round in 0..2 {
        for turn in 0..2 {
            history.push(user(&format!("round {round} turn {turn}")));
            let output = send(history.clone()).await;
            history.extend(output.into_iter().map(echoed));
        }
        // The context is full: Codex asks the provider to compact, then starts again
        // from what it keeps and the one item the provider minted.
        let mut asking = history.clone();
        asking.push(trigger.clone());
        let output = send(asking).await;
        assert_eq!(output.len(), 1, "one compaction item: {output:?}");
        history = kept.clone();
        history.push(echoed(output[0].clone()));
    }
    history.push(user("and now the docs"));
    let output = send(history.clone()).await;
    assert_eq!(output.len(), 1);

    let conversations = proxy.conversations().await;
    assert_eq!(conversations.len(), 1, "{conversations:?}");
    let id = conversations[0].as_str().to_owned();
    assert_eq!(branches(&proxy, &id).await, 1, "one branch across both");
    // The upstream saw each request as the client sent it: nothing summarised,
    // nothing moved, the trigger last.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 7);
    assert_eq!(seen[6]["input"], json!(history));
    // The record replays the last request byte for byte, its reply after it.
    let replayed = proxy
        .audit(&id, |audit, id, tenant, out| {
            audit.replay(id, Some(tenant), None, None, out, &mut Vec::new())
        })
        .await;
    let replayed: Vec<Value> = serde_json::from_str(&replayed).unwrap();
    let mut expected = history.clone();
    expected.extend(output);
    assert_eq!(replayed, expected);
    // And each request before, as it was sent: the trigger last, as the client put it.
    let third = proxy
        .audit(&id, |audit, id, tenant, out| {
            audit.replay(id, Some(tenant), None, Some(3), out, &mut Vec::new())
        })
        .await;
    let third: Vec<Value> = serde_json::from_str(&third).unwrap();
    assert_eq!(
        &third[..third.len() - 1],
        seen[2]["input"].as_array().unwrap().as_slice()
    );
    let verified = proxy
        .audit(&id, |audit, id, tenant, out| {
            audit.verify(Some(id), Some(tenant), out)
        })
        .await;
    assert!(!verified.contains("problem"), "{verified}");
    let shown = proxy
        .audit(&id, |audit, id, tenant, out| {
            audit.show(id, Some(tenant), out)
        })
        .await;
    assert!(
        shown.matches("PROVIDER COMPACTION").count() >= 4,
        "each trigger and each item: {shown}"
    );
    assert!(
        shown.contains("asked the provider: x-codex-beta-features: remote_compaction_v2"),
        "the trigger's request line keeps the header that switched it on: {shown}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compact_call_is_logged_as_the_providers_compaction_and_the_next_request_continues_after_it(
) {
    // `/v1/responses/compact` answers with the input's user messages, re-serialised as
    // `message` items, and one compaction item; a create answers with a message.
    let mock = MockUpstream::with(|request: &Recorded| {
        let body = request.json();
        let input = body["input"].as_array().cloned().unwrap_or_default();
        if request.target.ends_with("/responses/compact") {
            let mut output: Vec<Value> = (input.iter())
                .filter(|i| i["role"] == "user")
                .map(|i| json!({"type": "message", "role": "user", "content": i["content"]}))
                .collect();
            output.push(json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAA-compact"}));
            return Reply::json(json!({"id": "resp_c", "object": "response.compaction", "created_at": 1,
                "output": output, "usage": {"input_tokens": 40, "output_tokens": 10, "total_tokens": 50}}));
        }
        Reply::json(response(json!([{"type": "message", "id": format!("msg_{}", input.len()),
            "role": "assistant", "status": "completed",
            "content": [{"type": "output_text", "text": format!("answer {}", input.len()), "annotations": []}]}])))
    })
    .await;
    let proxy = Harness::start(&mock.url(), &config(100_000)).await;
    let user = |text: &str| json!({"role": "user", "content": text});
    let first = vec![user("plan the migration")];
    let got = post(
        &proxy,
        "/v1/responses",
        "compacting",
        &json!({"model": "gpt-mock", "input": first}),
    )
    .await;
    let mut history = first.clone();
    history.extend(
        got["output"]
            .as_array()
            .unwrap()
            .iter()
            .cloned()
            .map(echoed),
    );
    history.push(user("and the rollback"));
    let compact = json!({"model": "gpt-mock", "input": history});
    let compacted = post(&proxy, "/v1/responses/compact", "compacting", &compact).await;
    assert_eq!(compacted["object"], "response.compaction");
    // The client carries the compacted window forward as the server returned it.
    let mut next: Vec<Value> = compacted["output"].as_array().unwrap().clone();
    next.push(user("go"));
    let got = post(
        &proxy,
        "/v1/responses",
        "compacting",
        &json!({"model": "gpt-mock", "input": next}),
    )
    .await;
    assert_eq!(got["object"], "response");

    let sent = mock.requests();
    assert_eq!(sent[1].target, "/v1/responses/compact");
    assert_eq!(
        sent[1].json()["input"],
        compact["input"],
        "sent to the endpoint as it came"
    );
    assert_eq!(sent.len(), 3, "no summary call");
    assert_eq!(proxy.conversations().await.len(), 1);
    assert_eq!(branches(&proxy, "compacting").await, 1);
    let shown = proxy
        .audit("compacting", |audit, id, tenant, out| {
            audit.show(id, Some(tenant), out)
        })
        .await;
    assert!(
        shown.contains("asked the provider: POST /v1/responses/compact"),
        "{shown}"
    );
    assert!(shown.contains("AFTER PROVIDER COMPACTION"), "{shown}");
    // Each request replays as sent, the compaction's answer after its own.
    for (number, input, output) in [(2, &history, &compacted), (3, &next, &got)] {
        let replayed = proxy
            .audit("compacting", move |audit, id, tenant, out| {
                audit.replay(id, Some(tenant), None, Some(number), out, &mut Vec::new())
            })
            .await;
        let replayed: Vec<Value> = serde_json::from_str(&replayed).unwrap();
        let mut expected = input.clone();
        expected.extend(output["output"].as_array().unwrap().iter().cloned());
        assert_eq!(replayed, expected, "request {number}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_the_providers_compaction_handoff_compacts_what_follows_the_item_kept_first() {
    let sealed = json!({"type": "compaction", "encrypted_content": "gAAAAA-once"});
    let minted = {
        let mut item = sealed.clone();
        item["id"] = json!("cmp_1");
        item
    };
    let mock = MockUpstream::with(move |request: &Recorded| {
        let body = request.json();
        if request.target.ends_with("/responses/compact") {
            return Reply::json(json!({"id": "resp_c", "object": "response.compaction", "created_at": 1,
                "output": [body["input"][0], minted],
                "usage": null}));
        }
        let text = if mock_upstream::strict::is_summary(&body) {
            "## Goal\nKeep going.\n## Completed work\nSome.\n## Pending work\nNone.\n## State in progress\nNone.\n## Files, commands and tests\nNone.\n## Key tool results\nNone.\n## User preferences and constraints\nNone.\n## Risks and next checks\nNone."
        } else {
            "noted"
        };
        // No usage: the counts stay handoff's own, uncalibrated.
        let mut reply = response(json!([{"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": text}]}]));
        reply["usage"] = Value::Null;
        Reply::json(reply)
    })
    .await;
    let inline = format!("{}[compaction]\nprepare_at = 0\n", config(4_000));
    let proxy = Harness::start(&mock.url(), &inline).await;
    let user = |n: usize| json!({"type": "message", "role": "user", "content": format!("FACT-{n} {}", "word ".repeat(300))});
    let noted = json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "noted"}]});
    post(
        &proxy,
        "/v1/responses",
        "after",
        &json!({"model": "gpt-mock", "input": [user(0)]}),
    )
    .await;
    // The client compacts once with the provider, then goes on without asking again.
    let compacted = post(
        &proxy,
        "/v1/responses/compact",
        "after",
        &json!({"model": "gpt-mock", "input": [user(0), noted.clone(), user(1)]}),
    )
    .await;
    let mut input: Vec<Value> = compacted["output"]
        .as_array()
        .unwrap()
        .iter()
        .cloned()
        .map(echoed)
        .collect();
    for n in 2..14 {
        input.push(user(n));
        input.push(noted.clone());
    }
    input.push(json!({"type": "message", "role": "user", "content": "go on"}));
    post(
        &proxy,
        "/v1/responses",
        "after",
        &json!({"model": "gpt-mock", "input": input}),
    )
    .await;
    let bodies: Vec<Value> = mock.requests().iter().map(Recorded::json).collect();
    let summaries: Vec<&Value> = bodies
        .iter()
        .filter(|b| mock_upstream::strict::is_summary(b))
        .collect();
    assert!(
        !summaries.is_empty(),
        "handoff compacted what followed the item"
    );
    for body in &summaries {
        assert!(!body.to_string().contains("gAAAAA-once"), "{body}");
    }
    let sent = bodies
        .iter()
        .rev()
        .find(|b| !mock_upstream::strict::is_summary(b))
        .unwrap();
    let items = sent["input"].as_array().unwrap();
    assert_eq!(
        items[..2],
        [user(0), sealed],
        "what the client kept, and the item, first"
    );
    assert!(
        items[3].to_string().contains("## Goal"),
        "then the handoff pair: {items:?}"
    );
    assert_eq!(branches(&proxy, "after").await, 1);
    let replayed = proxy
        .audit("after", |audit, id, tenant, out| {
            audit.replay(id, Some(tenant), None, None, out, &mut Vec::new())
        })
        .await;
    let replayed: Vec<Value> = serde_json::from_str(&replayed).unwrap();
    assert_eq!(
        replayed[..input.len()],
        input,
        "the record holds what the client sent"
    );
}
