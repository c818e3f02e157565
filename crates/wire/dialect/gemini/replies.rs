//! Gemini: replies and streams: a reply read whole or assembled from its stream, its deltas, and its usage.

use super::*;
use crate::dialect::Replies;

impl Replies for Gemini {
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
    fn reply_deltas(&self, event: &Value) -> Vec<crate::dialect::ReplyDelta> {
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
                deltas.push(crate::dialect::ReplyDelta::new(
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
}
