//! Calibration: the last input size the upstream reported for a conversation, next
//! to the local estimate of the same view, and how far the estimates before it fell
//! short.

use serde::{Deserialize, Serialize};

/// A report's spread carried to the next is this share of it: an early miss (the first
/// view on a new handoff, say) fades in a few turns instead of widening every margin
/// for the rest of the conversation.
const SPREAD_DECAY: f64 = 0.8;

/// The last upstream-reported input size, and the local estimate of the same view.
#[derive(Debug, Clone, PartialEq)]
pub struct Calibration {
    /// Model of the request.
    pub model: String,
    /// The compaction the view was built on (`None`: no compaction).
    pub compact_id: Option<String>,
    /// Local estimate of that view.
    pub local: u64,
    /// `usage.prompt_tokens` the upstream reported for it.
    pub server: u64,
    /// The share of the upstream's count by which the calibrated estimate of the
    /// conversation's recent views fell short of it (decayed per report); `None` until
    /// a report could be checked against the one before it.
    pub spread: Option<f64>,
}

impl Calibration {
    /// The upstream counted `server` tokens for a view of `model` counted `local`
    /// locally, built on `compact_id`; no spread measured yet.
    pub fn new(model: String, compact_id: Option<String>, local: u64, server: u64) -> Self {
        Self {
            model,
            compact_id,
            local,
            server,
            spread: None,
        }
    }

    /// The upstream's count per local token, clamped as in the seed's source: a wild
    /// report must not make every view huge.
    pub fn ratio(&self) -> f64 {
        (self.server as f64 / self.local.max(1) as f64).clamp(0.2, 2.0)
    }

    /// What this calibration predicts the upstream counts for a view counted `local`
    /// built on `compact_id`: on the view it was measured on (the same compaction) it
    /// extends the reported size by the scaled difference; on another, it scales.
    pub fn predict(&self, local: u64, compact_id: Option<&str>) -> u64 {
        let ratio = self.ratio();
        if self.compact_id.as_deref() == compact_id {
            let delta = local as f64 - self.local as f64;
            (self.server as f64 + delta * ratio).max(0.0).round() as u64
        } else {
            (local as f64 * ratio).ceil() as u64
        }
    }

    /// This report, following `previous`: its spread is how far `previous` predicted
    /// short of this count, or the decayed spread carried, whichever is larger. Only a
    /// count under the upstream's is a miss: an estimate over it costs no refusal.
    pub fn after(mut self, previous: Option<&Calibration>) -> Self {
        let Some(previous) = previous.filter(|p| p.model == self.model && p.local > 0) else {
            return self;
        };
        let predicted = previous.predict(self.local, self.compact_id.as_deref());
        let short = self.server.saturating_sub(predicted) as f64 / self.server.max(1) as f64;
        let carried = previous.spread.map_or(0.0, |spread| spread * SPREAD_DECAY);
        self.spread = Some(short.max(carried));
        self
    }
}

/// The share of the input budget a view sent over the trigger without waiting for its
/// compaction keeps free, for the error of its estimate, and where that came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Margin {
    /// The share of the input budget kept free, in thousandths.
    pub per_mille: u32,
    /// Those tokens.
    pub tokens: u64,
    /// `spread`: from the conversation's measured calibration spread; `fixed`: none
    /// measured yet.
    pub from: MarginFrom,
}

/// Where a [`Margin`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MarginFrom {
    /// Twice the conversation's calibration spread, within bounds.
    Spread,
    /// The fixed margin of a conversation whose estimates were not checked yet.
    Fixed,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_report_under_its_prediction_is_a_spread_and_the_spread_decays() {
        let first = Calibration::new("m".into(), None, 1000, 1000);
        assert_eq!(first.spread, None, "nothing to check the first against");
        // Predicted 1000 + 1000 = 2000; the upstream counted 2050: 2050 - 2000 short.
        let second = Calibration::new("m".into(), None, 2000, 2050).after(Some(&first));
        let spread = second.spread.unwrap();
        assert!((spread - 50.0 / 2050.0).abs() < 1e-9, "{spread}");
        // Predicted exactly: the spread carried, decayed.
        let predicted = second.predict(3000, None);
        let third = Calibration::new("m".into(), None, 3000, predicted).after(Some(&second));
        assert!((third.spread.unwrap() - spread * SPREAD_DECAY).abs() < 1e-9);
        // Over-counted by the estimate: no miss.
        let over = Calibration::new("m".into(), None, 2000, 1500).after(Some(&first));
        assert_eq!(over.spread, Some(0.0));
        // Another model's report checks nothing.
        let other = Calibration::new("n".into(), None, 2000, 2500).after(Some(&first));
        assert_eq!(other.spread, None);
    }
}
