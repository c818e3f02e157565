//! A reply captured from the upstream, in the shape every dialect reduces it to.

use serde_json::value::RawValue;
use serde_json::Value;

/// One reply choice captured from the upstream.
#[derive(Debug, Clone)]
pub struct CapturedReply {
    /// The assistant message as the client will echo it.
    pub message: Box<RawValue>,
    /// Why generation stopped (`finish_reason`, `stop_reason`).
    pub finish_reason: Option<String>,
    /// The choice index.
    pub choice: u64,
}

/// What a dialect reads out of one response.
#[derive(Debug, Default)]
pub struct Assembled {
    /// The replies: alternative choices, or consecutive items (`sequence`).
    pub replies: Vec<CapturedReply>,
    /// The upstream's `usage`, if it sent one.
    pub usage: Option<Value>,
    /// True when the replies follow one another (Responses output items), each the
    /// parent of the next; false when they are alternatives (chat `n > 1`).
    pub sequence: bool,
    /// The upstream's id of what the reply made, where later requests may name it:
    /// the response (Responses' `previous_response_id`), or the code-execution
    /// container it ran in (Messages' `container`). Either is its tenant's from then on.
    pub response_id: Option<String>,
    /// True when the provider says it edited the context it counted before answering
    /// (Anthropic's `context_management.applied_edits`): its input count is not the
    /// view's.
    pub edited_upstream: bool,
}
