//! The evaluation's answer: one line per conversation and a total, or JSON.

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::json;

use super::{ClassRecall, ConversationReport, Recall};

/// Writes `reports` as a table, or as one JSON document with `json`.
pub(crate) fn write_report(
    reports: &[ConversationReport],
    json: bool,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let compactions: usize = reports.iter().map(|r| r.compactions.len()).sum();
    let before: u64 = reports
        .iter()
        .flat_map(|r| &r.compactions)
        .map(|c| c.tokens_before)
        .sum();
    let after: u64 = reports
        .iter()
        .flat_map(|r| &r.compactions)
        .map(|c| c.tokens_after)
        .sum();
    let calls: u64 = reports.iter().map(|r| r.summary_calls).sum();
    let usage = handoff_plugin_api::sum_usage(reports.iter().filter_map(|r| r.usage.as_ref()));
    let summary_usd: Option<f64> = reports.iter().map(|r| r.summary_usd).sum();
    let mut unpriced: Vec<&str> = reports
        .iter()
        .flat_map(|r| r.unpriced.iter().map(String::as_str))
        .collect();
    unpriced.sort_unstable();
    unpriced.dedup();
    let mut failed: BTreeMap<&str, u64> = BTreeMap::new();
    for (reason, count) in reports.iter().flat_map(|r| &r.failed) {
        *failed.entry(reason).or_insert(0) += count;
    }
    let (matches, kept) = reports
        .iter()
        .filter_map(|r| r.recall.as_ref())
        .fold((0, 0), |(m, k), r| (m + r.matches, k + r.kept));
    let recall = (matches > 0).then(|| kept as f64 / matches as f64);
    let mut compacted = ClassRecall::default();
    for report in reports.iter().filter_map(|r| r.compacted.as_ref()) {
        compacted.add(report);
    }
    let model_attempts: u64 = reports.iter().map(|r| r.model_attempts).sum();
    let mut model_failed: BTreeMap<&str, u64> = BTreeMap::new();
    for (reason, count) in reports.iter().flat_map(|r| &r.model_failed) {
        *model_failed.entry(reason).or_insert(0) += count;
    }
    let duration_ms: u64 = reports
        .iter()
        .flat_map(|r| &r.compactions)
        .map(|c| c.duration_ms)
        .sum();
    if json {
        let document = json!({
            "conversations": reports,
            "total": {
                "conversations": reports.len(),
                "requests": reports.iter().map(|r| r.requests).sum::<usize>(),
                "compactions": compactions,
                "tokens_before": before,
                "tokens_after": after,
                "summary_calls": calls,
                "duration_ms": duration_ms,
                "usage": usage,
                "summary_usd": summary_usd,
                "unpriced": unpriced,
                "failed": failed,
                "model_attempts": model_attempts,
                "model_failed": model_failed,
                "recall": recall,
                "compacted": compacted,
            }
        });
        serde_json::to_writer_pretty(&mut *out, &document)?;
        return writeln!(out);
    }
    let row = |out: &mut dyn Write, cells: [String; 12]| {
        writeln!(
            out,
            "{:<40} {:>8} {:>11} {:>22} {:>5} {:>6} {:>7} {:<20} {:>6} {:>5} {:>5} {:>8}",
            cells[0],
            cells[1],
            cells[2],
            cells[3],
            cells[4],
            cells[5],
            cells[6],
            cells[7],
            cells[8],
            cells[9],
            cells[10],
            cells[11]
        )
    };
    row(
        out,
        [
            "conversation",
            "requests",
            "compactions",
            "tokens before→after",
            "calls",
            "s/cmp",
            "refused",
            "failed",
            "recall",
            "user",
            "ids",
            "outcomes",
        ]
        .map(str::to_owned),
    )?;
    for report in reports {
        let before: u64 = report.compactions.iter().map(|c| c.tokens_before).sum();
        let after: u64 = report.compactions.iter().map(|c| c.tokens_after).sum();
        let duration: u64 = report.compactions.iter().map(|c| c.duration_ms).sum();
        let failed: u64 = report.model_failed.values().sum();
        row(
            out,
            [
                shorten(&report.name, 40),
                report.requests.to_string(),
                report.compactions.len().to_string(),
                format!("{before}→{after}"),
                report.summary_calls.to_string(),
                per_compaction(duration, report.compactions.len()),
                refused(failed, report.model_attempts),
                failed_text(report.failed.iter().map(|(k, v)| (k.as_str(), *v))),
                report.recall.as_ref().map_or("-".into(), percent),
                report
                    .compacted
                    .as_ref()
                    .map_or("-".into(), |c| class(&c.user)),
                report
                    .compacted
                    .as_ref()
                    .map_or("-".into(), |c| class(&c.identifiers)),
                report
                    .compacted
                    .as_ref()
                    .map_or("-".into(), |c| class(&c.outcomes)),
            ],
        )?;
        for error in &report.errors {
            writeln!(out, "  error: {error}")?;
        }
    }
    row(
        out,
        [
            format!("total ({} conversations)", reports.len()),
            reports
                .iter()
                .map(|r| r.requests)
                .sum::<usize>()
                .to_string(),
            compactions.to_string(),
            format!("{before}→{after}"),
            calls.to_string(),
            per_compaction(duration_ms, compactions),
            refused(model_failed.values().sum(), model_attempts),
            failed_text(failed.iter().map(|(k, v)| (*k, *v))),
            recall.map_or("-".into(), |r| format!("{:.0}%", r * 100.0)),
            class(&compacted.user),
            class(&compacted.identifiers),
            class(&compacted.outcomes),
        ],
    )?;
    if let Some(usage) = usage {
        writeln!(out, "summary usage: {usage}")?;
    }
    match summary_usd {
        Some(usd) => writeln!(out, "summary cost: ${usd:.6} at the configured [prices]")?,
        None => writeln!(
            out,
            "summary cost: unpriced (no [prices] entry for {})",
            unpriced.join(", ")
        )?,
    }
    Ok(())
}

fn percent(recall: &Recall) -> String {
    format!("{:.0}%", recall.share * 100.0)
}

/// A class's recall, `-` when nothing of it was compacted.
fn class(recall: &Recall) -> String {
    if recall.matches == 0 {
        "-".into()
    } else {
        percent(recall)
    }
}

fn per_compaction(duration_ms: u64, compactions: usize) -> String {
    if compactions == 0 {
        "-".into()
    } else {
        format!("{:.1}", duration_ms as f64 / 1000.0 / compactions as f64)
    }
}

/// Refused model attempts of all of them.
fn refused(failed: u64, attempts: u64) -> String {
    if attempts == 0 {
        "-".into()
    } else {
        format!("{failed}/{attempts}")
    }
}

fn failed_text<'a>(failed: impl Iterator<Item = (&'a str, u64)>) -> String {
    let parts: Vec<String> = failed.map(|(k, v)| format!("{k}={v}")).collect();
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(",")
    }
}

fn shorten(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    let tail: String = text
        .chars()
        .rev()
        .take(width - 1)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    format!("…{tail}")
}
