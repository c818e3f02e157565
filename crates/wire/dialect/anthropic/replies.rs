//! AnthropicMessages: replies and streams: a reply read whole or assembled from its stream, its deltas, and its usage.

use super::*;
use crate::dialect::Replies;

impl Replies for AnthropicMessages {
    fn replies_from_json(&self, body: &[u8]) -> Result<Assembled, serde_json::Error> {
        assemble::replies_from_json(body)
    }

    fn stream_reply(&self) -> Box<dyn StreamReply> {
        Box::<assemble::MessageAssembler>::default()
    }

    fn stream_end(&self) -> StreamEnd {
        StreamEnd {
            field: b"event:",
            values: &[b"message_stop"],
            containing: b"",
        }
    }

    /// Cached input counts too: the window holds all of it.
    fn reply_deltas(&self, event: &Value) -> Vec<crate::dialect::ReplyDelta> {
        if event["type"] != "content_block_delta" {
            return Vec::new();
        }
        let channel = format!("block {}", event["index"]);
        match event["delta"]["type"].as_str() {
            Some("text_delta") => vec![crate::dialect::ReplyDelta::new(
                channel,
                "/delta/text",
                false,
            )],
            Some("input_json_delta") => {
                vec![crate::dialect::ReplyDelta::new(
                    channel,
                    "/delta/partial_json",
                    true,
                )]
            }
            _ => Vec::new(),
        }
    }

    fn input_tokens(&self, usage: &Value) -> Option<u64> {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        let input = field("input_tokens")?;
        Some(
            input
                + field("cache_read_input_tokens").unwrap_or(0)
                + field("cache_creation_input_tokens").unwrap_or(0),
        )
    }

    fn billed(&self, usage: &Value) -> Option<crate::config::Billed> {
        let field = |name: &str| usage.get(name).and_then(Value::as_u64);
        Some(crate::config::Billed {
            input: field("input_tokens")?,
            cache_read: field("cache_read_input_tokens").unwrap_or(0),
            cache_write: field("cache_creation_input_tokens").unwrap_or(0),
            output: field("output_tokens").unwrap_or(0),
        })
    }
}
