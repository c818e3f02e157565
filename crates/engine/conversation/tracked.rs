//! What tracking yields: a request's digests in its conversation, and the replies
//! of one response ready to be logged.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use crate::adoption::Adopted;
use crate::base::calibration::Calibration;
use crate::base::digest::{prefix_digests, MessageDigest, PrefixDigest};
use crate::base::id::ConversationId;
use crate::base::line::DecisionLine;
use crate::base::outcome::Outcome;
use crate::base::reply::CapturedReply;
use crate::dialect::{ChatRequest, DialectKind, Message};

/// A request after tracking: its conversation and the digests of its prefix.
#[derive(Debug, Clone)]
pub struct Tracked {
    /// The conversation.
    pub id: ConversationId,
    /// How many leading messages are pinned.
    pub pinned_len: usize,
    /// Digest of each pinned message.
    pub pinned_digests: Vec<MessageDigest>,
    /// Digest of each non-pinned message.
    pub message_digests: Vec<MessageDigest>,
    /// Chain digest of each non-pinned prefix.
    pub prefix: Vec<PrefixDigest>,
    /// How many messages were new to the log.
    pub new_messages: usize,
    /// The conversation's adopted compactions, as of this request.
    pub compactions: HashMap<PrefixDigest, Arc<Adopted>>,
    /// The conversation's calibration, as of this request.
    pub calibration: Option<Calibration>,
    /// What the upstream counted for the conversation's latest reply, its request and
    /// its output: where a request that continues it on the server starts.
    pub held: Option<u64>,
    /// Whether tracking wrote the request's line: a retry of the latest request writes
    /// none, and so no decision either.
    pub logged: bool,
}

impl Tracked {
    /// The digests of `request`, with no state: for reading a log back.
    pub fn compute(id: ConversationId, request: &ChatRequest) -> Self {
        let pinned_len = request.pinned_len();
        let (pinned, rest) = request.messages.split_at(pinned_len);
        let message_digests: Vec<MessageDigest> = rest.iter().map(Message::digest).collect();
        Self {
            id,
            pinned_len,
            pinned_digests: pinned.iter().map(Message::digest).collect(),
            prefix: prefix_digests(&message_digests),
            message_digests,
            new_messages: 0,
            compactions: HashMap::new(),
            calibration: None,
            held: None,
            logged: false,
        }
    }

    /// The chain digest of the whole request, the parent of its reply.
    pub fn head(&self) -> Option<PrefixDigest> {
        self.prefix.last().copied()
    }
}

/// The reply choices of one response, ready to be logged.
#[derive(Debug)]
pub struct CapturedReplies {
    /// The dialect the replies came in, which reads them as its messages.
    pub dialect: DialectKind,
    /// Chain digest of the request's last message, the replies' parent.
    pub parent: Option<PrefixDigest>,
    /// The request's model.
    pub model: String,
    /// The upstream's `usage`, if it sent one.
    pub usage: Option<Value>,
    /// The calibration this response supports, if any.
    pub calibration: Option<Calibration>,
    /// The choices, or consecutive items when `sequence`.
    pub replies: Vec<CapturedReply>,
    /// True when each reply follows the one before (Responses output items).
    pub sequence: bool,
    /// The upstream's id of the response, for `previous_response_id` lookups.
    pub response_id: Option<String>,
    /// The server-side `conversation` the request continued: it now ends here.
    pub conversation: Option<String>,
    /// How the response ended when it was cut short; `None` when it was complete.
    pub incomplete: Option<Outcome>,
    /// What the proxy decided for the request, logged before its replies.
    pub decision: Option<DecisionLine>,
}

/// True when a reply's input count is not the view's, because the provider edited the
/// context it counted: `message` is (or carries) its own compaction, or `usage` counts
/// by compaction iteration. Such a count would skew every later calibrated count.
pub fn counts_upstream_edits(
    message: &serde_json::Value,
    usage: Option<&serde_json::Value>,
) -> bool {
    usage.is_some_and(|u| u.get("iterations").is_some_and(|i| !i.is_null()))
        || crate::dialect::is_provider_compaction(message)
}

#[cfg(test)]
mod edit_tests {
    use serde_json::json;

    use super::counts_upstream_edits;

    #[test]
    fn a_count_of_the_providers_own_edits_is_not_the_views() {
        let text = json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "ok"}]});
        assert!(!counts_upstream_edits(
            &text,
            Some(&json!({"input_tokens": 10}))
        ));
        let item = json!({"type": "compaction", "encrypted_content": "e"});
        assert!(counts_upstream_edits(
            &item,
            Some(&json!({"input_tokens": 10}))
        ));
        let block = json!({"role": "assistant", "content": [{"type": "compaction", "content": "s"}, {"type": "text", "text": "ok"}]});
        assert!(counts_upstream_edits(&block, None));
        let iterations = json!({"input_tokens": 10, "iterations": [{"type": "compaction", "input_tokens": 90000}]});
        assert!(counts_upstream_edits(&text, Some(&iterations)));
        assert!(!counts_upstream_edits(
            &text,
            Some(&json!({"iterations": null}))
        ));
    }
}
