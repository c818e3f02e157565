//! The window is the only hard limit. The trigger says when to compact; the input
//! budget (window − reserved output) says what may be sent. A view over the trigger
//! but within the budget is sent; a huge tool result is shortened in the view
//! (rescue); only what no view can fit gets handoff's 400, naming both limits. On the
//! in-process harness: none of it needs a process.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use mock_upstream::strict::{text_tokens, Strict};
use mock_upstream::MockUpstream;
use serde_json::{json, Value};

use super::compaction::agent_requests;
use crate::base::line::Entry;
use crate::testing::{Answer, Harness};

/// The strict model with a `window`-token window, on the embedded defaults.
async fn proxy(mock: &MockUpstream, window: u64) -> Harness {
    let models = format!("[models.\"strict\"]\ncontext_window = {window}\n");
    Harness::start(&mock.url(), &models).await
}

async fn chat(proxy: &Harness, id: &str, messages: &[Value]) -> Answer {
    proxy.chat(id, "strict", messages).await
}

/// Text of about `tokens` tokens (the mock's o200k count), opening with `label`.
fn text_of(label: &str, tokens: u64) -> String {
    let mut words = vec![label.to_owned()];
    let mut i = 0;
    while text_tokens(&words.join(" ")) < tokens {
        words.extend((0..50).map(|k| format!("w{}", i * 50 + k)));
        i += 1;
    }
    words.join(" ")
}

fn tool_turn(id: &str, result: String) -> [Value; 2] {
    [
        json!({"role": "assistant", "content": null, "tool_calls": [{"id": id, "type": "function", "function": {"name": "read", "arguments": "{}"}}]}),
        json!({"role": "tool", "tool_call_id": id, "content": result}),
    ]
}

async fn strict(window: u64, scale: f64) -> (Arc<Strict>, MockUpstream) {
    let strict = Strict::scaled(window, scale);
    let responder = Arc::clone(&strict);
    let mock = MockUpstream::with(move |request| responder.answer(request)).await;
    (strict, mock)
}

#[tokio::test]
async fn a_newest_unit_between_the_trigger_and_the_budget_is_sent_whole() {
    // 8192 window, 819 reserved: input budget 7373, compaction at 0.9 of it (6635).
    let (strict, mock) = strict(8192, 1.0).await;
    let proxy = proxy(&mock, 8192).await;
    let mut messages = Vec::new();
    for i in 0..3 {
        messages.push(json!({"role": "user", "content": text_of(&format!("FACT-{i:03}"), 300)}));
        messages.push(json!({"role": "assistant", "content": format!("noted {i}")}));
    }
    messages.push(json!({"role": "user", "content": "read the big file"}));
    let big = text_of("BIG", 6700);
    messages.extend(tool_turn("c1", big.clone()));
    let got = chat(&proxy, "between", &messages).await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(
        proxy.records("between").await.len(),
        1,
        "what precedes it was compacted"
    );
    let sent = agent_requests(&mock).pop().unwrap();
    let last = sent["messages"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last["content"],
        big.as_str(),
        "the newest unit is sent whole"
    );
    assert!(strict.over_window.lock().unwrap().is_empty());
    // Sent because it fits the input budget, not on a guess that it might.
    let log = proxy.log("between").await;
    let over = log.lines.iter().rev().find_map(|line| match &line.entry {
        Entry::Decision(decision) => Some(decision.over.clone()),
        _ => None,
    });
    assert_eq!(over, Some(Some("newest_unit".to_owned())));
}

#[tokio::test]
async fn user_text_over_the_budget_gets_a_400_naming_both_limits() {
    let (_strict, mock) = strict(8192, 1.0).await;
    let proxy = proxy(&mock, 8192).await;
    // Calibrate first, on a message large enough that overheads do not skew the ratio,
    // so the count is no guess.
    let hello = [json!({"role": "user", "content": text_of("HELLO", 2000)})];
    assert_eq!(chat(&proxy, "calibrated", &hello).await.status, 200);
    let mut messages = hello.to_vec();
    messages.push(json!({"role": "assistant", "content": "hi"}));
    messages.push(json!({"role": "user", "content": text_of("HUGE", 7600)}));
    let before = mock.requests().len();
    let got = chat(&proxy, "calibrated", &messages).await;
    assert_eq!(got.status, 400, "{}", got.text());
    let message = got.json()["error"]["message"].as_str().unwrap().to_owned();
    assert!(
        message.contains("newest unit")
            && message.contains("input budget of 7373")
            && message.contains("8192 window")
            && message.contains("compacts at 6635"),
        "{message}"
    );
    assert_eq!(mock.requests().len(), before, "nothing went upstream");

    // A client reserve that leaves no room: the 400 gives the reserve too.
    messages.pop();
    messages.push(json!({"role": "user", "content": text_of("MID", 2000)}));
    let reserved = proxy
        .post(
            "/v1/chat/completions",
            &[("x-handoff-conversation-id", "calibrated")],
            json!({"model": "strict", "max_tokens": 7000, "messages": messages})
                .to_string()
                .as_bytes(),
        )
        .await;
    assert_eq!(reserved.status, 400, "{}", reserved.text());
    let message = reserved.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        message.contains("7000 reserved output") && message.contains("input budget of 1192"),
        "{message}"
    );
    assert_eq!(mock.requests().len(), before, "nothing went upstream");
}

/// An agent whose model counts `scale` × tiktoken, with 20 KB tool results: 20 turns,
/// the first uncalibrated, and every one answered.
async fn agent_with_big_results(scale: f64) {
    let (strict, mock) = strict(32_768, scale).await;
    let proxy = proxy(&mock, 32_768).await;
    let id = format!("scaled-{scale}");
    let mut messages = vec![json!({"role": "user", "content": "read every log, one per turn"})];
    for turn in 0..20 {
        let result = format!(
            "FACT-{turn:03} {}",
            "log line with numbers 12 34 56\n".repeat(660)
        );
        messages.extend(tool_turn(&format!("c{turn}"), result));
        let got = chat(&proxy, &id, &messages).await;
        assert_eq!(got.status, 200, "turn {turn} at {scale}×: {}", got.text());
    }
    assert!(proxy.records(&id).await.len() >= 2);
    assert!(strict.broken_pairs.lock().unwrap().is_empty());
    // The model may refuse a view sized on a guess; each refusal was recovered.
    let refused = strict.over_window.lock().unwrap().len();
    assert!(refused <= 2, "{refused} refusals at {scale}×");
}

#[tokio::test]
async fn an_agent_on_a_model_that_counts_more_or_less_is_never_refused() {
    agent_with_big_results(1.5).await;
    agent_with_big_results(0.7).await;
}

/// aider's own history summary: a system message and one ~60 KB user message, no
/// `max_tokens`, to a model that counts ~0.77× tiktoken. One unit the model can take:
/// sent, first request or not, never refused on handoff's higher count.
#[tokio::test]
async fn one_big_message_the_model_can_take_is_sent() {
    let (strict, mock) = strict(24_576, 0.77).await;
    let proxy = proxy(&mock, 24_576).await;
    let messages = [
        json!({"role": "system", "content": "Briefly summarize this partial conversation."}),
        json!({"role": "user", "content": text_of("HISTORY", 23_000)}),
    ];
    for id in ["summary-1", "summary-2"] {
        let got = chat(&proxy, id, &messages).await;
        assert_eq!(got.status, 200, "{}", got.text());
    }
    assert!(strict.over_window.lock().unwrap().is_empty());
}
