//! The token budget: how much input a request may use, when to compact, and the
//! estimate calibrated by what the upstream reports.

use handoff_plugin_api::{ModelInfo, TokenCounter};

pub use crate::base::calibration::{Calibration, Margin, MarginFrom};
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

/// The margin of a conversation whose estimates were not checked against the
/// upstream's counts yet: a calibration from one report has been seen 1.5% short of
/// the next count (the newest messages tokenise differently from the rest).
const FIXED_MARGIN: f64 = 0.03;

/// The least margin kept however close the estimates have been.
const LEAST_MARGIN: f64 = 0.01;

/// The most: past it the trigger (0.9 of the budget by default) leaves nothing to send
/// early, and the request waits or takes a stand-in.
const MOST_MARGIN: f64 = 0.10;

impl RequestBudget {
    /// The largest view sent over the trigger without waiting for its compaction: the
    /// input budget less `margin`.
    pub fn sendable_over_trigger(&self, margin: &Margin) -> u64 {
        self.input_budget.saturating_sub(margin.tokens)
    }

    /// The margin a view sent over the trigger without waiting keeps, for counts scaled
    /// by `scale`: twice the conversation's calibration spread (its estimates' recent
    /// miss, so one miss as large again is still sent safely), within 1% and 10% of
    /// the input budget; 3% until the spread is measured.
    pub fn margin(&self, scale: &Scale) -> Margin {
        let (share, from) = match scale.spread() {
            Some(spread) => (
                (2.0 * spread).clamp(LEAST_MARGIN, MOST_MARGIN),
                MarginFrom::Spread,
            ),
            None => (FIXED_MARGIN, MarginFrom::Fixed),
        };
        // Whole thousandths, rounded up: the log says the share that was kept.
        let per_mille = (share * 1000.0).ceil() as u32;
        Margin {
            per_mille,
            tokens: (self.input_budget * u64::from(per_mille)).div_ceil(1000),
            from,
        }
    }

    /// The trigger, and the largest view sent while its compaction is written.
    pub fn limits(&self, margin: &Margin) -> Limits {
        Limits {
            trigger: self.threshold,
            deadline: self.sendable_over_trigger(margin),
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
}

impl Scale {
    /// The scale the conversation's last calibration supports for `model`; counts stay
    /// local when there is none (or it was for another model).
    pub fn new(calibration: Option<&Calibration>, model: &str) -> Self {
        let anchor = calibration
            .filter(|c| c.model == model && c.local > 0)
            .cloned();
        Self { anchor }
    }

    /// True when a calibration backs the counts.
    pub(crate) fn is_calibrated(&self) -> bool {
        self.anchor.is_some()
    }

    /// How far the conversation's calibrated estimates fell short of the upstream's
    /// counts, when that was measured.
    pub fn spread(&self) -> Option<f64> {
        self.anchor.as_ref().and_then(|anchor| anchor.spread)
    }

    /// The upstream's count for `local` tokens of any text.
    pub fn tokens(&self, local: u64) -> u64 {
        match &self.anchor {
            Some(anchor) => (local as f64 * anchor.ratio()).ceil() as u64,
            None => local,
        }
    }

    /// The upstream's count for a view whose local count is `local`. On the view the
    /// calibration was measured on (the same compaction) it extends the reported
    /// size: `server + (local − local_then) × ratio`; on another, it scales.
    pub fn view(&self, local: u64, compact_id: Option<&str>) -> u64 {
        match &self.anchor {
            Some(anchor) => anchor.predict(local, compact_id),
            None => local,
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
        let cal = Calibration::new("m".into(), None, 1000, 1500);
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

    #[test]
    fn an_early_send_keeps_a_fixed_margin_until_the_spread_is_measured_then_twice_it() {
        let config =
            crate::config::from_toml("[models.\"gpt-4o\"]\ncontext_window = 128000\n").unwrap();
        let budget = RequestBudget::recorded(&config, "gpt-4o", 8000, 0).unwrap();
        let once = Calibration::new("gpt-4o".into(), None, 1000, 1000);
        let fixed = budget.margin(&Scale::new(Some(&once), "gpt-4o"));
        assert_eq!((fixed.per_mille, fixed.from), (30, MarginFrom::Fixed));
        assert_eq!(
            budget.sendable_over_trigger(&fixed),
            budget.input_budget - fixed.tokens
        );
        let measured = |spread| {
            let calibration = Calibration {
                spread: Some(spread),
                ..once.clone()
            };
            budget.margin(&Scale::new(Some(&calibration), "gpt-4o"))
        };
        let spread = measured(0.015);
        assert_eq!(spread.from, MarginFrom::Spread);
        assert_eq!(spread.per_mille, 30);
        assert_eq!(spread.tokens, (budget.input_budget * 30).div_ceil(1000));
        assert_eq!(measured(0.0).per_mille, 10, "the least margin");
        assert_eq!(measured(0.4).per_mille, 100, "the most");
    }
}
