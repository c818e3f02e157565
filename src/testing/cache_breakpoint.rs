//! The breakpoint handoff puts after the handoff pair on Anthropic, against the
//! caching provider of [`super::cost`]: placed only beside the client's own marks and
//! within the API's four, and what it buys: a client that edits its recent part (as
//! Claude Code's microcompact clears old tool results) still reads the pinned messages
//! and the pair from the cache.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use serde_json::{json, Value};

use super::cost::{filler, provider, Agent, WINDOW};
use crate::testing::Harness;
use mock_upstream::cache::CacheStyle;

/// The conversation's id, sent as the header.
const ID: &str = "marks";

/// The agent's model, with the window the cost benchmark uses.
fn models() -> String {
    format!("[models.\"claude-sonnet-4-5\"]\ncontext_window = {WINDOW}\n")
}

/// Sends `body` as the agent would.
async fn post(proxy: &Harness, path: &str, body: &Value) -> (u16, Value) {
    let headers = [
        (crate::base::id::CONVERSATION_HEADER, ID),
        ("x-api-key", "sk-marks"),
        ("anthropic-version", "2023-06-01"),
    ];
    let got = proxy
        .post(path, &headers, body.to_string().as_bytes())
        .await;
    (got.status.as_u16(), got.json())
}

/// Breakpoints in `body`, wherever they sit.
fn marks(body: &Value) -> usize {
    match body {
        Value::Object(fields) => {
            usize::from(fields.get("cache_control").is_some_and(|c| !c.is_null()))
                + fields.values().map(marks).sum::<usize>()
        }
        Value::Array(items) => items.iter().map(marks).sum(),
        _ => 0,
    }
}

/// Turns of the agent, each body passed through `dress` (which may add marks), until
/// the provider has seen two views built on a compaction.
async fn until_compacted(
    proxy: &Harness,
    mock: &mock_upstream::MockUpstream,
    agent: &mut Agent,
    dress: impl Fn(Value) -> Value,
) {
    let mut after = 0;
    for turn in 0..40 {
        agent
            .messages
            .push(agent.user(format!("FACT-U{turn:03} {}", filler(turn, 40))));
        for _ in 0..2 {
            let body = dress(agent.body(&agent.messages));
            let (status, reply) = post(proxy, agent.path(), &body).await;
            assert_eq!(status, 200, "turn {turn}: {reply}");
            let (message, call) = agent.answer(&reply);
            agent.messages.push(message);
            // The first message of a compacted view is the pair's, not the client's.
            let first = last_sent(mock)["messages"][0].to_string();
            if !first.contains("FACT-U000") {
                after += 1;
                if after == 2 {
                    return;
                }
            }
            let Some(id) = call else { break };
            let result = format!("FACT-T{turn:03} {}", filler(turn + 50, 2000));
            agent.messages.push(agent.tool_result(&id, result));
        }
    }
    panic!("no compacted view in 40 turns");
}

/// What an assertion shows of a body: each message's role and marks.
fn outline(body: &Value) -> String {
    let list = body["messages"].as_array().cloned().unwrap_or_default();
    let messages: Vec<String> = list
        .iter()
        .map(|m| format!("{}:{}", m["role"].as_str().unwrap_or("?"), marks(m)))
        .collect();
    format!(
        "tools {}, system {}, messages [{}]",
        marks(&body["tools"]),
        marks(&body["system"]),
        messages.join(" ")
    )
}

/// The last agent request the provider saw (summary calls aside).
fn last_sent(mock: &mock_upstream::MockUpstream) -> Value {
    mock.requests()
        .iter()
        .rev()
        .map(|r| r.json())
        .find(|body| !mock_upstream::strict::is_summary(body))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_breakpoint_after_the_pair_keeps_it_cached_when_the_client_edits_its_recent_part() {
    let (mock, cache) = provider(CacheStyle::Breakpoints, WINDOW).await;
    let proxy = Harness::start(&mock.url(), &models()).await;
    let mut agent = Agent::new(CacheStyle::Breakpoints);
    until_compacted(&proxy, &mock, &mut agent, |body| body).await;
    let sent = last_sent(&mock);
    // The client's two (system, newest block) and handoff's, after the pair: the
    // continuation, then the handoff.
    assert_eq!(marks(&sent), 3, "{}", outline(&sent));
    let handoff = &sent["messages"][1];
    assert_eq!(handoff["role"], "assistant", "{}", outline(&sent));
    let blocks = handoff["content"].as_array().unwrap();
    assert_eq!(blocks.last().unwrap()["cache_control"]["type"], "ephemeral");
    let handoff_text = blocks.last().unwrap()["text"].as_str().unwrap().to_owned();
    let record = (proxy.records(ID).await.into_iter())
        .find(|r| handoff_plugin_api::content_text(&r.handoff) == handoff_text)
        .expect("the record of the handoff sent");
    // The record keeps the pair as written: the mark is the request's.
    assert!(record.handoff.get("cache_control").is_none() && marks(&record.handoff) == 0);

    // The client clears the oldest tool result of its recent part, then goes on.
    let in_view = sent.to_string();
    let cleared = agent
        .messages
        .iter()
        .position(|m| {
            m["content"][0]["type"] == "tool_result"
                && in_view.contains(m["content"][0]["tool_use_id"].as_str().unwrap())
        })
        .expect("a tool result in the recent part");
    agent.messages[cleared]["content"][0]["content"] = json!("[Old tool result content cleared]");
    let last = agent.messages.last().unwrap().clone();
    let pending = last["content"]
        .as_array()
        .and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_use"));
    let next = match pending {
        Some(call) => agent.tool_result(call["id"].as_str().unwrap(), "done".into()),
        None => agent.user("And now?".into()),
    };
    agent.messages.push(next);
    let (status, reply) = post(&proxy, agent.path(), &agent.body(&agent.messages)).await;
    assert_eq!(status, 200, "{reply}");
    let edited = last_sent(&mock);
    let bill = cache.bills().last().unwrap().billed;
    // Read from the cache: everything through the handoff pair.
    let mut through_pair = edited.clone();
    through_pair["messages"].as_array_mut().unwrap().truncate(2);
    let pair_tokens = mock_upstream::anthropic::count(&through_pair);
    let mut unmarked = through_pair.clone();
    unmarked["messages"] = json!([]);
    let system_tokens = mock_upstream::anthropic::count(&unmarked);
    // Without the mark, the client's own would read the system prompt and tools alone:
    // the edit changed every prefix after it, and no entry ended at the pair.
    assert!(
        bill.cache_read * 100 >= pair_tokens * 97 && bill.cache_read > system_tokens + 1_000,
        "read {} of the {pair_tokens} tokens through the pair ({system_tokens} before it): {bill:?}",
        bill.cache_read
    );
    assert!(cache.refused().is_empty(), "{:?}", cache.refused());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_breakpoint_is_added_for_a_client_that_does_not_cache_or_uses_all_four() {
    for (client_marks, dress) in [
        (0, strip as fn(Value) -> Value),
        (4, four_marks as fn(Value) -> Value),
    ] {
        let (mock, cache) = provider(CacheStyle::Breakpoints, WINDOW).await;
        let proxy = Harness::start(&mock.url(), &models()).await;
        let mut agent = Agent::new(CacheStyle::Breakpoints);
        until_compacted(&proxy, &mock, &mut agent, dress).await;
        let sent = last_sent(&mock);
        assert_eq!(marks(&sent), client_marks, "{}", outline(&sent));
        assert!(cache.refused().is_empty(), "{:?}", cache.refused());
    }
}

/// The body with no breakpoint at all.
fn strip(mut body: Value) -> Value {
    fn unmark(value: &mut Value) {
        match value {
            Value::Object(fields) => {
                fields.remove("cache_control");
                fields.values_mut().for_each(unmark);
            }
            Value::Array(items) => items.iter_mut().for_each(unmark),
            _ => {}
        }
    }
    unmark(&mut body);
    body
}

/// The body with four breakpoints: the agent's two, and two on the first tools.
fn four_marks(mut body: Value) -> Value {
    for tool in body["tools"].as_array_mut().unwrap().iter_mut().take(2) {
        tool["cache_control"] = json!({"type": "ephemeral"});
    }
    body
}
