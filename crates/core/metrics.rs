//! Counters for `/handoff/metrics`, in the Prometheus text format.
//!
//! A handful of labelled counters and one duration summary do not justify a metrics
//! framework; the exposition format is a few lines of text.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// The US dollars replies cost at the configured prices, by the `[prices]` entry that
/// priced them (a bounded label: the config's keys, not the clients' model names) and
/// the tenant (a proxy key's name, or the hash of the client's credential).
pub const COST_USD: &str = "handoff_cost_usd_total";

/// The US dollars summary calls cost, by `[prices]` entry and by the tenant whose
/// conversation needed them; counted when their compaction commits.
pub const SUMMARY_COST_USD: &str = "handoff_summary_cost_usd_total";

/// Summary-call attempts whose model has no price: unpriced, never counted as free.
pub const UNPRICED_SUMMARY_CALLS: &str = "handoff_unpriced_summary_calls_total";

/// The counter of replies whose model has no price: unpriced, never counted as free.
pub const UNPRICED_REPLIES: &str = "handoff_unpriced_replies_total";

/// The counter of replies that did not reach the log, by cause.
pub const REPLIES_UNLOGGED: &str = "handoff_replies_unlogged_total";

/// The counter of views sent with shortened tool bodies (`compaction.rescue`).
pub const VIEWS_RESCUED: &str = "handoff_views_rescued_total";

/// Background preparations (`compaction.prepare_at`), by how they ended.
pub const PREPARED: &str = "handoff_prepared_total";
/// Prepared compactions a request adopted.
pub const PREPARED_ADOPTED: &str = "handoff_prepared_adopted_total";
/// Requests over the trigger that waited for their conversation's running compaction:
/// no view within the input budget existed without it.
pub const PREPARED_WAITED: &str = "handoff_prepared_waited_total";
/// Requests over the trigger sent without waiting for their conversation's running
/// compaction, their view within the input budget.
pub const SENT_WHILE_PREPARING: &str = "handoff_sent_while_preparing_total";
/// Requests sent with a stand-in handoff because the summary they would have waited
/// for ran past `compaction.max_wait`.
pub const STAND_INS: &str = "handoff_stand_ins_total";
/// Conversations retention removed.
pub const PRUNED: &str = "handoff_pruned_conversations_total";
/// Bytes retention removed.
pub const PRUNED_BYTES: &str = "handoff_pruned_bytes_total";
/// Conversations erased on request.
pub const ERASED: &str = "handoff_erased_conversations_total";
/// Conversations compressed once idle for `store.compress_after`.
pub const COMPRESSED: &str = "handoff_compressed_conversations_total";
/// Bytes compression saved.
pub const COMPRESSED_SAVED: &str = "handoff_compressed_bytes_saved_total";
/// Prepared compactions superseded before any request adopted them.
pub const PREPARED_WASTED: &str = "handoff_prepared_wasted_total";

/// Summary calls made for a key's conversations, by key.
pub const KEY_SUMMARY_CALLS: &str = "handoff_key_summary_calls_total";
/// Tokens those calls used (their `usage`), charged to the key's `tpm`, by key.
pub const KEY_SUMMARY_TOKENS: &str = "handoff_key_summary_tokens_total";

/// Spans the OpenTelemetry export dropped, by reason (`queue_full`, `export_failed`,
/// `export_timeout`).
pub const SPANS_DROPPED: &str = "handoff_otel_spans_dropped_total";
/// Spans the collector took.
pub const SPANS_EXPORTED: &str = "handoff_otel_spans_exported_total";

/// Upper bounds, in seconds, of the overhead histogram's buckets.
const OVERHEAD_BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

/// Shards of the overhead histogram: one per worker thread, up to this many.
const SHARDS: usize = 16;

/// One worker's share of the overhead histogram, alone on its cache lines: every
/// request adds to it, and workers sharing a lock or a line would wait for each other.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Shard {
    buckets: [AtomicU64; OVERHEAD_BUCKETS.len() + 1],
    nanos: AtomicU64,
}

/// The proxy's counters, and the histogram of its own overhead.
#[derive(Debug, Default)]
pub struct Metrics {
    counters: Mutex<BTreeMap<(&'static str, String), f64>>,
    overhead: [Shard; SHARDS],
}

/// Help text of each metric.
const HELP: &[(&str, &str, &str)] = &[
    (
        "handoff_hook_calls_total",
        "counter",
        "Middleware hook calls by hook, stage (request, view, reply) and outcome (passed, redacted, rerouted, denied, failed, failed_open, failed_closed).",
    ),
    (
        "handoff_hook_tags_total",
        "counter",
        "Tags middleware hooks added, by tag and value, for the tags middleware.metric_tags names.",
    ),
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
        VIEWS_RESCUED,
        "counter",
        "Views whose newest unit fit only with over-long tool bodies shortened (compaction.rescue).",
    ),
    (
        REPLIES_UNLOGGED,
        "counter",
        "Replies that did not reach the log, by cause (storage, capture_lag, unreadable).",
    ),
    (
        COST_USD,
        "counter",
        "US dollars the replies cost at the configured [prices], by the entry that priced them and the tenant.",
    ),
    (
        SUMMARY_COST_USD,
        "counter",
        "US dollars handoff's summary calls cost at the configured [prices], by entry and by the tenant whose conversation needed them.",
    ),
    (
        UNPRICED_SUMMARY_CALLS,
        "counter",
        "Summary-call attempts whose model has no [prices] entry: unpriced, never counted as free.",
    ),
    (
        UNPRICED_REPLIES,
        "counter",
        "Replies whose model has no [prices] entry: unpriced, never counted as free.",
    ),
    (
        PREPARED,
        "counter",
        "Background preparations by outcome (started, committed, stale, failed, dropped).",
    ),
    (
        PRUNED,
        "counter",
        "Conversations removed by retention (store.retention and its overrides).",
    ),
    (PRUNED_BYTES, "counter", "Bytes removed by retention."),
    (
        ERASED,
        "counter",
        "Conversations erased on request (handoff audit erase, POST /handoff/erase).",
    ),
    (
        COMPRESSED,
        "counter",
        "Conversations compressed after store.compress_after of idleness.",
    ),
    (COMPRESSED_SAVED, "counter", "Bytes compression saved on disk."),
    (
        STAND_INS,
        "counter",
        "Requests sent with a stand-in handoff from the deterministic strategies: the summary they needed ran past compaction.max_wait.",
    ),
    (
        PREPARED_ADOPTED,
        "counter",
        "Prepared compactions adopted by the request that crossed the trigger.",
    ),
    (
        PREPARED_WAITED,
        "counter",
        "Requests over the trigger that waited for their conversation's running compaction (no view fit the input budget without it).",
    ),
    (
        SENT_WHILE_PREPARING,
        "counter",
        "Requests over the trigger sent without waiting for their conversation's running compaction, within the input budget.",
    ),
    (
        PREPARED_WASTED,
        "counter",
        "Prepared compactions superseded before any request adopted them.",
    ),
    (
        "handoff_chat_rejected_total",
        "counter",
        "Tracked requests refused with 503 past limits.max_concurrent_chat and its queue.",
    ),
    (
        KEY_SUMMARY_CALLS,
        "counter",
        "Summary calls made for the conversations of a proxy key, by key.",
    ),
    (
        KEY_SUMMARY_TOKENS,
        "counter",
        "Tokens the summary calls for a proxy key's conversations used, charged to its tpm.",
    ),
    (
        SPANS_DROPPED,
        "counter",
        "OpenTelemetry spans dropped, never waited for: by reason (queue_full, export_failed, export_timeout).",
    ),
    (
        SPANS_EXPORTED,
        "counter",
        "OpenTelemetry spans the collector took.",
    ),
    (
        "handoff_store_sync_failures_total",
        "counter",
        "Batched fsyncs (store.fsync = \"batch\") that failed after their lines were acknowledged.",
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

/// The value of `label` in a rendered label set (`{a="x",b="y"}`), unescaped.
fn label_value(labels: &str, label: &str) -> Option<String> {
    let start = labels.find(&format!("{label}=\""))? + label.len() + 2;
    let mut value = String::new();
    let mut chars = labels[start..].chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => value.push(chars.next()?),
            '"' => return Some(value),
            other => value.push(other),
        }
    }
    None
}

impl Metrics {
    /// The counter `name` summed by the value of its `label` (series without it are
    /// left out).
    pub fn sum_by(&self, name: &'static str, label: &str) -> BTreeMap<String, f64> {
        let mut sums = BTreeMap::new();
        if let Ok(counters) = self.counters.lock() {
            for ((series, labels), value) in counters.iter() {
                if *series != name {
                    continue;
                }
                if let Some(key) = label_value(labels, label) {
                    *sums.entry(key).or_insert(0.0) += value;
                }
            }
        }
        sums
    }

    /// Adds `value` to the counter `name{labels}`.
    pub fn add(&self, name: &'static str, pairs: &[(&str, &str)], value: f64) {
        if let Ok(mut counters) = self.counters.lock() {
            *counters.entry((name, labels(pairs))).or_insert(0.0) += value;
        }
    }

    /// Records one request's overhead: the time to its response head minus the time the
    /// upstream took to send its head (TensorZero's measure). Lock-free, in the calling
    /// worker's own shard: it runs on every request.
    pub fn observe_overhead(&self, took: Duration) {
        let seconds = took.as_secs_f64();
        let bucket = OVERHEAD_BUCKETS
            .iter()
            .position(|bound| seconds <= *bound)
            .unwrap_or(OVERHEAD_BUCKETS.len());
        let shard = &self.overhead[crate::worker::index() % SHARDS];
        shard.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        shard.nanos.fetch_add(nanos, Ordering::Relaxed);
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
        drop(counters);
        let mut counts = [0u64; OVERHEAD_BUCKETS.len() + 1];
        let mut nanos = 0u64;
        for shard in &self.overhead {
            for (count, bucket) in counts.iter_mut().zip(&shard.buckets) {
                *count += bucket.load(Ordering::Relaxed);
            }
            nanos = nanos.saturating_add(shard.nanos.load(Ordering::Relaxed));
        }
        let sum = nanos as f64 / 1e9;
        let _ = writeln!(
            out,
            "# HELP handoff_overhead_seconds Time spent in the proxy itself: response head time minus upstream head time.\n# TYPE handoff_overhead_seconds histogram"
        );
        let mut cumulative = 0;
        for (bound, count) in OVERHEAD_BUCKETS.iter().zip(counts.iter()) {
            cumulative += count;
            let _ = writeln!(
                out,
                "handoff_overhead_seconds_bucket{{le=\"{bound}\"}} {cumulative}"
            );
        }
        cumulative += counts[OVERHEAD_BUCKETS.len()];
        let _ = writeln!(
            out,
            "handoff_overhead_seconds_bucket{{le=\"+Inf\"}} {cumulative}"
        );
        let _ = writeln!(out, "handoff_overhead_seconds_sum {sum}");
        let _ = writeln!(out, "handoff_overhead_seconds_count {cumulative}");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line<'a>(text: &'a str, name: &str) -> Option<&'a str> {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
    }

    #[test]
    fn overhead_observed_on_every_worker_adds_up_in_one_histogram() {
        let metrics = std::sync::Arc::new(Metrics::default());
        let threads: Vec<_> = (0..3)
            .map(|worker| {
                let metrics = std::sync::Arc::clone(&metrics);
                std::thread::spawn(move || {
                    crate::worker::enter(worker);
                    metrics.observe_overhead(Duration::from_micros(50));
                    metrics.observe_overhead(Duration::from_millis(3));
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        metrics.observe_overhead(Duration::from_secs(2));
        let text = metrics.render();
        let bucket = |le: &str| {
            line(
                &text,
                &format!("handoff_overhead_seconds_bucket{{le=\"{le}\"}}"),
            )
        };
        assert_eq!(bucket("0.0001"), Some("3"));
        assert_eq!(bucket("0.0025"), Some("3"));
        assert_eq!(bucket("0.005"), Some("6"));
        assert_eq!(bucket("1"), Some("6"));
        assert_eq!(bucket("+Inf"), Some("7"));
        assert_eq!(line(&text, "handoff_overhead_seconds_count"), Some("7"));
        let sum: f64 = line(&text, "handoff_overhead_seconds_sum")
            .unwrap()
            .parse()
            .unwrap();
        assert!((sum - 2.00915).abs() < 1e-9, "sum {sum}");
    }
}
