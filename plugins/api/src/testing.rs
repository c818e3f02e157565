//! Stand-ins for writing strategy tests: a model client that is never called and a
//! token counter at four bytes a token.

use futures_util::future::BoxFuture;
use serde_json::Value;

use crate::{ModelCallError, ModelClient, ModelReply, TokenCounter};

/// A [`ModelClient`] for deterministic strategies: every call fails.
pub struct NoModel;

impl ModelClient for NoModel {
    fn complete(&self, _body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        Box::pin(async { Err(ModelCallError("this strategy must not call a model".into())) })
    }
}

/// A [`TokenCounter`] that counts four bytes as one token.
pub struct BytesPerFour;

impl TokenCounter for BytesPerFour {
    fn count_text(&self, text: &str) -> u64 {
        text.len() as u64 / 4
    }

    fn count_message(&self, message: &Value) -> u64 {
        message.to_string().len() as u64 / 4
    }
}
