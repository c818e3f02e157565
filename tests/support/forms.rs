//! A client that re-sends what a model wrote in another form: the model writes
//! tool-call arguments with spaces (`{"command": "ls"}`), the client parses them and
//! sends them back compact (`{"command":"ls"}`), as opencode does. Each message is
//! written here byte for byte, so a test knows exactly what the client sent.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mock_upstream::{MockUpstream, Reply};
use serde_json::{json, Value};

use super::client::{self, request};

/// A model that answers every request with one tool call whose arguments have spaces.
pub async fn spaced_tool_caller() -> MockUpstream {
    let serial = Arc::new(AtomicUsize::new(0));
    MockUpstream::with(move |_| {
        let n = serial.fetch_add(1, Ordering::SeqCst);
        Reply::json(json!({
            "id": format!("chatcmpl-{n}"), "object": "chat.completion", "created": 1, "model": "m",
            "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                "role": "assistant", "content": "",
                "tool_calls": [{"id": format!("call_{n}"), "type": "function", "function": {
                    "name": "bash", "arguments": format!("{{\"command\": \"ls -la {n}\", \"n\": {n}}}")}}]}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        }))
    })
    .await
}

/// Sends `messages` (each one's bytes as given) to conversation `id` at `base`, and
/// appends the reply's tool call re-serialised compact, and its result.
pub async fn turn(base: &str, id: &str, messages: &mut Vec<String>) {
    let body = format!(r#"{{"model":"m","messages":[{}]}}"#, messages.join(","));
    let got = client::send(request(
        "POST",
        &format!("{base}/v1/chat/completions"),
        &[
            ("content-type", "application/json"),
            ("x-handoff-conversation-id", id),
        ],
        body,
    ))
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let call = &got.json()["choices"][0]["message"]["tool_calls"][0];
    let arguments: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    messages.push(format!(
        r#"{{"role":"assistant","content":null,"tool_calls":[{{"id":{},"type":"function","function":{{"name":"bash","arguments":{}}}}}]}}"#,
        call["id"],
        Value::String(arguments.to_string())
    ));
    messages.push(format!(
        r#"{{"role":"tool","tool_call_id":{},"content":"a.rs b.rs"}}"#,
        call["id"]
    ));
}
