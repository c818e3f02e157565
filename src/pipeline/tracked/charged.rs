//! Summary calls paid by the key whose conversation needed them: the tokens a call
//! used come out of the key's `tpm` and are counted under the key's name in the
//! metrics, so a key cannot have handoff spend the shared upstream key for it
//! unaccounted. Never holds a call back: the charge is taken after the answer.

use std::sync::Arc;
use std::time::Instant;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{ModelCallError, ModelClient, ModelReply};
use serde_json::Value;

use crate::auth::{ProxyKey, RateLimiter};
use crate::metrics::{Metrics, KEY_SUMMARY_CALLS, KEY_SUMMARY_TOKENS};

/// A model client whose calls are charged to a key.
pub(crate) struct ChargedClient {
    inner: Arc<dyn ModelClient>,
    key: Arc<ProxyKey>,
    limiter: Arc<RateLimiter>,
    metrics: Arc<Metrics>,
}

impl ChargedClient {
    /// `inner`, its calls charged to `key` in `limiter` and counted in `metrics`.
    pub(super) fn new(
        inner: Arc<dyn ModelClient>,
        key: Arc<ProxyKey>,
        limiter: Arc<RateLimiter>,
        metrics: Arc<Metrics>,
    ) -> Self {
        Self {
            inner,
            key,
            limiter,
            metrics,
        }
    }
}

impl ModelClient for ChargedClient {
    fn complete(&self, body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        async move {
            let reply = self.inner.complete(body).await?;
            let tokens = used_tokens(&reply.body);
            let key = self.key.tenant.as_str();
            self.limiter
                .charge(key, self.key.tpm, tokens, Instant::now());
            self.metrics.add(KEY_SUMMARY_CALLS, &[("key", key)], 1.0);
            self.metrics
                .add(KEY_SUMMARY_TOKENS, &[("key", key)], tokens as f64);
            Ok(reply)
        }
        .boxed()
    }
}

/// The tokens an answer's `usage` says the call used, in any of the wire formats'
/// spellings (chat's prompt and completion, Anthropic's and Responses' input and
/// output, cached input included); 0 without a usage.
fn used_tokens(answer: &Value) -> u64 {
    let Some(usage) = answer.get("usage") else {
        return 0;
    };
    let field = |name: &str| usage.get(name).and_then(Value::as_u64).unwrap_or(0);
    if let Some(total) = usage.get("total_tokens").and_then(Value::as_u64) {
        return total;
    }
    field("prompt_tokens")
        + field("completion_tokens")
        + field("input_tokens")
        + field("output_tokens")
        + field("cache_creation_input_tokens")
        + field("cache_read_input_tokens")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_spelling_of_usage_is_counted() {
        assert_eq!(
            used_tokens(&json!({"usage": {"prompt_tokens": 7, "completion_tokens": 3}})),
            10
        );
        assert_eq!(
            used_tokens(
                &json!({"usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 11}})
            ),
            11
        );
        assert_eq!(
            used_tokens(
                &json!({"usage": {"input_tokens": 5, "output_tokens": 2, "cache_read_input_tokens": 40}})
            ),
            47
        );
        assert_eq!(used_tokens(&json!({"choices": []})), 0);
    }
}
