//! A conversation's bill: each reply's usage and each compaction's summary calls at
//! the configured `[prices]`; a model with no price is unpriced, never free.

use std::collections::{BTreeMap, HashMap};

use serde_json::{json, Value};

use crate::base::record::CompactionRecord;
use crate::compaction::spend::{summary_calls, Priced};
use crate::config::{price_of, Billed, Price};
use crate::dialect::DialectKind;
use crate::redact::strip_controls;

/// What the replies of a conversation cost at the configured prices, and those whose
/// model has none: unpriced, never free.
#[derive(Debug, Default)]
pub(super) struct Bill {
    usd: f64,
    priced: usize,
    unpriced: std::collections::BTreeSet<String>,
    unpriced_replies: usize,
    /// What the summary calls of its compactions cost, and how many attempts made them.
    summaries_usd: f64,
    summaries: usize,
    /// Input tokens compactions kept out of priced requests, and what those would
    /// have cost read from the provider's cache and read fresh: what compaction saved,
    /// at least and at most.
    kept_out: u64,
    saved_cached_usd: f64,
    saved_fresh_usd: f64,
}

/// The input tokens each compaction keeps out of the views built on it, by id: what it
/// removed from the view before it, and what the compactions under it had removed.
pub(super) fn kept_out(records: &[CompactionRecord]) -> HashMap<&str, u64> {
    let mut out: HashMap<&str, u64> = HashMap::new();
    for record in records {
        let under = (record.source.previous_compaction.as_deref())
            .and_then(|previous| out.get(previous).copied())
            .unwrap_or(0);
        let removed = record.tokens_before.saturating_sub(record.tokens_after);
        out.insert(record.id.as_str(), under + removed);
    }
    out
}

impl Bill {
    /// Adds a reply of `model` that billed `billed`; what `show` says of its cost.
    pub(super) fn add(
        &mut self,
        prices: &BTreeMap<String, Price>,
        model: &str,
        billed: Billed,
    ) -> String {
        match price_of(prices, model) {
            Some((_, price)) => {
                let cost = price.cost(&billed);
                self.usd += cost;
                self.priced += 1;
                format!(" cost=${cost:.6}")
            }
            None => {
                self.unpriced.insert(strip_controls(model).into_owned());
                self.unpriced_replies += 1;
                " unpriced".to_owned()
            }
        }
    }
}

impl Bill {
    /// Adds the summary calls of `record`'s attempts, billed as their (chat-shaped)
    /// usage says at their model's price: their cost, `None` when one is unpriced.
    pub(super) fn add_compaction(
        &mut self,
        prices: &BTreeMap<String, Price>,
        record: &CompactionRecord,
    ) -> Option<f64> {
        let mut cost = 0.0;
        let mut unpriced = false;
        for priced in summary_calls(prices, record) {
            match priced {
                Priced::Cost { usd, .. } => {
                    cost += usd;
                    self.summaries += 1;
                }
                Priced::Unpriced(model) => {
                    unpriced = true;
                    self.unpriced.insert(strip_controls(model).into_owned());
                    self.unpriced_replies += 1;
                }
            }
        }
        self.summaries_usd += cost;
        (!unpriced).then_some(cost)
    }
}

impl Bill {
    /// Notes that a priced request of `model` went without `tokens` of input, kept out
    /// by the compaction its view used.
    pub(super) fn kept_out(&mut self, prices: &BTreeMap<String, Price>, model: &str, tokens: u64) {
        let Some((_, price)) = price_of(prices, model).filter(|_| tokens > 0) else {
            return;
        };
        let per_token = |usd_per_million: f64| tokens as f64 * usd_per_million / 1e6;
        self.kept_out += tokens;
        self.saved_cached_usd += per_token(price.cache_read.unwrap_or(price.input));
        self.saved_fresh_usd += per_token(price.input);
    }
}

impl std::fmt::Display for Bill {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "bill: ${:.6} for {} priced replies",
            self.usd + self.summaries_usd,
            self.priced
        )?;
        if self.summaries > 0 {
            write!(
                f,
                " and {} summary attempts (${:.6})",
                self.summaries, self.summaries_usd
            )?;
        }
        if self.kept_out > 0 {
            write!(
                f,
                "; compactions kept {} input tokens out of its requests: ${:.6} read from the cache, ${:.6} uncached",
                self.kept_out, self.saved_cached_usd, self.saved_fresh_usd
            )?;
        }
        if self.unpriced_replies > 0 {
            let models: Vec<&str> = self.unpriced.iter().map(String::as_str).collect();
            write!(
                f,
                "; {} unpriced (no [prices] entry for {})",
                self.unpriced_replies,
                models.join(", ")
            )?;
        }
        Ok(())
    }
}

impl Bill {
    /// What a reply's `usage` cost, `None` when unpriced or usage says nothing; added.
    pub(super) fn reply(
        &mut self,
        prices: &BTreeMap<String, Price>,
        dialect: DialectKind,
        model: &str,
        usage: &Value,
    ) -> Option<f64> {
        let billed = dialect.get().billed(usage)?;
        let before = self.usd;
        let priced = self.priced;
        self.add(prices, model, billed);
        (self.priced > priced).then_some(self.usd - before)
    }

    /// The bill as the timeline gives it.
    pub(super) fn json(&self) -> Value {
        json!({
            "usd": self.usd + self.summaries_usd,
            "replies_usd": self.usd,
            "priced_replies": self.priced,
            "summaries_usd": self.summaries_usd,
            "summary_attempts": self.summaries,
            "unpriced": self.unpriced_replies,
            "unpriced_models": self.unpriced,
            "kept_out_tokens": self.kept_out,
            "saved_cached_usd": self.saved_cached_usd,
            "saved_fresh_usd": self.saved_fresh_usd,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_are_priced_by_their_model_and_an_unpriced_one_is_named() {
        let prices: BTreeMap<String, Price> = [(
            "m".to_owned(),
            Price {
                input: 1.0,
                output: 2.0,
                cache_read: None,
                cache_write: None,
            },
        )]
        .into();
        let mut bill = Bill::default();
        let usage = json!({"prompt_tokens": 1_000_000, "completion_tokens": 500_000});
        assert_eq!(
            bill.reply(&prices, DialectKind::OpenAiChat, "m-1", &usage),
            Some(2.0)
        );
        assert_eq!(
            bill.reply(&prices, DialectKind::OpenAiChat, "x", &usage),
            None
        );
        let json = bill.json();
        assert_eq!(json["usd"], 2.0);
        assert_eq!(json["unpriced"], 1);
        assert_eq!(json["unpriced_models"], json!(["x"]));
        assert_eq!(
            bill.to_string(),
            "bill: $2.000000 for 1 priced replies; 1 unpriced (no [prices] entry for x)"
        );
    }

    #[test]
    fn what_compactions_kept_out_is_priced_cached_and_uncached() {
        let prices: BTreeMap<String, Price> = [(
            "m".to_owned(),
            Price {
                input: 3.0,
                output: 15.0,
                cache_read: Some(0.3),
                cache_write: Some(3.75),
            },
        )]
        .into();
        let record = |id: &str, previous: Option<&str>, before: u64, after: u64| {
            let value = json!({
                "v": 1, "id": id, "kind": "compaction", "at": "2026-12-07T00:00:00Z",
                "reason": "threshold", "strategy": "extract", "chain": ["extract"], "policy_version": 1, "usage": {},
                "tokens_before": before, "tokens_after": after, "attempts": [],
                "continuation": {"role": "user", "content": "c"},
                "handoff": {"role": "assistant", "content": "h"},
                "source": {"start": 0, "end_exclusive": 2, "prefix_digest": "00".repeat(32),
                           "history_digest": "00".repeat(32), "tool_call_ids": []}
            });
            // From text: the digest deserialises borrowed.
            let mut record: CompactionRecord = serde_json::from_str(&value.to_string()).unwrap();
            record.source.previous_compaction = previous.map(str::to_owned);
            record
        };
        let records = [
            record("a", None, 30_000, 10_000),
            record("b", Some("a"), 28_000, 9_000),
        ];
        let kept = kept_out(&records);
        assert_eq!(kept["a"], 20_000);
        assert_eq!(kept["b"], 39_000, "b's own and what a had removed");
        let mut bill = Bill::default();
        bill.kept_out(&prices, "m", 1_000_000);
        bill.kept_out(&prices, "unpriced-model", 1_000_000);
        let json = bill.json();
        assert_eq!(json["kept_out_tokens"], 1_000_000);
        assert_eq!(json["saved_cached_usd"], 0.3);
        assert_eq!(json["saved_fresh_usd"], 3.0);
        assert!(bill
            .to_string()
            .ends_with("compactions kept 1000000 input tokens out of its requests: $0.300000 read from the cache, $3.000000 uncached"));
    }
}
