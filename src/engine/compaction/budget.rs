//! The token budget: how much input a request may use, when to compact, and the
//! estimate calibrated by what the upstream reports.

use handoff_plugin_api::{ModelInfo, TokenCounter};

pub use crate::base::calibration::Calibration;
use crate::base::digest::{bytes_key, hash_key};
use crate::compaction::pace::Limits;
use crate::config::{Config, ModelConfig, Tokenizer};
use crate::dialect::ChatRequest;
use crate::tokens::Tokens;

/// The budget of one request: known only when compaction is on and the model's window
/// is configured.
#[derive(Debug, Clone)]
pub struct RequestBudget {
    /// The model's entry.
    pub model: ModelConfig,
    /// Models and windows, for strategies.
    pub info: ModelInfo,
    /// Window − reserved output.
    pub input_budget: u64,
    /// `trigger × input_budget`.
    pub threshold: u64,
    /// Tokens of the request's `tools`.
    pub tools_tokens: u64,
    /// The summary model's tokenizer: its own entry's, else the request model's.
    pub summary_tokenizer: Tokenizer,
}

/// A view sent over the trigger without its own compaction (one is running) keeps
/// this share of the input budget free (1/100): a calibrated estimate may be that far
/// under the upstream's count, and a refusal costs a round trip and a reactive
/// compaction.
pub const COUNT_MARGIN: u64 = 100;

impl RequestBudget {
    /// The largest view sent over the trigger while its compaction runs elsewhere.
    pub fn sendable_over_trigger(&self) -> u64 {
        self.input_budget - self.input_budget / COUNT_MARGIN
    }

    /// The trigger, and the largest view sent while its compaction is written.
    pub fn limits(&self) -> Limits {
        Limits {
            trigger: self.threshold,
            deadline: self.sendable_over_trigger(),
        }
    }

    /// The budget for `request`, or `None` when it is never to be compacted.
    pub fn new(config: &Config, request: &ChatRequest, tokens: &Tokens) -> Option<Self> {
        if !config.compaction.enabled {
            return None;
        }
        let model = config.model(&request.model)?;
        let reserved = reserved_output(request.max_output, model);
        let tools_tokens = request.tools.as_ref().map_or(0, |tools| {
            let key = request
                .tools_digest
                .map_or_else(|| bytes_key(tools), hash_key);
            tokens.count_raw(model.tokenizer, &key, tools)
        });
        Self::recorded(config, &request.model, reserved, tools_tokens)
    }

    /// The budget of a request to `model` that reserved `reserved` tokens of output
    /// and carried `tools_tokens` of tools, as its logged decision says: what a manual
    /// compaction aims at, since the log keeps the messages but not the other fields.
    pub fn recorded(
        config: &Config,
        model: &str,
        reserved: u64,
        tools_tokens: u64,
    ) -> Option<Self> {
        if !config.compaction.enabled {
            return None;
        }
        let entry = config.model(model)?.clone();
        let input_budget = input_budget(&entry, reserved);
        let summary_model = config
            .compaction
            .summary_model
            .clone()
            .unwrap_or_else(|| model.to_owned());
        let summary_entry = config.model(&summary_model);
        let summary_window = summary_entry.map_or(entry.context_window, |m| m.context_window);
        let summary_tokenizer = summary_entry.map_or(entry.tokenizer, |m| m.tokenizer);
        Some(Self {
            info: ModelInfo {
                model: model.to_owned(),
                context_window: entry.context_window,
                summary_model,
                summary_context_window: summary_window,
            },
            input_budget,
            threshold: threshold(config.compaction.trigger, input_budget),
            tools_tokens,
            summary_tokenizer,
            model: entry,
        })
    }

    /// The request model's tokenizer.
    pub fn tokenizer(&self) -> Tokenizer {
        self.model.tokenizer
    }
}

/// Output reserved for the reply: the request's `max_tokens`, else the model's
/// `default_output_reserve`, else `min(8192, window/10)`.
pub(crate) fn reserved_output(request_max: Option<u64>, model: &ModelConfig) -> u64 {
    request_max
        .or(model.default_output_reserve)
        .unwrap_or_else(|| 8192.min(model.context_window / 10))
}

/// Tokens the input may use: window − reserved output.
pub fn input_budget(model: &ModelConfig, reserved: u64) -> u64 {
    model.context_window.saturating_sub(reserved)
}

/// The estimate above which a view is compacted: `trigger × input_budget`.
pub fn threshold(trigger: f64, input_budget: u64) -> u64 {
    (trigger * input_budget as f64) as u64
}

/// The one count every compaction decision uses: local tiktoken counts turned into
/// what the upstream would count. The trigger, the split, the loop guard, the records
/// and every error message go through it, so a model that counts 1.5× tiktoken is
/// compacted before it rejects a request, not after.
#[derive(Debug, Clone, Default)]
pub struct Scale {
    anchor: Option<Calibration>,
    ratio: Option<f64>,
}

impl Scale {
    /// The scale the conversation's last calibration supports for `model`; counts stay
    /// local when there is none (or it was for another model).
    pub fn new(calibration: Option<&Calibration>, model: &str) -> Self {
        let anchor = calibration
            .filter(|c| c.model == model && c.local > 0)
            .cloned();
        // Clamped as in the seed's source: a wild report must not make every view huge.
        let ratio = anchor
            .as_ref()
            .map(|c| (c.server as f64 / c.local as f64).clamp(0.2, 2.0));
        Self { anchor, ratio }
    }

    /// True when a calibration backs the counts.
    pub(crate) fn is_calibrated(&self) -> bool {
        self.ratio.is_some()
    }

    /// The upstream's count for `local` tokens of any text.
    pub fn tokens(&self, local: u64) -> u64 {
        match self.ratio {
            Some(ratio) => (local as f64 * ratio).ceil() as u64,
            None => local,
        }
    }

    /// The upstream's count for a view whose local count is `local`. On the view the
    /// calibration was measured on (the same compaction) it extends the reported
    /// size: `server + (local − local_then) × ratio`; on another, it scales.
    pub fn view(&self, local: u64, compact_id: Option<&str>) -> u64 {
        match (&self.anchor, self.ratio) {
            (Some(cal), Some(ratio)) if cal.compact_id.as_deref() == compact_id => {
                let delta = local as f64 - cal.local as f64;
                (cal.server as f64 + delta * ratio).max(0.0).round() as u64
            }
            _ => self.tokens(local),
        }
    }
}

/// A strategy's token counter that counts as the upstream does: summary requests
/// to the conversation's own model must fit what that model counts, not tiktoken.
pub(crate) struct ScaledCounter {
    /// The local counter.
    pub inner: std::sync::Arc<dyn TokenCounter>,
    /// The conversation's scale.
    pub scale: Scale,
}

impl TokenCounter for ScaledCounter {
    fn count_text(&self, text: &str) -> u64 {
        self.scale.tokens(self.inner.count_text(text))
    }

    fn count_message(&self, message: &serde_json::Value) -> u64 {
        self.scale.tokens(self.inner.count_message(message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Tokenizer;

    fn model(window: u64, reserve: Option<u64>) -> ModelConfig {
        ModelConfig {
            context_window: window,
            tokenizer: Tokenizer::O200k,
            default_output_reserve: reserve,
            reasoning_marker: false,
            compaction: None,
            api: None,
            native_compaction: None,
        }
    }

    #[test]
    fn reserved_output_prefers_the_request_then_the_model_then_a_tenth() {
        assert_eq!(reserved_output(Some(500), &model(128_000, Some(4000))), 500);
        assert_eq!(reserved_output(None, &model(128_000, Some(4000))), 4000);
        assert_eq!(reserved_output(None, &model(128_000, None)), 8192);
        assert_eq!(reserved_output(None, &model(16_000, None)), 1600);
        assert_eq!(input_budget(&model(16_000, None), 1600), 14_400);
        assert_eq!(threshold(0.9, 14_400), 12_960);
    }

    #[test]
    fn calibration_scales_the_delta_and_clamps_the_ratio() {
        let cal = Calibration {
            model: "m".into(),
            compact_id: None,
            local: 1000,
            server: 1500,
        };
        let scale = Scale::new(Some(&cal), "m");
        assert_eq!(scale.view(1200, None), 1500 + 300);
        assert_eq!(
            scale.view(1200, Some("cmp-1")),
            1800,
            "another compaction is scaled, not anchored"
        );
        assert_eq!(scale.tokens(100), 150);
        let other = Scale::new(Some(&cal), "other");
        assert_eq!(other.view(1200, None), 1200, "another model stays local");
        let wild = Calibration {
            server: 10_000,
            ..cal
        };
        assert_eq!(
            Scale::new(Some(&wild), "m").view(1100, None),
            10_000 + 200,
            "ratio clamped to 2.0"
        );
        assert_eq!(Scale::default().view(1234, Some("x")), 1234);
    }
}
