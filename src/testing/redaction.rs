//! Hooks wherever text reaches a model, on the in-process harness: a `redact` hook
//! sees every block that carries text (documents, search results, MCP outputs,
//! code-execution results), under every spelling a provider's parser accepts
//! (Gemini's snake_case), and what it takes out reaches neither the upstream nor the
//! log.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use mock_upstream::{chat_completion, MockUpstream, Reply};
use serde_json::{json, Value};

use crate::base::id::CONVERSATION_HEADER;
use crate::testing::Harness;

const EMAIL: &str = "ana.lopez@example.org";
const KEY: &str = "sk-proj-ABCDEFGHIJKLMNOPQRSTUVWX0123";

const REDACT: &str = "[middleware]\nchain = [\"secrets\"]\n\
    [middleware.hooks.secrets]\nkind = \"redact\"\ndetectors = [\"api_keys\", \"emails\"]\n";

/// An upstream that answers each API in its own shape.
async fn every_api() -> MockUpstream {
    MockUpstream::with(|request| {
        let path = request.target.split('?').next().unwrap_or("");
        if path.ends_with("/v1/messages") {
            Reply::json(json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                "content": [{"type": "text", "text": "ok"}], "stop_reason": "end_turn",
                "stop_sequence": null, "usage": {"input_tokens": 9, "output_tokens": 1}}))
        } else if path.ends_with("/v1/responses") {
            Reply::json(json!({"id": "resp_1", "object": "response", "status": "completed", "model": "m",
                "output": [{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
                    "content": [{"type": "output_text", "text": "ok", "annotations": []}]}],
                "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}}))
        } else if path.contains(":generateContent") {
            Reply::json(mock_upstream::gemini::whole(
                "gemini-x",
                &[json!({"text": "ok"})],
                9,
                0,
            ))
        } else {
            Reply::json(chat_completion("ok"))
        }
    })
    .await
}

fn assert_clean(what: &str, text: &str) {
    for secret in [EMAIL, KEY] {
        assert!(!text.contains(secret), "{secret} reached {what}: {text}");
    }
}

#[tokio::test]
async fn every_block_and_spelling_that_carries_text_is_redacted() {
    let mock = every_api().await;
    let proxy = Harness::start(&mock.url(), REDACT).await;
    let secret = format!("key {KEY}, mail {EMAIL}");
    let cases: Vec<(&str, Value)> = vec![
        // Gemini's snake_case system instruction and function response.
        (
            "/v1beta/models/gemini-x:generateContent",
            json!({"system_instruction": {"parts": [{"text": secret}]},
                   "contents": [{"role": "user", "parts": [{"text": "hi"}]}]}),
        ),
        (
            "/v1beta/models/gemini-x:generateContent",
            json!({"contents": [
                {"role": "user", "parts": [{"text": "read it"}]},
                {"role": "model", "parts": [{"function_call": {"name": "read", "args": {}}}]},
                {"role": "user", "parts": [{"function_response": {"name": "read", "response": {"output": secret}}}]}]}),
        ),
        // Gemini's code-execution result.
        (
            "/v1beta/models/gemini-x:generateContent",
            json!({"contents": [
                {"role": "user", "parts": [{"text": "run it"}]},
                {"role": "model", "parts": [{"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": secret}}]},
                {"role": "user", "parts": [{"text": "and?"}]}]}),
        ),
        // Anthropic's document and search result blocks.
        (
            "/v1/messages",
            json!({"model": "claude-x", "max_tokens": 10, "messages": [{"role": "user", "content": [
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": secret}},
                {"type": "search_result", "source": "https://x", "title": "t", "content": [{"type": "text", "text": secret}]},
                {"type": "text", "text": "summarise"}]}]}),
        ),
        // A Responses MCP call's output.
        (
            "/v1/responses",
            json!({"model": "gpt-x", "input": [
                {"role": "user", "content": "look it up"},
                {"type": "mcp_call", "id": "mcp_1", "server_label": "s", "name": "lookup", "arguments": "{}", "output": secret},
                {"role": "user", "content": "and?"}]}),
        ),
    ];
    for (n, (path, body)) in cases.iter().enumerate() {
        let id = format!("everywhere-{n}");
        let got = proxy
            .post(
                path,
                &[
                    (CONVERSATION_HEADER, &id),
                    ("authorization", "Bearer sk-client-hooks"),
                    ("x-api-key", "sk-client-hooks"),
                    ("x-goog-api-key", "sk-client-hooks"),
                ],
                body.to_string().as_bytes(),
            )
            .await;
        assert_eq!(got.status, 200, "{path} {body}: {}", got.text());
        let sent = mock.requests().pop().unwrap().json().to_string();
        assert_clean(&format!("the upstream ({path} {body})"), &sent);
        assert!(sent.contains("[redacted:"), "{sent}");
        let logged = crate::base::line::encode(&proxy.log(&id).await.lines).unwrap();
        assert_clean(
            &format!("the log of {id}"),
            &String::from_utf8_lossy(&logged),
        );
    }
}
