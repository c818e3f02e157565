//! A fourth wire format, kept in a test and never shipped: it shows what a new
//! dialect must implement, and its tests drive it through the core (parsing,
//! counting, the model view, a compaction, errors, replies) to show that nothing
//! outside `src/dialect/` had to learn it.
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
pub struct StubDialect;

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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

    use mock_upstream::{MockUpstream, Reply};
    use serde_json::json;
    use sha2::Digest;

    use crate::dialect::pair::CONTINUATION;
    use crate::testing::Harness;

    const CONFIG: &str =
        "[models.\"t\"]\ncontext_window = 2000\n[compaction]\nstrategy = \"extract\"\n";

    fn turn(index: usize) -> serde_json::Value {
        let filler = "word ".repeat(200);
        json!({"role": "user", "content": format!("turn {index}: remember TALLY-{index:03}. {filler}")})
    }

    #[tokio::test]
    async fn a_tally_conversation_is_tracked_compacted_and_answered_in_its_own_shape() {
        // It reports the input it counted (bytes / 4), which handoff calibrates on.
        let mock = MockUpstream::with(|recorded| {
            let counted = recorded.body.len() / 4;
            Reply::json(json!({"turn": {"role": "assistant", "content": "noted"}, "stop": "end", "tally": {"in": counted, "out": 1}}))
        })
        .await;
        let proxy = Harness::start(&mock.url(), CONFIG).await;
        let mut turns = Vec::new();
        for index in 0..12 {
            turns.push(turn(index));
            let body = json!({"model": "t", "turns": turns});
            let answer = proxy
                .post(
                    "/v1/tally/generate",
                    &[("x-tally-key", "tk-1"), ("tally-version", "2")],
                    body.to_string().as_bytes(),
                )
                .await;
            assert_eq!(answer.status, 200, "{}", answer.text());
            assert_eq!(answer.json()["turn"]["content"], "noted");
            turns.push(json!({"role": "assistant", "content": "noted"}));
        }
        let seen = mock.requests();
        let last = seen.last().unwrap();
        assert_eq!(last.target, "/v1/tally/generate");
        assert_eq!(last.headers["x-tally-key"], "tk-1");
        let sent = last.json();
        let sent = sent["turns"].as_array().unwrap();
        let sizes: Vec<usize> = seen
            .iter()
            .map(|r| r.json()["turns"].as_array().map_or(0, Vec::len))
            .collect();
        assert!(
            sent.len() < turns.len() - 1,
            "the view was compacted: {sizes:?}"
        );
        assert_eq!(sent[0]["content"], CONTINUATION);
        let handoff = sent[1]["content"].as_str().unwrap();
        assert_eq!(sent[1]["role"], "assistant");
        assert!(handoff.contains("remember TALLY-0"), "{handoff}");
        assert_eq!(
            sent.last().unwrap()["content"],
            turns[turns.len() - 2]["content"]
        );
        // The conversation, its replies and its compaction are tracked.
        let conversations = proxy
            .state
            .tracker
            .store()
            .list(None, None, 10)
            .await
            .unwrap();
        assert_eq!(conversations.len(), 1);
        let log = proxy
            .state
            .tracker
            .store()
            .read(&conversations[0])
            .await
            .unwrap();
        assert!(!log.compactions.is_empty());
    }

    #[tokio::test]
    async fn errors_on_tally_paths_come_in_the_tally_shape_and_an_overflow_is_recovered() {
        let mock = MockUpstream::with(|recorded| {
            let turns = recorded.json()["turns"].as_array().map_or(0, Vec::len);
            if turns > 8 {
                Reply::Json {
                    status: http::StatusCode::BAD_REQUEST,
                    body: json!({"fault": {"code": "window_exceeded", "detail": "too long"}}),
                }
            } else {
                Reply::json(json!({"turn": {"role": "assistant", "content": "ok"}, "stop": "end", "tally": {"in": 5, "out": 1}}))
            }
        })
        .await;
        let proxy = Harness::start(&mock.url(), CONFIG).await;
        let broken = proxy
            .post("/v1/tally/generate", &[], b"{\"turns\": [")
            .await;
        assert_eq!(broken.status, 400);
        assert!(
            broken.json()["fault"]["detail"].is_string(),
            "{}",
            broken.text()
        );
        let short: Vec<_> = (0..10)
            .map(|i| json!({"role": if i % 2 == 0 { "user" } else { "assistant" }, "content": format!("short {i} {}", "word ".repeat(80))}))
            .collect();
        let body = json!({"model": "t", "turns": short});
        let answer = proxy
            .post("/v1/tally/generate", &[], body.to_string().as_bytes())
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        let seen = mock.requests();
        assert!(seen.len() >= 2, "the overflow was retried compacted");
    }

    async fn conversations(proxy: &Harness) -> Vec<crate::base::id::ConversationId> {
        proxy
            .state
            .tracker
            .store()
            .list(None, None, 10)
            .await
            .unwrap()
    }

    #[tokio::test]
    async fn a_tally_key_is_a_credential_a_tenant_and_a_proxy_key() {
        let mock = MockUpstream::with(|_| {
            Reply::json(json!({"turn": {"role": "assistant", "content": "noted"}, "stop": "end", "tally": {"in": 10, "out": 1}}))
        })
        .await;
        let body = json!({"model": "t", "turns": [turn(0)]}).to_string();
        // Without proxy keys, the key in the API's own header names the tenant, as the
        // same key in `Authorization` does.
        let open = Harness::start(&mock.url(), CONFIG).await;
        let sent: [(&str, &[(&str, &str)]); 3] = [
            ("in-key-header", &[("x-tally-key", "tk-1")]),
            ("in-bearer", &[("authorization", "Bearer tk-1")]),
            ("no-key", &[]),
        ];
        for (id, headers) in sent {
            let mut headers = headers.to_vec();
            headers.push(("x-handoff-conversation-id", id));
            let answer = open
                .post("/v1/tally/generate", &headers, body.as_bytes())
                .await;
            assert_eq!(answer.status, 200, "{}", answer.text());
        }
        let listed = conversations(&open).await;
        let tenant = |id: &str| {
            listed
                .iter()
                .find(|c| c.as_str() == id)
                .map(|c| c.tenant().clone())
                .unwrap()
        };
        assert_eq!(tenant("in-key-header"), tenant("in-bearer"));
        assert_ne!(tenant("in-key-header"), tenant("no-key"));

        // With proxy keys, a key in that header is admitted as its team and never goes
        // upstream; an unknown one is refused in the Tally API's own shape.
        let digest: String = sha2::Sha256::digest(b"tk-team")
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let keyed = Harness::start(
            &mock.url(),
            &format!("{CONFIG}[[auth.keys]]\nname = \"tally-team\"\nsha256 = {digest:?}\n"),
        )
        .await;
        let answer = keyed
            .post(
                "/v1/tally/generate",
                &[("x-tally-key", "tk-team")],
                body.as_bytes(),
            )
            .await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        assert!(mock
            .requests()
            .last()
            .unwrap()
            .headers
            .get("x-tally-key")
            .is_none());
        let listed = conversations(&keyed).await;
        assert_eq!(listed[0].tenant().as_str(), "tally-team");
        let refused = keyed
            .post(
                "/v1/tally/generate",
                &[("x-tally-key", "tk-other")],
                body.as_bytes(),
            )
            .await;
        assert_eq!(refused.status, 401);
        assert!(
            refused.json()["fault"]["detail"].is_string(),
            "{}",
            refused.text()
        );
    }
}
