//! The evaluation's answer: one line per conversation and a total, or JSON.

use std::collections::BTreeMap;
use std::io::Write;

use serde_json::json;

use super::ConversationReport;

/// Writes `reports` as a table, or as one JSON document with `json`.
pub fn write_report(
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
    let mut failed: BTreeMap<&str, u64> = BTreeMap::new();
    for (reason, count) in reports.iter().flat_map(|r| &r.failed) {
        *failed.entry(reason).or_insert(0) += count;
    }
    let (matches, kept) = reports
        .iter()
        .filter_map(|r| r.recall.as_ref())
        .fold((0, 0), |(m, k), r| (m + r.matches, k + r.kept));
    let recall = (matches > 0).then(|| kept as f64 / matches as f64);
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
                "usage": usage,
                "failed": failed,
                "recall": recall,
            }
        });
        serde_json::to_writer_pretty(&mut *out, &document)?;
        return writeln!(out);
    }
    writeln!(
        out,
        "{:<40} {:>8} {:>11} {:>22} {:>6} {:>8} {:<20} {:>7}",
        "conversation",
        "requests",
        "compactions",
        "tokens before→after",
        "calls",
        "saved",
        "failed",
        "recall"
    )?;
    for report in reports {
        let before: u64 = report.compactions.iter().map(|c| c.tokens_before).sum();
        let after: u64 = report.compactions.iter().map(|c| c.tokens_after).sum();
        writeln!(
            out,
            "{:<40} {:>8} {:>11} {:>22} {:>6} {:>8} {:<20} {:>7}",
            shorten(&report.name, 40),
            report.requests,
            report.compactions.len(),
            format!("{before}→{after}"),
            report.summary_calls,
            before.saturating_sub(after),
            failed_text(report.failed.iter().map(|(k, v)| (k.as_str(), *v))),
            report
                .recall
                .as_ref()
                .map_or("-".into(), |r| format!("{:.0}%", r.share * 100.0)),
        )?;
        for error in &report.errors {
            writeln!(out, "  error: {error}")?;
        }
    }
    writeln!(
        out,
        "{:<40} {:>8} {:>11} {:>22} {:>6} {:>8} {:<20} {:>7}",
        format!("total ({} conversations)", reports.len()),
        reports.iter().map(|r| r.requests).sum::<usize>(),
        compactions,
        format!("{before}→{after}"),
        calls,
        before.saturating_sub(after),
        failed_text(failed.iter().map(|(k, v)| (*k, *v))),
        recall.map_or("-".into(), |r| format!("{:.0}%", r * 100.0)),
    )?;
    if let Some(usage) = usage {
        writeln!(out, "summary usage: {usage}")?;
    }
    Ok(())
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
