//! A conversation's bill: each reply's usage and each compaction's summary calls at
//! the configured `[prices]`; a model with no price is unpriced, never free.

use std::collections::BTreeMap;

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
}
