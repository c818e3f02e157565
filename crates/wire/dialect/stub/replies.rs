//! StubDialect: replies and streams: a reply read whole or assembled from its stream, its deltas, and its usage.

use super::*;
use crate::dialect::Replies;

impl Replies for StubDialect {
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
}
