//! A scripted agent: a user turn gets a tool call, a tool result gets a text answer.
//! It answers streamed or not, as the request asks, so long tool-calling
//! conversations can be driven through the proxy with any client.

use std::time::Duration;

use serde_json::{json, Value};

use crate::reply::{chat_stream_frames, Reply};
use crate::Recorded;

/// How the scripted agent writes its tool calls.
#[derive(Debug, Clone, Copy, Default)]
pub struct AgentStyle {
    /// Arguments as Python's `json.dumps` writes them, `{"query": "…"}`, as many
    /// models do; otherwise compact.
    pub spaced_arguments: bool,
    /// Streamed tool calls open with `"content": ""` (vLLM, llama.cpp) rather than `null`.
    pub empty_text: bool,
    /// Answers after a tool result are a short line, not an echo of the result, so the
    /// tool's facts live in the tool messages only.
    pub brief_answers: bool,
}

/// The next agent step for `request`; `serial` makes ids and texts unique.
pub fn agent_reply(request: &Recorded, serial: usize) -> Reply {
    agent_reply_as(request, serial, AgentStyle::default())
}

/// [`agent_reply`] with tool calls written in `style`.
pub fn agent_reply_as(request: &Recorded, serial: usize, style: AgentStyle) -> Reply {
    let body = request.json();
    let stream = body["stream"] == true;
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    if last["role"] == "tool" {
        let text = if style.brief_answers {
            format!("answer {serial}: the record is noted")
        } else {
            format!(
                "answer {serial} after {}",
                last["content"].as_str().unwrap_or("")
            )
        };
        return if stream {
            let half = text.len() / 2;
            Reply::Sse {
                frames: chat_stream_frames(&[&text[..half], &text[half..]]),
                gap: Duration::ZERO,
                cut_after: None,
            }
        } else {
            Reply::chat_text(&text)
        };
    }
    let id = format!("call_{serial}");
    let question = last["content"].as_str().unwrap_or("").to_owned();
    let mut arguments = json!({"query": question}).to_string();
    if style.spaced_arguments {
        arguments = arguments.replacen("\":", "\": ", 1);
    }
    if stream {
        let mut frames = tool_call_frames(&id, "lookup", &arguments);
        if style.empty_text {
            frames[0] = frames[0].replace("\"content\":null", "\"content\":\"\"");
        }
        Reply::Sse {
            frames,
            gap: Duration::ZERO,
            cut_after: None,
        }
    } else {
        Reply::json(json!({
            "id": "chatcmpl-agent",
            "object": "chat.completion",
            "created": 1_700_000_000,
            "model": "mock-model",
            "choices": [{
                "index": 0,
                "message": {"role": "assistant", "content": null, "tool_calls": [
                    {"id": id, "type": "function", "function": {"name": "lookup", "arguments": arguments}}
                ]},
                "finish_reason": "tool_calls"
            }],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        }))
    }
}

/// SSE frames of one streamed tool call, its arguments split in two deltas.
pub fn tool_call_frames(id: &str, name: &str, arguments: &str) -> Vec<String> {
    let frame = |delta: Value, finish: Value| {
        let body = json!({
            "id": "chatcmpl-agent", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": "mock-model", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        });
        format!("data: {body}\n\n")
    };
    let half = arguments.len() / 2;
    vec![
        frame(json!({"role": "assistant", "content": null}), Value::Null),
        frame(
            json!({"tool_calls": [{"index": 0, "id": id, "type": "function", "function": {"name": name, "arguments": &arguments[..half]}}]}),
            Value::Null,
        ),
        frame(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": &arguments[half..]}}]}),
            Value::Null,
        ),
        frame(json!({}), json!("tool_calls")),
        "data: [DONE]\n\n".to_owned(),
    ]
}
