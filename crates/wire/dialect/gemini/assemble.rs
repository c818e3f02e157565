//! A Gemini reply as the log keeps it: each candidate's `content`
//! (`{"role":"model","parts":[…]}`), which is what clients send back on the next turn.
//! A non-streamed reply keeps its bytes; a streamed one (SSE with `alt=sse`, or the
//! JSON array without it) is built from its chunks as the SDKs build it: each chunk's
//! parts in order, a text part continuing the text part before it (thoughts with
//! thoughts), every other part whole.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::base::reply::{Assembled, CapturedReply};
use crate::dialect::StreamReply;

#[derive(Deserialize)]
struct Reply<'a> {
    #[serde(borrow, default)]
    candidates: Vec<Candidate<'a>>,
    #[serde(default, rename = "usageMetadata")]
    usage: Option<Value>,
}

#[derive(Deserialize)]
struct Candidate<'a> {
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(default, rename = "finishReason")]
    finish_reason: Option<String>,
    #[serde(default)]
    index: Option<u64>,
}

/// The replies of a `generateContent` answer, each candidate's content byte for byte;
/// or of a streamed answer read whole (the JSON array).
pub(super) fn replies_from_json(body: &[u8]) -> Result<Assembled, serde_json::Error> {
    let trimmed = body.trim_ascii_start();
    if trimmed.first() == Some(&b'[') {
        let chunks: Vec<Value> = crate::dialect::json_body(body)?;
        let mut assembler = Chunks::default();
        chunks.iter().for_each(|chunk| assembler.chunk(chunk));
        return Ok(Box::new(assembler).finish());
    }
    let reply: Reply<'_> = crate::dialect::json_body(body)?;
    let mut replies = Vec::with_capacity(reply.candidates.len());
    for (at, candidate) in reply.candidates.into_iter().enumerate() {
        let Some(content) = candidate.content else {
            continue;
        };
        replies.push(CapturedReply {
            message: content.to_owned(),
            finish_reason: candidate.finish_reason,
            choice: candidate.index.unwrap_or(at as u64),
        });
    }
    Ok(Assembled {
        replies,
        usage: reply.usage,
        ..Assembled::default()
    })
}

/// One candidate being built.
#[derive(Default)]
struct Building {
    role: Option<Value>,
    parts: Vec<Value>,
    finish_reason: Option<String>,
}

/// True for a part that is text and nothing else a client keeps apart (a thought's
/// text joins thoughts only).
fn joins(last: &Value, part: &Value) -> bool {
    let text_only = |p: &Value| {
        p.as_object().is_some_and(|map| {
            map.get("text").is_some_and(Value::is_string)
                && map
                    .keys()
                    .all(|k| matches!(k.as_str(), "text" | "thought" | "thoughtSignature"))
        })
    };
    let thought = |p: &Value| p.get("thought").and_then(Value::as_bool) == Some(true);
    text_only(last) && text_only(part) && thought(last) == thought(part)
}

/// Folds the chunks of a streamed answer into its candidates.
#[derive(Default)]
pub(crate) struct Chunks {
    candidates: BTreeMap<u64, Building>,
    usage: Option<Value>,
}

impl Chunks {
    fn chunk(&mut self, chunk: &Value) {
        if let Some(usage) = chunk.get("usageMetadata").filter(|u| u.is_object()) {
            self.usage = Some(usage.clone());
        }
        for (at, candidate) in chunk
            .get("candidates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .enumerate()
        {
            let index = candidate
                .get("index")
                .and_then(Value::as_u64)
                .unwrap_or(at as u64);
            let building = self.candidates.entry(index).or_default();
            if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
                building.finish_reason = Some(reason.to_owned());
            }
            let Some(content) = candidate.get("content") else {
                continue;
            };
            if let Some(role) = content.get("role") {
                building.role = Some(role.clone());
            }
            for part in content
                .get("parts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                match building.parts.last_mut() {
                    Some(last) if joins(last, part) => {
                        let piece = part.get("text").and_then(Value::as_str).unwrap_or("");
                        if let Some(Value::String(text)) = last.get_mut("text") {
                            text.push_str(piece);
                        }
                        // A signature that arrives on a later piece belongs to the part.
                        if let (Some(signature), Some(map)) =
                            (part.get("thoughtSignature"), last.as_object_mut())
                        {
                            map.entry("thoughtSignature")
                                .or_insert_with(|| signature.clone());
                        }
                    }
                    _ => building.parts.push(part.clone()),
                }
            }
        }
    }
}

impl StreamReply for Chunks {
    fn push(&mut self, _event: &str, data: &str) {
        if let Ok(chunk) = serde_json::from_str::<Value>(data) {
            self.chunk(&chunk);
        }
    }

    fn finish(self: Box<Self>) -> Assembled {
        let replies = self
            .candidates
            .into_iter()
            .filter_map(|(index, building)| {
                let mut content = Map::new();
                content.insert(
                    "role".into(),
                    building.role.unwrap_or_else(|| Value::from("model")),
                );
                content.insert("parts".into(), Value::Array(building.parts));
                let message = serde_json::value::to_raw_value(&Value::Object(content)).ok()?;
                Some(CapturedReply {
                    message,
                    finish_reason: building.finish_reason,
                    choice: index,
                })
            })
            .collect();
        Assembled {
            replies,
            usage: self.usage,
            ..Assembled::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_stream_joins_text_pieces_and_keeps_calls_whole_with_their_signatures() {
        let mut chunks = Chunks::default();
        for event in [
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "plan", "thought": true}]}, "index": 0}]}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "Read"}]}, "index": 0}]}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"text": "ing."}]}, "index": 0}]}),
            json!({"candidates": [{"content": {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"p": "a"}}, "thoughtSignature": "c2ln"}]},
                "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 12, "candidatesTokenCount": 3}}),
        ] {
            chunks.push("", &event.to_string());
        }
        let assembled = Box::new(chunks).finish();
        let message: Value = serde_json::from_str(assembled.replies[0].message.get()).unwrap();
        assert_eq!(
            message,
            json!({"role": "model", "parts": [{"text": "plan", "thought": true}, {"text": "Reading."},
                {"functionCall": {"name": "read_file", "args": {"p": "a"}}, "thoughtSignature": "c2ln"}]})
        );
        assert_eq!(assembled.replies[0].finish_reason.as_deref(), Some("STOP"));
        assert_eq!(assembled.usage.unwrap()["promptTokenCount"], 12);
    }

    #[test]
    fn a_reply_keeps_each_candidate_s_bytes_and_the_array_stream_reads_as_a_stream() {
        let body = br#"{"candidates": [{"content": {"parts": [{"text": "hi"}], "role": "model"}, "finishReason": "STOP", "index": 0}], "usageMetadata": {"promptTokenCount": 4}}"#;
        let assembled = replies_from_json(body).unwrap();
        assert_eq!(
            assembled.replies[0].message.get(),
            r#"{"parts": [{"text": "hi"}], "role": "model"}"#
        );
        let array = br#"[{"candidates": [{"content": {"parts": [{"text": "h"}], "role": "model"}}]},
            {"candidates": [{"content": {"parts": [{"text": "i"}], "role": "model"}, "finishReason": "STOP"}], "usageMetadata": {"promptTokenCount": 4}}]"#;
        let assembled = replies_from_json(array).unwrap();
        let message: Value = serde_json::from_str(assembled.replies[0].message.get()).unwrap();
        assert_eq!(message, json!({"role": "model", "parts": [{"text": "hi"}]}));
        assert_eq!(assembled.usage.unwrap()["promptTokenCount"], 4);
    }
}
