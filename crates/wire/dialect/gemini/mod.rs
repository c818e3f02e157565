//! Google's Gemini API: `POST …/models/{model}:generateContent` and
//! `:streamGenerateContent` (SSE with `alt=sse`, a JSON array without it).
//!
//! The model and whether the answer streams are in the path, not the body. Every
//! content and part is kept exactly as sent. `systemInstruction` is pinned: it is
//! tracked as one system message `{"role":"system","content":<systemInstruction as
//! sent>}` and never leaves the body's own field. A `model` content's `functionCall`
//! parts and the next `user` content's `functionResponse` parts form one unit; a call
//! and its response are matched by `id` when both carry one, else by name and order
//! (the API's own calls carry no id; Gemini CLI gives its responses one). A
//! `thoughtSignature` lives on the part it signs, so a cut between contents never
//! separates it from its call, and the recent part is sent verbatim. The key comes in
//! `x-goog-api-key` or `?key=`, which the router moves into that header.

mod assemble;
mod content;
pub(crate) mod names;
mod path;
mod summary;

use std::sync::Arc;

use handoff_plugin_api::ModelClient;
use http::StatusCode;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{json, Value};

use super::translate::TranslatingClient;
use super::Reading;
use super::{
    ChatRequest, Dialect, DialectError, DialectKind, KeyHeader, Markers, Message, Role, StreamEnd,
    StreamReply,
};
use crate::base::chunks::Chunks;
use crate::base::reply::Assembled;
use crate::dialect::pair::CONTINUATION;
use crate::error::ApiError;

const API: &str = "Gemini API";

/// The continuation when the handoff shares its user content: the text part after
/// this one is the handoff.
const CONTINUATION_JOINED: &str = "Continue from the compacted state. The earlier part of this conversation was compacted by handoff: the text that follows in this message is its handoff and the source of prior context, and the messages after this one are the most recent ones, verbatim.";

/// Google's Gemini API.
pub struct Gemini;

#[derive(Deserialize)]
struct Wire<'a> {
    #[serde(borrow)]
    contents: Vec<&'a RawValue>,
    #[serde(default, rename = "systemInstruction")]
    system: Option<Box<RawValue>>,
    /// The same field as the proto names it, which Google's parser reads too.
    #[serde(default, rename = "system_instruction")]
    system_snake: Option<Box<RawValue>>,
    #[serde(default)]
    tools: Option<Box<RawValue>>,
    #[serde(default, rename = "generationConfig", alias = "generation_config")]
    config: Option<Config>,
    /// The model, where a body names it; the path's wins ([`Dialect::parse_at`]).
    #[serde(default)]
    model: Option<String>,
}

#[derive(Deserialize)]
struct Config {
    #[serde(default, rename = "maxOutputTokens", alias = "max_output_tokens")]
    max_output: Option<u64>,
    #[serde(default, rename = "thinkingConfig", alias = "thinking_config")]
    thinking: Option<Value>,
}

/// The role of the content at `index`: `model` is the assistant; a content without a
/// role is the user's, as the API reads it.
fn role_of(index: usize, value: &Value) -> Result<Role, DialectError> {
    let Value::Object(map) = value else {
        return Err(DialectError::NotAnObject { index });
    };
    Ok(match map.get("role").and_then(Value::as_str) {
        None | Some("") => Role::User,
        Some("model") => Role::Assistant,
        Some(role) => Role::parse(role),
    })
}

/// One call or response part's function: its `id` if it has one, and its name.
fn functions(message: &Value, kind: names::Name) -> Vec<(Option<&str>, &str)> {
    content::parts(message)
        .iter()
        .filter_map(|part| names::get(part, kind))
        .map(|f| {
            (
                f.get("id").and_then(Value::as_str),
                f.get("name").and_then(Value::as_str).unwrap_or(""),
            )
        })
        .collect()
}

impl Dialect for Gemini {
    fn kind(&self) -> DialectKind {
        DialectKind::Gemini
    }

    fn name(&self) -> &'static str {
        "gemini"
    }

    fn api(&self) -> &'static str {
        API
    }

    /// The models collection: what a proxy key may use under it, and the root of
    /// [`Dialect::call_path`].
    fn path(&self) -> &'static str {
        "/v1beta/models"
    }

    /// Files, cached contents and batches, named `files/…`: in a path
    /// (`/v1beta/files/abc`), in `cachedContent`, and in a `fileUri` (a URL that ends
    /// with the name).
    fn objects(&self) -> super::objects::Objects {
        super::objects::Objects {
            // Both spellings: Google's parser reads `cached_content` as `cachedContent`.
            id_fields: &[
                "cachedContent",
                "cached_content",
                "fileUri",
                "file_uri",
                "fileSearchStoreNames",
                "file_search_store_names",
                "fileSearchStore",
                "file_search_store",
            ],
            id_prefixes: &[
                "files/",
                "cachedContents/",
                "batches/",
                "fileSearchStores/",
                "corpora/",
            ],
            listings: &[
                "/v1beta/files",
                "/v1beta/cachedContents",
                "/v1beta/batches",
                "/v1beta/fileSearchStores",
                "/v1beta/corpora",
            ],
        }
    }

    fn key_paths(&self) -> &'static [&'static str] {
        &[
            "/v1beta/files",
            "/upload/v1beta/files",
            "/v1beta/cachedContents",
            "/v1beta/batches",
            "/v1beta/fileSearchStores",
            "/upload/v1beta/fileSearchStores",
            "/v1/models",
        ]
    }

    fn tracks(&self, path: &str) -> bool {
        path::generating(path).is_some()
    }

    /// Its own version prefixes, Vertex AI's Google models, and a model method under
    /// `/v1/models/` (OpenAI's fine-tuned model ids hold colons too, so only Gemini's
    /// methods count).
    fn answers_path(&self, path: &str) -> bool {
        path.starts_with("/v1beta/")
            || path.starts_with("/v1alpha/")
            || path.starts_with("/upload/v1beta/")
            || path.contains("/publishers/google/models/")
            || (path.starts_with("/v1/models/")
                && path
                    .rsplit_once(':')
                    .is_some_and(|(_, method)| path::METHODS.contains(&method)))
    }

    fn path_model(&self, path: &str) -> Option<String> {
        path::model(path).map(str::to_owned)
    }

    fn key_header(&self) -> KeyHeader {
        KeyHeader::Named("x-goog-api-key")
    }

    fn query_key(&self) -> Option<&'static str> {
        Some("key")
    }

    fn api_headers(&self) -> &'static [&'static str] {
        &["x-goog-user-project"]
    }

    fn key_env(&self) -> &'static str {
        "GEMINI_API_KEY"
    }

    fn markers(&self) -> Markers {
        content::MARKERS
    }

    fn parse_at(&self, target: &str, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let mut request = self.parse_body(body)?;
        if let Some((model, stream)) = path::generating(target.split('?').next().unwrap_or(target))
        {
            request.model = model.to_owned();
            // Without `alt=sse` the stream is one JSON array, read as a whole reply.
            request.stream = stream && path::asks_sse(target);
        }
        Ok(request)
    }

    fn parse_body(&self, body: &Chunks) -> Result<ChatRequest, DialectError> {
        let reading = Reading::new(body, DialectKind::Gemini);
        let wire: Wire<'_> = reading
            .json(&[
                names::SYSTEM_INSTRUCTION.camel,
                names::SYSTEM_INSTRUCTION.snake,
                "tools",
            ])
            .map_err(|err| DialectError::json(API, err))?;
        let conversation = reading.messages(&wire.contents, |index, raw| {
            Message::read(raw, DialectKind::Gemini, |value| role_of(index, value))
        })?;
        let mut messages = Vec::with_capacity(conversation.len() + 1);
        // Either spelling is the system instruction; both at once mean two, and which
        // one Google keeps is not handoff's to guess.
        let camel = reading.member(names::SYSTEM_INSTRUCTION.camel, wire.system);
        let snake = reading.member(names::SYSTEM_INSTRUCTION.snake, wire.system_snake);
        let (key, system) = match (camel, snake) {
            (Some(_), Some(_)) => {
                return Err(DialectError::json(
                    API,
                    serde::de::Error::custom(
                        "systemInstruction and system_instruction are one field, given twice",
                    ),
                ))
            }
            (None, Some(snake)) => (names::SYSTEM_INSTRUCTION.snake, Some(snake)),
            (camel, None) => (names::SYSTEM_INSTRUCTION.camel, camel),
        };
        if let Some(system) = system {
            if !matches!(&*system, b"null" | b"{}") {
                messages.push(super::pinned::system_message(
                    &system,
                    reading.member_digest(key),
                    DialectKind::Gemini,
                )?);
            }
        }
        let top_level = messages.len();
        messages.extend(conversation);
        let thinking = wire
            .config
            .as_ref()
            .and_then(|c| c.thinking.as_ref())
            .is_some_and(|t| {
                names::get(t, names::THINKING_BUDGET).and_then(Value::as_i64) != Some(0)
            });
        Ok(ChatRequest {
            dialect: DialectKind::Gemini,
            model: wire.model.unwrap_or_default(),
            messages,
            tools: reading.member_bytes("tools", wire.tools),
            tools_digest: reading.member_digest("tools"),
            stream: false,
            max_output: wire.config.as_ref().and_then(|c| c.max_output),
            thinking,
            top_level,
            provider_compacts: false,
            asked: None,
            compacted_history: false,
            expanded: None,
            server_held: false,
            continues: None,
            usage_unasked: false,
            continues_conversation: false,
            pinned: None,
            floated: Vec::new(),
            list: reading.list_span(),
        })
    }

    /// A `model` content's function calls are answered by the very next content, a
    /// `user` one, with one `functionResponse` per call: by `id` when the call has one
    /// and the response too, else by name, in order. Every response answers a call.
    fn check_pairs(&self, messages: &[Message]) -> Result<(), DialectError> {
        let mut pending: Vec<(Option<&str>, &str)> = Vec::new();
        let mut pending_from = 0;
        let unanswered =
            |pending: &[(Option<&str>, &str)], index| DialectError::UnansweredToolCalls {
                index,
                ids: pending
                    .iter()
                    .map(|(id, name)| id.unwrap_or(name).to_owned())
                    .collect(),
            };
        for (index, message) in messages.iter().enumerate() {
            if message.role.is_instruction() {
                continue;
            }
            let answers = functions(message.value(), names::FUNCTION_RESPONSE);
            for (id, name) in answers {
                let by_id = id.and_then(|id| pending.iter().position(|(p, _)| *p == Some(id)));
                let Some(at) = by_id.or_else(|| pending.iter().position(|(_, n)| *n == name))
                else {
                    return Err(DialectError::OrphanToolResult {
                        index,
                        id: id.unwrap_or(name).to_owned(),
                    });
                };
                pending.remove(at);
            }
            if !pending.is_empty() {
                return Err(unanswered(&pending, pending_from));
            }
            if message.role == Role::Assistant {
                pending = functions(message.value(), names::FUNCTION_CALL);
                pending_from = index;
            }
        }
        if pending.is_empty() {
            Ok(())
        } else {
            Err(unanswered(&pending, pending_from))
        }
    }

    fn top_level_field(&self) -> Option<&'static str> {
        Some("systemInstruction")
    }

    fn list_field(&self) -> &'static str {
        "contents"
    }

    fn in_messages(&self, name: &str) -> bool {
        name == self.list_field() || names::is(name, names::SYSTEM_INSTRUCTION)
    }

    fn continuation(&self) -> Value {
        json!({"role": "user", "parts": [{"text": CONTINUATION}]})
    }

    fn handoff(&self, text: &str, _reasoning_marker: bool) -> Value {
        json!({"role": "model", "parts": [{"text": text}]})
    }

    fn handoff_ok(&self, handoff: &Value) -> bool {
        handoff["parts"].is_array()
    }

    /// A `model` content after the pair would make two model turns in a row, which
    /// also ends the user turn the signature rules count from: the pair goes as one
    /// user content instead.
    fn joined_pair(&self, _continuation: &Value, handoff: &Value, next: &Message) -> Option<Value> {
        if next.role != Role::Assistant {
            return None;
        }
        let mut parts = vec![json!({"text": CONTINUATION_JOINED})];
        parts.extend(content::parts(handoff).iter().cloned());
        Some(json!({"role": "user", "parts": parts}))
    }

    fn shorten_tool_results(
        &self,
        message: &mut Value,
        shorten: &mut dyn FnMut(&mut Value) -> bool,
    ) -> bool {
        content::shorten_tool_results(message, shorten)
    }

    fn calls_tools(&self, message: &Value) -> bool {
        content::calls_tools(message)
    }

    fn push_text(&self, message: &Value, push: &mut dyn FnMut(&str)) {
        content::push_text(message, push);
    }

    fn push_part(&self, part: &Value, push: &mut dyn FnMut(&str)) -> bool {
        part.get("type").is_none() && content::push_part(part, push)
    }

    fn call_path(&self, model: &str, target: Option<&str>) -> String {
        path::call(model, target)
    }

    fn retarget(&self, target: &str, model: &str) -> Option<String> {
        path::retarget(target, model)
    }

    fn request_body(
        &self,
        _model: &str,
        top_level: Option<&Value>,
        messages: &[&RawValue],
    ) -> Vec<u8> {
        let list: Vec<&str> = messages.iter().map(|m| m.get()).collect();
        let mut body = format!("{{\"contents\":[{}]", list.join(","));
        if let Some(pinned) = top_level {
            body.push_str(&format!(",\"systemInstruction\":{}", pinned["content"]));
        }
        body.push('}');
        body.into_bytes()
    }

    fn error_json(&self, err: &ApiError) -> Value {
        let status = match err.status {
            StatusCode::UNAUTHORIZED => "UNAUTHENTICATED",
            StatusCode::FORBIDDEN => "PERMISSION_DENIED",
            StatusCode::NOT_FOUND => "NOT_FOUND",
            StatusCode::TOO_MANY_REQUESTS => "RESOURCE_EXHAUSTED",
            StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => "UNAVAILABLE",
            StatusCode::GATEWAY_TIMEOUT => "DEADLINE_EXCEEDED",
            status if status.is_client_error() => "INVALID_ARGUMENT",
            _ => "INTERNAL",
        };
        let message = match err.code {
            Some(code) => format!("{} ({code})", err.message),
            None => err.message.clone(),
        };
        json!({"error": {"code": err.status.as_u16(), "message": message, "status": status}})
    }

    fn is_overflow(&self, body: &Value) -> bool {
        let message = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("");
        (message.contains("input token count") && message.contains("exceeds the maximum"))
            || crate::dialect::overflow::is_context_length_error(body)
    }

    fn replies_from_json(&self, body: &[u8]) -> Result<Assembled, serde_json::Error> {
        assemble::replies_from_json(body)
    }

    fn stream_reply(&self) -> Box<dyn StreamReply> {
        Box::<assemble::Chunks>::default()
    }

    /// No event names itself last: the one that carries `finishReason` is.
    fn stream_end(&self) -> StreamEnd {
        StreamEnd {
            field: b"data:",
            values: &[],
            containing: b"\"finishReason\"",
        }
    }

    /// The text parts of an event whose parts are all text: a text part continues the
    /// text before it. An event that also carries a call (whose `args` arrive whole)
    /// has none, and goes as a whole, its markers turned back in place.
    fn reply_deltas(&self, event: &Value) -> Vec<super::ReplyDelta> {
        let candidates = event["candidates"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        let parts = |candidate: &Value| {
            candidate["content"]["parts"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
                .to_vec()
        };
        let all_text = candidates
            .iter()
            .flat_map(parts)
            .all(|part| part["text"].is_string() && part.get("functionCall").is_none());
        if !all_text {
            return Vec::new();
        }
        let mut deltas = Vec::new();
        for (at, candidate) in candidates.iter().enumerate() {
            let index = candidate["index"].as_u64().unwrap_or(at as u64);
            for (part_at, part) in parts(candidate).iter().enumerate() {
                let thought = part["thought"] == true;
                deltas.push(super::ReplyDelta::new(
                    format!("candidate {index} text {thought}"),
                    format!("/candidates/{at}/content/parts/{part_at}/text"),
                    false,
                ));
            }
        }
        deltas
    }

    /// The prompt as counted, cached tokens included (the window holds all of it).
    fn input_tokens(&self, usage: &Value) -> Option<u64> {
        let prompt = usage.get("promptTokenCount")?.as_u64()?;
        Some(
            prompt
                + usage
                    .get("toolUsePromptTokenCount")
                    .and_then(Value::as_u64)
                    .unwrap_or(0),
        )
    }

    fn billed(&self, usage: &Value) -> Option<crate::config::Billed> {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64).unwrap_or(0);
        let input = self.input_tokens(usage)?;
        let cached = field("cachedContentTokenCount").min(input);
        Some(crate::config::Billed {
            input: input - cached,
            cache_read: cached,
            cache_write: 0,
            output: field("candidatesTokenCount") + field("thoughtsTokenCount"),
        })
    }

    fn neutral(&self, message: &Value) -> Vec<Value> {
        content::neutral(message)
    }

    fn summary_client(&self, raw: Arc<dyn ModelClient>) -> Arc<dyn ModelClient> {
        Arc::new(TranslatingClient::new(
            raw,
            summary::to_gemini,
            summary::to_completion,
        ))
    }
}

#[cfg(test)]
mod tests;
