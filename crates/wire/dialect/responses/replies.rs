//! OpenAiResponses: replies and streams: a reply read whole or assembled from its stream, its deltas, and its usage.

use super::*;
use crate::dialect::Replies;

impl Replies for OpenAiResponses {
    fn reply_is_items(&self) -> bool {
        true
    }

    fn read_reply(&self, raw: RawMessage) -> Result<Message, DialectError> {
        read_item(0, raw)
    }

    fn replies_from_json(&self, body: &[u8]) -> Result<Assembled, serde_json::Error> {
        assemble::replies_from_json(body)
    }

    fn stream_reply(&self) -> Box<dyn StreamReply> {
        Box::<assemble::ResponseAssembler>::default()
    }

    fn stream_end(&self) -> StreamEnd {
        StreamEnd {
            field: b"event:",
            values: &[
                b"response.completed",
                b"response.incomplete",
                b"response.failed",
            ],
            containing: b"",
        }
    }

    fn reply_deltas(&self, event: &Value) -> Vec<crate::dialect::ReplyDelta> {
        if !event["delta"].is_string() {
            return Vec::new();
        }
        match event["type"].as_str() {
            Some("response.output_text.delta") => {
                let channel = format!(
                    "output {} {}",
                    event["output_index"], event["content_index"]
                );
                vec![crate::dialect::ReplyDelta::new(channel, "/delta", false)]
            }
            Some("response.function_call_arguments.delta") => {
                let channel = format!("arguments {}", event["output_index"]);
                vec![crate::dialect::ReplyDelta::new(channel, "/delta", true)]
            }
            _ => Vec::new(),
        }
    }

    fn input_tokens(&self, usage: &Value) -> Option<u64> {
        usage.get("input_tokens")?.as_u64()
    }

    fn billed(&self, usage: &Value) -> Option<crate::config::Billed> {
        let input = usage.get("input_tokens")?.as_u64()?;
        let cached = usage
            .pointer("/input_tokens_details/cached_tokens")
            .and_then(Value::as_u64)
            .unwrap_or(0);
        Some(crate::config::Billed {
            input: input.saturating_sub(cached),
            cache_read: cached.min(input),
            cache_write: 0,
            output: usage
                .get("output_tokens")
                .and_then(Value::as_u64)
                .unwrap_or(0),
        })
    }
}
