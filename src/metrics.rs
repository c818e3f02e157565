//! Counters for `/handoff/metrics`, in the Prometheus text format.
//!
//! A handful of labelled counters and one duration summary do not justify a metrics
//! framework; the exposition format is a few lines of text.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;

/// The proxy's counters.
#[derive(Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<(&'static str, String), f64>>,
}

/// Help text of each metric.
const HELP: &[(&str, &str, &str)] = &[
    (
        "handoff_compactions_total",
        "counter",
        "Compactions by strategy and outcome.",
    ),
    (
        "handoff_compaction_attempts_failed_total",
        "counter",
        "Failed strategy attempts by strategy and reason.",
    ),
    (
        "handoff_compaction_tokens_removed_total",
        "counter",
        "Estimated view tokens removed by compaction.",
    ),
    (
        "handoff_compaction_duration_seconds_sum",
        "counter",
        "Total time spent compacting.",
    ),
    (
        "handoff_compaction_duration_seconds_count",
        "counter",
        "Compaction runs timed.",
    ),
    (
        "handoff_requests_total",
        "counter",
        "Chat-completion requests by outcome.",
    ),
    (
        "handoff_overhead_seconds_sum",
        "counter",
        "Time spent in the proxy itself (total minus upstream).",
    ),
    (
        "handoff_overhead_seconds_count",
        "counter",
        "Requests whose overhead was measured.",
    ),
];

fn labels(pairs: &[(&str, &str)]) -> String {
    if pairs.is_empty() {
        return String::new();
    }
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\"")))
        .collect();
    format!("{{{}}}", inner.join(","))
}

impl Metrics {
    /// Adds `value` to the counter `name{labels}`.
    pub fn add(&self, name: &'static str, pairs: &[(&str, &str)], value: f64) {
        if let Ok(mut counters) = self.counters.lock() {
            *counters.entry((name, labels(pairs))).or_insert(0.0) += value;
        }
    }

    /// The current value of `name{labels}` (0 if never set).
    pub fn get(&self, name: &'static str, pairs: &[(&str, &str)]) -> f64 {
        self.counters
            .lock()
            .ok()
            .and_then(|c| c.get(&(name, labels(pairs))).copied())
            .unwrap_or(0.0)
    }

    /// The exposition text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let Ok(counters) = self.counters.lock() else {
            return out;
        };
        for (name, kind, help) in HELP {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            for ((metric, labels), value) in counters.iter().filter(|((m, _), _)| m == name) {
                let _ = writeln!(out, "{metric}{labels} {value}");
            }
        }
        out
    }
}
