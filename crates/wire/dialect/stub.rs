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

use std::sync::Arc;

use handoff_plugin_api::{content_text, ModelClient};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::translate::TranslatingClient;
use super::{
    json_body, ChatRequest, Dialect, DialectError, DialectKind, KeyHeader, Markers, Message,
    RawMessage, StreamEnd, StreamReply,
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

impl Dialect for StubDialect {
    fn kind(&self) -> DialectKind {
        DialectKind::Stub
    }

    fn name(&self) -> &'static str {
        "tally"
    }

    fn api(&self) -> &'static str {
        API
    }

    fn path(&self) -> &'static str {
        "/v1/tally/generate"
    }

    fn tracks(&self, path: &str) -> bool {
        path.ends_with("/v1/tally/generate")
    }

    fn answers_path(&self, path: &str) -> bool {
        path.contains("/v1/tally/")
    }

    fn key_header(&self) -> KeyHeader {
        KeyHeader::Named("x-tally-key")
    }

    fn api_headers(&self) -> &'static [&'static str] {
        &["tally-version"]
    }

    fn markers(&self) -> Markers {
        Markers {
            paired: &[],
            echoed: &[],
            indexed: &[],
        }
    }

    fn list_field(&self) -> &'static str {
        "turns"
    }

    fn parse_body(&self, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let body = body.contiguous();
        let wire: Wire<'_> = json_body(body).map_err(|err| DialectError::json(API, err))?;
        let messages = wire
            .turns
            .into_iter()
            .enumerate()
            .map(|(index, raw)| {
                Message::from_raw(
                    index,
                    RawMessage::within(body, raw.get()),
                    DialectKind::Stub,
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ChatRequest {
            dialect: DialectKind::Stub,
            model: wire.model.unwrap_or_default(),
            messages,
            top_level: 0,
            provider_compacts: false,
            asked: None,
            compacted_history: false,
            expanded: None,
            server_held: false,
            continues: None,
            continues_conversation: false,
            pinned: None,
            floated: Vec::new(),
            tools: None,
            tools_digest: None,
            stream: wire.stream.unwrap_or(false),
            usage_unasked: false,
            max_output: None,
            thinking: false,
            list: None,
        })
    }

    fn check_pairs(&self, _messages: &[Message]) -> Result<(), DialectError> {
        Ok(())
    }

    fn continuation(&self) -> Value {
        json!({"role": "user", "content": super::pair::CONTINUATION})
    }

    fn handoff(&self, text: &str, _reasoning_marker: bool) -> Value {
        json!({"role": "assistant", "content": text})
    }

    fn shorten_tool_results(
        &self,
        _message: &mut Value,
        _shorten: &mut dyn FnMut(&mut Value) -> bool,
    ) -> bool {
        false
    }

    fn calls_tools(&self, _message: &Value) -> bool {
        false
    }

    fn push_text(&self, _message: &Value, _push: &mut dyn FnMut(&str)) {}

    fn error_json(&self, err: &ApiError) -> Value {
        json!({"fault": {"code": err.code.unwrap_or(err.kind), "detail": err.message}})
    }

    fn is_overflow(&self, body: &Value) -> bool {
        body.pointer("/fault/code").and_then(Value::as_str) == Some("window_exceeded")
    }

    fn opening_event(&self, event: &Value) -> super::Opening {
        match event.get("fault") {
            Some(_) if self.is_overflow(event) => super::Opening::Overflow,
            _ => super::Opening::Relay,
        }
    }

    fn replies_from_json(&self, body: &[u8]) -> Result<Assembled, serde_json::Error> {
        let reply: Value = serde_json::from_slice(body)?;
        Ok(Assembled {
            replies: vec![CapturedReply {
                message: serde_json::value::to_raw_value(&reply["turn"])?,
                finish_reason: reply["stop"].as_str().map(str::to_owned),
                choice: 0,
            }],
            usage: reply.get("tally").cloned(),
            ..Assembled::default()
        })
    }

    fn stream_reply(&self) -> Box<dyn StreamReply> {
        Box::<Deltas>::default()
    }

    fn stream_end(&self) -> StreamEnd {
        StreamEnd {
            field: b"data:",
            values: &[b"END"],
            containing: b"",
        }
    }

    fn input_tokens(&self, usage: &Value) -> Option<u64> {
        usage.get("in")?.as_u64()
    }

    fn neutral(&self, message: &Value) -> Vec<Value> {
        vec![message.clone()]
    }

    fn summary_client(&self, raw: Arc<dyn ModelClient>) -> Arc<dyn ModelClient> {
        Arc::new(TranslatingClient::new(raw, to_tally, to_completion))
    }
}

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
