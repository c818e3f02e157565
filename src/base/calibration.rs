//! Calibration: the last input size the upstream reported for a conversation, next
//! to the local estimate of the same view.

/// The last upstream-reported input size, and the local estimate of the same view.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// Model of the request.
    pub model: String,
    /// The compaction the view was built on (`None`: no compaction).
    pub compact_id: Option<String>,
    /// Local estimate of that view.
    pub local: u64,
    /// `usage.prompt_tokens` the upstream reported for it.
    pub server: u64,
}
