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
    ChatRequest, DialectError, DialectKind, KeyHeader, Markers, Message, Role, StreamEnd,
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
    /// The model, where a body names it; the path's wins ([`crate::dialect::Parsing::parse_at`]).
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

mod api;
mod credentials;
mod failures;
mod neutral;
mod pair;
mod parsing;
mod replies;
#[cfg(test)]
mod tests;
