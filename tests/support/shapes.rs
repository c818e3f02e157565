//! Request bodies shaped to make the log write more than they hold, and a reply for
//! each wire format: the amplification probes of tests/e2e/attacks.rs and tests/postgres.rs.

use mock_upstream::Reply;

/// A chat body of `n` one-character user messages naming `model`.
pub fn tiny_messages(n: usize, model: &str) -> String {
    let messages: Vec<String> = (0..n)
        .map(|i| {
            format!(
                r#"{{"role":"user","content":"{}"}}"#,
                (b'a' + (i % 26) as u8) as char
            )
        })
        .collect();
    format!(
        r#"{{"model":"{model}","messages":[{}]}}"#,
        messages.join(",")
    )
}

/// Bodies shaped to make the log write more than they hold, as (path, body).
pub fn amplifying_bodies() -> Vec<(&'static str, &'static str, String)> {
    let tiny = |n: usize, role: &dyn Fn(usize) -> &'static str| -> String {
        (0..n)
            .map(|i| {
                let letter = (b'a' + (i % 26) as u8) as char;
                format!(r#"{{"role":"{}","content":"{letter}"}}"#, role(i))
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let alternate = |i: usize| {
        if i.is_multiple_of(2) {
            "user"
        } else {
            "assistant"
        }
    };
    vec![
        (
            "chat, 20,000 one-letter messages",
            "/v1/chat/completions",
            tiny_messages(20_000, "gpt-4o"),
        ),
        (
            "chat, an 8,000-character model",
            "/v1/chat/completions",
            tiny_messages(2_000, &"m".repeat(8_000)),
        ),
        (
            "chat, 19,999 one-letter system messages",
            "/v1/chat/completions",
            format!(
                r#"{{"model":"gpt-4o","messages":[{},{{"role":"user","content":"go"}}]}}"#,
                tiny(19_999, &|_| "system")
            ),
        ),
        (
            "Anthropic, 19,999 one-letter turns",
            "/v1/messages",
            format!(
                r#"{{"model":"claude-x","max_tokens":16,"messages":[{},{{"role":"user","content":"go"}}]}}"#,
                tiny(19_999, &alternate)
            ),
        ),
        (
            "Responses, 20,000 one-letter items",
            "/v1/responses",
            format!(
                r#"{{"model":"gpt-4o","store":false,"input":[{}]}}"#,
                tiny(20_000, &|_| "user")
            ),
        ),
    ]
}

/// Bodies that re-send a conversation's 1,999 one-letter turns in other whitespace,
/// with a reply and a new turn: every turn is a form of a logged message. As (shape,
/// path, the body first sent, the body measured).
pub fn reformed_bodies() -> Vec<(&'static str, &'static str, String, String)> {
    let turns = |spaced: bool| -> String {
        (0..1_999)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                let letter = (b'a' + (i % 26) as u8) as char;
                if spaced {
                    format!(r#"{{ "role": "{role}", "content": "{letter}" }}"#)
                } else {
                    format!(r#"{{"role":"{role}","content":"{letter}"}}"#)
                }
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let next = r#"{"role":"assistant","content":"ok"},{"role":"user","content":"go"}"#;
    let body = |head: &str, spaced: bool, more: &str| -> String {
        format!(r#"{{{head}"messages":[{}{more}]}}"#, turns(spaced))
    };
    let chat = r#""model":"gpt-4o","#;
    let anthropic = r#""model":"claude-x","max_tokens":16,"#;
    vec![
        (
            "chat, 1,999 one-letter turns re-sent in other whitespace",
            "/v1/chat/completions",
            body(chat, false, ""),
            body(chat, true, &format!(",{next}")),
        ),
        (
            "Anthropic, 1,999 one-letter turns re-sent in other whitespace",
            "/v1/messages",
            body(anthropic, false, ""),
            body(anthropic, true, &format!(",{next}")),
        ),
    ]
}

/// A reply in the wire format of `path`.
pub fn reply_for(path: &str) -> Reply {
    match path {
        "/v1/messages" => Reply::json(serde_json::json!({
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
            "content": [{"type": "text", "text": "fine"}],
            "stop_reason": "end_turn", "usage": {"input_tokens": 5, "output_tokens": 1}
        })),
        "/v1/responses" => Reply::json(serde_json::json!({
            "id": "resp_1", "object": "response", "status": "completed", "model": "gpt-4o",
            "output": [{"type": "message", "id": "msg_1", "status": "completed", "role": "assistant",
                        "content": [{"type": "output_text", "text": "fine", "annotations": []}]}],
            "usage": {"input_tokens": 5, "output_tokens": 1, "total_tokens": 6}
        })),
        _ => Reply::chat_text("fine"),
    }
}
