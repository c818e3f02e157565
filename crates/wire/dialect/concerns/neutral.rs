//! A wire format's the neutral form: a message as strategies read it (OpenAI chat), and the summary client that speaks it.

use handoff_plugin_api::ModelClient;
use serde_json::Value;
use std::sync::Arc;

/// One wire format's the neutral form.
pub trait Neutral: Send + Sync {
    /// A message in the neutral form strategies read (OpenAI chat shape); one wire
    /// message may become several (Anthropic tool results become `tool` messages).
    fn neutral(&self, message: &Value) -> Vec<Value>;

    /// The summary client: `raw` posts JSON to the request's path with the client's
    /// headers; strategies always speak chat completions to what this returns.
    fn summary_client(&self, raw: Arc<dyn ModelClient>) -> Arc<dyn ModelClient>;
}
