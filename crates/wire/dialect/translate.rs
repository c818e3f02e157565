//! The summary client of a dialect whose API is not chat completions: strategies'
//! chat-completions bodies go out translated to the dialect's API, and its answers
//! come back as chat completions.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{ModelCallError, ModelClient, ModelReply};
use serde_json::Value;

/// Translates summary calls on their way to `raw` and back.
pub(crate) struct TranslatingClient {
    raw: Arc<dyn ModelClient>,
    request: fn(&Value) -> Value,
    answer: fn(u16, Value) -> Value,
}

impl TranslatingClient {
    /// `request` turns a chat body into the API's; `answer` turns the API's answer
    /// (with its status) back into a chat completion.
    pub(super) fn new(
        raw: Arc<dyn ModelClient>,
        request: fn(&Value) -> Value,
        answer: fn(u16, Value) -> Value,
    ) -> Self {
        Self {
            raw,
            request,
            answer,
        }
    }
}

impl ModelClient for TranslatingClient {
    fn complete(&self, body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        async move {
            let reply = self.raw.complete((self.request)(&body)).await?;
            Ok(ModelReply {
                status: reply.status,
                body: (self.answer)(reply.status, reply.body),
            })
        }
        .boxed()
    }
}
