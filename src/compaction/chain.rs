//! Running the strategy chain: each strategy in order until one produces a handoff,
//! each attempt timed out, recorded with its outcome and usage, and the whole run
//! abandoned if it is cancelled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use handoff_plugin_api::{AttemptError, FailureReason, Strategy, StrategyInput, Summary};
use serde_json::{json, Map, Value};

use super::record::Attempt;

/// A strategy with its name in the chain.
#[derive(Clone)]
pub struct NamedStrategy {
    /// The name used in config and records.
    pub name: String,
    /// The strategy.
    pub strategy: Arc<dyn Strategy>,
}

/// What a chain run produced.
pub struct ChainOutcome {
    /// The strategy name and summary that succeeded, if any.
    pub summary: Option<(String, Summary)>,
    /// Every attempt, in order.
    pub attempts: Vec<Attempt>,
}

fn reason_name(reason: FailureReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "failed".into())
}

/// Tries each strategy of `chain` until one succeeds or the run is cancelled.
pub async fn run_chain(
    chain: &[NamedStrategy],
    input: &StrategyInput,
    timeout: Duration,
) -> ChainOutcome {
    let mut attempts = Vec::new();
    for named in chain {
        if input.cancel.is_cancelled() {
            break;
        }
        let started = Instant::now();
        let result = tokio::select! {
            () = input.cancel.cancelled() => Err(AttemptError::new(FailureReason::Cancelled, "compaction cancelled")),
            timed = tokio::time::timeout(timeout, named.strategy.summarize(input)) => match timed {
                Ok(result) => result,
                Err(_) => Err(AttemptError::new(FailureReason::Timeout, format!("no summary within {timeout:?}"))),
            },
        };
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match result {
            Ok(summary) => {
                attempts.push(Attempt {
                    strategy: named.name.clone(),
                    outcome: "ok".into(),
                    reason: None,
                    error: None,
                    usage: summary.usage.clone(),
                    duration_ms,
                });
                return ChainOutcome {
                    summary: Some((named.name.clone(), summary)),
                    attempts,
                };
            }
            Err(err) => {
                tracing::warn!(strategy = %named.name, reason = ?err.reason, error = %err.message, "compaction attempt failed");
                attempts.push(Attempt {
                    strategy: named.name.clone(),
                    outcome: "failed".into(),
                    reason: Some(reason_name(err.reason)),
                    error: Some(err.message),
                    usage: err.usage,
                    duration_ms,
                });
            }
        }
    }
    ChainOutcome {
        summary: None,
        attempts,
    }
}

/// Adds up the numeric fields of every attempt's usage.
pub fn sum_usage(attempts: &[Attempt]) -> Value {
    let mut total = Map::new();
    for usage in attempts.iter().filter_map(|a| a.usage.as_ref()) {
        for (key, value) in usage.as_object().into_iter().flatten() {
            if let Some(n) = value.as_u64() {
                let sum = total.get(key).and_then(Value::as_u64).unwrap_or(0) + n;
                total.insert(key.clone(), json!(sum));
            }
        }
    }
    Value::Object(total)
}
