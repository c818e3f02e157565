//! A reply captured from the upstream, in the shape every dialect reduces it to.

use serde_json::value::RawValue;

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
