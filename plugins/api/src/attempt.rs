//! Why an attempt failed, with the usage it cost: a discarded summary is still billed.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The reason an attempt produced no handoff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureReason {
    /// The summary input does not fit even with tool bodies shortened.
    PrecheckFailed,
    /// The model answered with no text.
    EmptySummary,
    /// The model answered with reasoning only.
    ReasoningOnly,
    /// `finish_reason` was not `stop` (e.g. `length`).
    FinishReason,
    /// The text is not a handoff: sections missing, the prompt echoed, ids invented.
    InvalidSummary,
    /// The upstream answered an HTTP error.
    HttpError,
    /// The call took longer than `compaction.summary_timeout`.
    Timeout,
    /// The compaction was cancelled.
    Cancelled,
    /// The strategy is misconfigured or failed in another way.
    Failed,
}

/// A failed attempt.
#[derive(Debug, Clone, PartialEq, thiserror::Error, Serialize, Deserialize)]
#[error("{reason:?}: {message}")]
pub struct AttemptError {
    /// The reason.
    pub reason: FailureReason,
    /// What happened, with values.
    pub message: String,
    /// The provider's usage, when a model was called; summed over every call.
    pub usage: Option<Value>,
    /// How many model calls were made before it failed, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u32>,
}

impl AttemptError {
    /// A failure with no usage.
    pub fn new(reason: FailureReason, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            usage: None,
            calls: None,
        }
    }

    /// The same failure, carrying `usage`.
    pub fn with_usage(mut self, usage: Option<Value>) -> Self {
        self.usage = usage;
        self
    }

    /// The same failure, after `calls` model calls.
    pub fn with_calls(mut self, calls: u32) -> Self {
        self.calls = Some(calls);
        self
    }
}
