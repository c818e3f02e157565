//! What the mock answers, and builders for OpenAI-shaped replies.

use std::time::Duration;

use http::StatusCode;
use serde_json::{json, Value};

/// One answer of the mock.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A JSON body with a status.
    Json {
        /// HTTP status.
        status: StatusCode,
        /// The body.
        body: Value,
    },
    /// A JSON body pretty-printed, as several providers answer: newlines and
    /// indentation between its tokens.
    Pretty {
        /// HTTP status.
        status: StatusCode,
        /// The body.
        body: Value,
    },
    /// An SSE stream: each string is sent as one frame, `gap` apart.
    Sse {
        /// Raw frames, e.g. `"data: {...}\n\n"`.
        frames: Vec<String>,
        /// Pause between frames.
        gap: Duration,
        /// Break the connection instead of sending this frame index.
        cut_after: Option<usize>,
    },
    /// Wait, then answer.
    Delayed {
        /// How long to wait before the head.
        delay: Duration,
        /// The answer.
        then: Box<Reply>,
    },
}

impl Reply {
    /// A 200 JSON reply.
    pub fn json(body: Value) -> Self {
        Reply::Json {
            status: StatusCode::OK,
            body,
        }
    }

    /// A 200 JSON reply, pretty-printed.
    pub fn pretty(body: Value) -> Self {
        Reply::Pretty {
            status: StatusCode::OK,
            body,
        }
    }

    /// An error reply in OpenAI's shape.
    pub fn error(status: u16, code: &str, message: &str) -> Self {
        Reply::Json {
            status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            body: json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}}),
        }
    }

    /// A non-streamed chat completion whose assistant content is `text`.
    pub fn chat_text(text: &str) -> Self {
        Reply::json(chat_completion(text))
    }

    /// A streamed chat completion of `deltas`, `gap` apart, ending in `[DONE]`.
    pub fn chat_stream(deltas: &[&str], gap: Duration) -> Self {
        Reply::Sse {
            frames: chat_stream_frames(deltas),
            gap,
            cut_after: None,
        }
    }

    /// The same reply after `delay`.
    pub fn delayed(self, delay: Duration) -> Self {
        Reply::Delayed {
            delay,
            then: Box::new(self),
        }
    }

    /// For an SSE reply: break the connection instead of sending frame `index`.
    pub fn cut_at(self, index: usize) -> Self {
        match self {
            Reply::Sse { frames, gap, .. } => Reply::Sse {
                frames,
                gap,
                cut_after: Some(index),
            },
            other => other,
        }
    }
}

/// A chat.completion object with one choice.
pub fn chat_completion(text: &str) -> Value {
    json!({
        "id": "chatcmpl-mock",
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": "mock-model",
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "finish_reason": "stop"
        }],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
    })
}

/// SSE frames of a chat.completion.chunk stream: role, one frame per delta, stop, usage, `[DONE]`.
pub fn chat_stream_frames(deltas: &[&str]) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        let body = json!({
            "id": "chatcmpl-mock",
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": "mock-model",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]
        });
        format!("data: {body}\n\n")
    };
    let mut frames = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    frames.extend(
        deltas
            .iter()
            .map(|d| chunk(json!({"content": d}), Value::Null)),
    );
    frames.push(chunk(json!({}), json!("stop")));
    frames.push("data: [DONE]\n\n".to_owned());
    frames
}
