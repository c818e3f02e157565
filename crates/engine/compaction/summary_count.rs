//! Counting summary requests as the summary model counts them. A summary model other
//! than the conversation's has its own tokenizer (`models."X".tokenizer`) and its own
//! calibration, learned from what it reports: the `usage.prompt_tokens` of each reply,
//! or the prompt size a context error names ([`crate::dialect::overflow`]). A prompt
//! planned with the request model's tokenizer can be a quarter larger in a small
//! model's, fill its window and end in `length`.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{ModelCallError, ModelClient, ModelReply, StrategyInput, TokenCounter};
use serde_json::Value;

use super::budget::{Scale, ScaledCounter};
use crate::base::calibration::Calibration;
use crate::config::Tokenizer;
use crate::tokens::Tokens;

/// Summary models whose counts were measured; a few, as configured, so a small cap.
const MODELS_KEPT: u64 = 256;

/// The last calibration of each summary model, shared by every conversation.
#[derive(Clone)]
pub struct SummaryCalibrations(moka::sync::Cache<String, Calibration>);

impl Default for SummaryCalibrations {
    fn default() -> Self {
        Self(moka::sync::Cache::new(MODELS_KEPT))
    }
}

impl SummaryCalibrations {
    /// The scale measured for `model`; local counts when none was.
    pub fn scale(&self, model: &str) -> Scale {
        Scale::new(self.0.get(model).as_ref(), model)
    }

    /// Gives `input` the counter and client of its summary model: counted with
    /// `tokenizer` and this model's calibration (the conversation's `own` scale when it
    /// is the request's model), and a client that measures each call.
    pub(crate) fn equip(
        &self,
        input: &mut StrategyInput,
        tokens: &Arc<Tokens>,
        tokenizer: Tokenizer,
        own: &Scale,
    ) {
        let model = input.model.summary_model.clone();
        let local = tokens.counter(tokenizer);
        let scale = if model == input.model.model {
            own.clone()
        } else {
            self.scale(&model)
        };
        input.tokens = Arc::new(ScaledCounter {
            inner: Arc::clone(&local),
            scale,
        });
        input.client = Arc::new(Measuring {
            inner: Arc::clone(&input.client),
            local,
            calibrations: self.clone(),
        });
    }

    fn learn(&self, model: &str, local: u64, server: u64) {
        if local == 0 || server == 0 {
            return;
        }
        tracing::debug!(model, local, server, "summary model calibrated");
        self.0.insert(
            model.to_owned(),
            Calibration::new(model.to_owned(), None, local, server),
        );
    }
}

/// A model client that compares each summary request's local count with what the
/// model reports for it.
struct Measuring {
    inner: Arc<dyn ModelClient>,
    local: Arc<dyn TokenCounter>,
    calibrations: SummaryCalibrations,
}

impl ModelClient for Measuring {
    fn complete(&self, body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        let model = body["model"].as_str().unwrap_or_default().to_owned();
        let local: u64 = body["messages"]
            .as_array()
            .map_or(0, |m| m.iter().map(|m| self.local.count_message(m)).sum());
        async move {
            let reply = self.inner.complete(body).await?;
            if let Some(server) = reported_prompt(&reply.body) {
                self.calibrations.learn(&model, local, server);
            }
            Ok(reply)
        }
        .boxed()
    }
}

/// The prompt size a reply reports: its usage, or the count a context error names.
fn reported_prompt(body: &Value) -> Option<u64> {
    body.pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .or_else(|| crate::dialect::overflow::prompt_tokens_named(body))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    struct Fixed(Value);
    impl ModelClient for Fixed {
        fn complete(&self, _body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
            let body = self.0.clone();
            async move { Ok(ModelReply { status: 200, body }) }.boxed()
        }
    }

    fn input(reply: Value) -> StrategyInput {
        let mut input = handoff_plugin_api::testing::input(vec![], 8000, 800);
        input.model.summary_model = "small".into();
        input.client = Arc::new(Fixed(reply));
        input
    }

    #[tokio::test]
    async fn a_summary_model_is_counted_as_it_reports() {
        let tokens = Arc::new(Tokens::new(crate::dialect::text::message_text));
        let calibrations = SummaryCalibrations::default();
        let mut first = input(json!({"usage": {"prompt_tokens": 0}}));
        calibrations.equip(&mut first, &tokens, Tokenizer::O200k, &Scale::default());
        let text = "word ".repeat(400);
        let uncalibrated = first.tokens.count_text(&text);
        let body = json!({"model": "small", "messages": [{"role": "user", "content": text}]});
        let local = tokens
            .counter(Tokenizer::O200k)
            .count_message(&body["messages"][0]);
        let reply = json!({"error": {"message": "the request exceeds the available context size", "n_prompt_tokens": local * 5 / 4}});
        let mut second = input(reply);
        calibrations.equip(&mut second, &tokens, Tokenizer::O200k, &Scale::default());
        second.client.complete(body).await.unwrap();
        let mut third = input(json!({}));
        calibrations.equip(&mut third, &tokens, Tokenizer::O200k, &Scale::default());
        let calibrated = third.tokens.count_text(&text);
        assert!(
            calibrated >= uncalibrated * 5 / 4 && calibrated <= uncalibrated * 5 / 4 + 2,
            "{uncalibrated} → {calibrated}"
        );
        assert_eq!(
            calibrations.scale("other").tokens(100),
            100,
            "another model keeps local counts"
        );
    }

    #[test]
    fn the_summary_models_own_tokenizer_counts() {
        let tokens = Arc::new(Tokens::new(crate::dialect::text::message_text));
        let mut with_estimate = input(json!({}));
        SummaryCalibrations::default().equip(
            &mut with_estimate,
            &tokens,
            Tokenizer::Estimate,
            &Scale::default(),
        );
        let text = "a".repeat(4000);
        assert_eq!(with_estimate.tokens.count_text(&text), 1000);
    }
}
