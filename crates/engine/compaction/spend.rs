//! What a compaction's summary calls cost at the configured `[prices]`: each attempt
//! that called a model records the model and its (chat-shaped) usage, priced here for
//! the metrics as it commits, and for `audit show` and the timeline from the record.

use std::collections::BTreeMap;

use crate::base::record::CompactionRecord;
use crate::config::{price_of, Price};
use crate::dialect::DialectKind;

/// One attempt's summary calls, priced.
#[derive(Debug, Clone, PartialEq)]
pub enum Priced<'a> {
    /// Their cost, by the `[prices]` entry that priced them.
    Cost {
        /// The entry.
        price: &'a str,
        /// US dollars.
        usd: f64,
    },
    /// Their model has no price: unpriced, never free.
    Unpriced(&'a str),
}

/// The summary calls of each attempt of `record` that called a model, priced.
pub fn summary_calls<'a>(
    prices: &'a BTreeMap<String, Price>,
    record: &'a CompactionRecord,
) -> impl Iterator<Item = Priced<'a>> + 'a {
    record.attempts.iter().filter_map(move |attempt| {
        let (model, usage) = (attempt.model.as_deref()?, attempt.usage.as_ref()?);
        let billed = DialectKind::OpenAiChat.get().billed(usage)?;
        Some(match price_of(prices, model) {
            Some((price, rate)) => Priced::Cost {
                price,
                usd: rate.cost(&billed),
            },
            None => Priced::Unpriced(model),
        })
    })
}
