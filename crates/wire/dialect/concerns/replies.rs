//! A wire format's replies and streams: a reply read whole or assembled from its stream, its deltas, and its usage.

use super::Api;
use crate::base::chunks::Chunks;
use crate::base::reply::Assembled;
use crate::dialect::DialectError;
use crate::dialect::Message;
use crate::dialect::RawMessage;
use crate::dialect::ReplyDelta;
use crate::dialect::StreamEnd;
use crate::dialect::StreamReply;
use bytes::Bytes;
use serde_json::Value;

/// One wire format's replies and streams.
pub trait Replies: Send + Sync + Api {
    /// True when a reply is every output item of a response (Responses), not one message.
    fn reply_is_items(&self) -> bool {
        false
    }

    /// One captured reply read as a request message of this dialect: its facts are the
    /// ones a later request gets when the client echoes the reply byte for byte, so they
    /// go into the same cache. `Err` when a request could not carry it as it is.
    fn read_reply(&self, raw: RawMessage) -> Result<Message, DialectError> {
        Message::from_raw(0, raw, self.kind())
    }

    /// The replies of a non-streamed response, each message exactly as sent, and usage.
    fn replies_from_json(&self, body: &[u8]) -> Result<Assembled, serde_json::Error>;

    /// A fresh assembler for a streamed response.
    fn stream_reply(&self) -> Box<dyn StreamReply>;

    /// The line that ends a streamed response.
    fn stream_end(&self) -> StreamEnd;

    /// `body` asking for the usage its stream would omit (in parts, sent in order), and
    /// what takes it out of the client's stream again; `None` where a stream always
    /// carries usage.
    fn ask_usage(&self, body: &Chunks) -> Option<(Vec<Bytes>, Box<dyn crate::rewrite::Rewrite>)> {
        let _ = body;
        None
    }

    /// The deltas one event of a streamed reply carries: text, and tool arguments (JSON
    /// text in pieces). Redaction markers are turned back into their texts across them
    /// (`reversible` hooks).
    fn reply_deltas(&self, event: &Value) -> Vec<ReplyDelta> {
        let _ = event;
        Vec::new()
    }

    /// The input tokens the upstream counted, from its `usage`.
    fn input_tokens(&self, usage: &Value) -> Option<u64>;

    /// A reply's tokens by price class (fresh input, cache reads and writes, output),
    /// from its `usage`; `None` when it reports none this dialect reads.
    fn billed(&self, usage: &Value) -> Option<crate::config::Billed> {
        let _ = usage;
        None
    }
}
