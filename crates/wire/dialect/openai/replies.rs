//! OpenAiChat: replies and streams: a reply read whole or assembled from its stream, its deltas, and its usage.

use super::*;
use crate::dialect::Replies;

impl Replies for OpenAiChat {
    fn replies_from_json(&self, body: &[u8]) -> Result<Assembled, serde_json::Error> {
        replies_from_json(body)
    }

    fn stream_reply(&self) -> Box<dyn StreamReply> {
        Box::<StreamAssembler>::default()
    }

    fn ask_usage(&self, body: &Chunks) -> Option<(Vec<Bytes>, Box<dyn Rewrite>)> {
        Some((usage::ask(body)?, Box::<usage::StripUsage>::default()))
    }

    fn stream_end(&self) -> StreamEnd {
        StreamEnd {
            field: b"data:",
            values: &[b"[DONE]"],
            containing: b"",
        }
    }

    fn reply_deltas(&self, event: &Value) -> Vec<crate::dialect::ReplyDelta> {
        let Some(choices) = event.get("choices").and_then(Value::as_array) else {
            return Vec::new();
        };
        let mut deltas = Vec::new();
        for (at, choice) in choices.iter().enumerate() {
            let index = choice["index"].as_u64().unwrap_or(at as u64);
            if choice["delta"]["content"].is_string() {
                let pointer = format!("/choices/{at}/delta/content");
                deltas.push(crate::dialect::ReplyDelta::new(
                    format!("choice {index}"),
                    pointer,
                    false,
                ));
            }
            let calls = choice["delta"]["tool_calls"]
                .as_array()
                .into_iter()
                .flatten();
            for (n, call) in calls.enumerate() {
                if call["function"]["arguments"].is_string() {
                    let channel = format!("choice {index} call {}", call["index"]);
                    let pointer = format!("/choices/{at}/delta/tool_calls/{n}/function/arguments");
                    deltas.push(crate::dialect::ReplyDelta::new(channel, pointer, true));
                }
            }
        }
        deltas
    }

    fn input_tokens(&self, usage: &Value) -> Option<u64> {
        usage.get("prompt_tokens")?.as_u64()
    }

    fn billed(&self, usage: &Value) -> Option<crate::config::Billed> {
        let field = |pointer: &str| usage.pointer(pointer).and_then(Value::as_u64);
        let prompt = field("/prompt_tokens")?;
        let cached = field("/prompt_tokens_details/cached_tokens")
            .unwrap_or(0)
            .min(prompt);
        // A summary call through another API comes back in this shape, with the
        // cache writes that API bills apart (Anthropic's) kept beside.
        let written = field("/cache_creation_input_tokens")
            .unwrap_or(0)
            .min(prompt - cached);
        Some(crate::config::Billed {
            input: prompt - cached - written,
            cache_read: cached,
            cache_write: written,
            output: field("/completion_tokens").unwrap_or(0),
        })
    }
}
