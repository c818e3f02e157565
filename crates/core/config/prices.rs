//! `[prices."<model>"]`: what a model's tokens cost, in US dollars per million, by
//! price class (fresh input, cache reads, cache writes, output), and the bill of one
//! reply's usage. A model matches its exact key, else the longest key that prefixes
//! it, as `[models]` do; a model with no price is unpriced, never free.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// One model's prices, US dollars per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Input tokens read fresh (not from a cache).
    pub input: f64,
    /// Output tokens, reasoning included.
    pub output: f64,
    /// Input tokens read from the provider's prompt cache; `input` when unset.
    #[serde(default)]
    pub cache_read: Option<f64>,
    /// Input tokens written to the prompt cache (Anthropic's five-minute writes);
    /// `input` when unset.
    #[serde(default)]
    pub cache_write: Option<f64>,
}

/// A reply's tokens by price class, as its usage reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Billed {
    /// Input read fresh.
    pub input: u64,
    /// Input read from the cache.
    pub cache_read: u64,
    /// Input written to the cache.
    pub cache_write: u64,
    /// Output.
    pub output: u64,
}

impl Billed {
    /// The two bills together.
    pub fn add(&mut self, other: Billed) {
        self.input += other.input;
        self.cache_read += other.cache_read;
        self.cache_write += other.cache_write;
        self.output += other.output;
    }
}

impl Price {
    /// What `billed` costs, in US dollars.
    pub fn cost(&self, billed: &Billed) -> f64 {
        let per_token = |tokens: u64, price: f64| tokens as f64 * price / 1_000_000.0;
        per_token(billed.input, self.input)
            + per_token(billed.cache_read, self.cache_read.unwrap_or(self.input))
            + per_token(billed.cache_write, self.cache_write.unwrap_or(self.input))
            + per_token(billed.output, self.output)
    }
}

/// The price of `model` in `prices`, with the key that gave it: its exact key, else
/// the longest key that prefixes it; `None` when it has none.
pub fn price_of<'p>(
    prices: &'p BTreeMap<String, Price>,
    model: &str,
) -> Option<(&'p str, &'p Price)> {
    match prices.get_key_value(model) {
        Some((key, price)) => Some((key.as_str(), price)),
        None => prices
            .iter()
            .filter(|(key, _)| model.starts_with(key.as_str()))
            .max_by_key(|(key, _)| key.len())
            .map(|(key, price)| (key.as_str(), price)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_bill_is_each_class_at_its_price_and_a_model_matches_its_longest_prefix() {
        let prices: BTreeMap<String, Price> = serde_json::from_value(serde_json::json!({
            "claude-sonnet-4-5": {"input": 3.0, "output": 15.0, "cache_read": 0.3, "cache_write": 3.75},
            "claude": {"input": 99.0, "output": 99.0},
            "gpt-4o": {"input": 2.5, "output": 10.0},
        }))
        .unwrap();
        let (key, sonnet) = price_of(&prices, "claude-sonnet-4-5-20250929").unwrap();
        assert_eq!(key, "claude-sonnet-4-5");
        let billed = Billed {
            input: 1_000,
            cache_read: 100_000,
            cache_write: 20_000,
            output: 2_000,
        };
        // 0.003 + 0.03 + 0.075 + 0.03
        assert!((sonnet.cost(&billed) - 0.138).abs() < 1e-12);
        // Unset cache prices are the input price.
        let (_, gpt) = price_of(&prices, "gpt-4o").unwrap();
        assert!((gpt.cost(&billed) - (121_000.0 * 2.5 + 2_000.0 * 10.0) / 1e6).abs() < 1e-12);
        assert_eq!(price_of(&prices, "llama-3"), None, "unpriced, never free");
    }

    #[test]
    fn the_default_prices_price_dated_names_and_an_override_wins() {
        let config =
            crate::config::from_toml("[prices.\"gpt-4o\"]\ninput = 1.0\noutput = 2.0\n").unwrap();
        let key = |model: &str| config.price(model).map(|(key, _)| key.to_owned());
        assert_eq!(
            key("claude-sonnet-4-5-20250929").as_deref(),
            Some("claude-sonnet-4")
        );
        assert_eq!(
            key("claude-opus-4-5-20251101").as_deref(),
            Some("claude-opus-4-5")
        );
        assert_eq!(
            key("gpt-4o-mini-2024-07-18").as_deref(),
            Some("gpt-4o-mini")
        );
        assert_eq!(
            key("SmolLM2-135M-Instruct"),
            None,
            "an open model is unpriced"
        );
        let (_, gpt) = config.price("gpt-4o-2024-08-06").unwrap();
        // An override replaces the fields it names; the others stay the default's.
        assert_eq!(
            (gpt.input, gpt.output, gpt.cache_read),
            (1.0, 2.0, Some(1.25))
        );
    }
}
