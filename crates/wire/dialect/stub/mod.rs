//! A fourth wire format, built only with the `stub` feature (the tests turn it on) and
//! never shipped: it shows what a new dialect must implement, and its tests
//! (`src/testing/stub_dialect.rs`) drive it through the core (parsing, counting, the
//! model view, a compaction, errors, replies) to show that nothing outside
//! `crates/wire/dialect/` had to learn it.
//!
//! The "Tally API": `POST …/v1/tally/generate` with `{"model", "turns": [{"role",
//! "content"}], "stream"}`; a reply is `{"turn": {…}, "stop": "end", "tally": {"in",
//! "out"}}`, a stream is `data: {"delta": "…"}` events, then `data: {"tally": {…}}`
//! and `data: END`; an error is `{"fault": {"code", "detail"}}`, and a full window is
//! the code `window_exceeded`. The key goes in `x-tally-key`.

mod api;
mod credentials;
mod failures;
mod neutral;
mod pair;
mod parsing;
mod replies;

use std::sync::Arc;

use handoff_plugin_api::{content_text, ModelClient};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::translate::TranslatingClient;
use super::{
    json_body, ChatRequest, DialectError, DialectKind, KeyHeader, Markers, Message, RawMessage,
    StreamEnd, StreamReply,
};
use crate::base::chunks::Chunks;
use crate::base::reply::{Assembled, CapturedReply};
use crate::error::ApiError;

const API: &str = "Tally API";

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(default)]
    model: Option<String>,
    #[serde(borrow)]
    turns: Vec<&'a RawValue>,
    #[serde(default)]
    stream: Option<bool>,
}

/// The Tally API.
pub(crate) struct StubDialect;

/// A chat-completions summary body as a Tally body.
fn to_tally(body: &Value) -> Value {
    let turns: Vec<Value> = body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| json!({"role": m["role"], "content": content_text(m)}))
        .collect();
    json!({"model": body["model"], "turns": turns})
}

/// A Tally answer as a chat completion; errors pass through.
fn to_completion(status: u16, body: Value) -> Value {
    if !(200..300).contains(&status) {
        return body;
    }
    json!({
        "choices": [{"index": 0, "message": body["turn"], "finish_reason": "stop"}],
        "usage": {"prompt_tokens": body.pointer("/tally/in"), "completion_tokens": body.pointer("/tally/out")},
    })
}

/// A streamed Tally reply: the deltas joined.
#[derive(Default)]
struct Deltas {
    text: String,
    tally: Option<Value>,
}

impl StreamReply for Deltas {
    fn push(&mut self, _event: &str, data: &str) {
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            return;
        };
        if let Some(delta) = event["delta"].as_str() {
            self.text.push_str(delta);
        }
        if let Some(tally) = event.get("tally") {
            self.tally = Some(tally.clone());
        }
    }

    fn finish(self: Box<Self>) -> Assembled {
        let message = json!({"role": "assistant", "content": self.text});
        Assembled {
            replies: serde_json::value::to_raw_value(&message)
                .map(|message| CapturedReply {
                    message,
                    finish_reason: Some("end".into()),
                    choice: 0,
                })
                .into_iter()
                .collect(),
            usage: self.tally,
            ..Assembled::default()
        }
    }
}
