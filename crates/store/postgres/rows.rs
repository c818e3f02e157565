//! Between rows and the log: lines into rows (kind, unique digest, parent), rows back
//! into a [`ConversationLog`], and the positions an append reserves.

use tokio_postgres::Row;

use crate::base::digest::PrefixDigest;
use crate::base::id::ConversationId;
use crate::base::line::{Entry, Line, Written, NEWEST_VERSION, RUN_KIND};
use crate::base::record::CompactionRecord;
use crate::base::tenant::TenantId;
use crate::{ConversationLog, LineProblem, StoreError};

/// A database failure, as the store reports it.
pub(super) fn db(err: impl std::fmt::Display) -> StoreError {
    StoreError::Database(err.to_string())
}

/// Rows into a log; a line this build cannot read is a problem, as on disk.
pub(super) fn log_of(lines: &[Row], records: &[Row], after: u64) -> ConversationLog {
    let mut log = ConversationLog {
        last_seq: after,
        ..ConversationLog::default()
    };
    // Message digests read so far, filled on the first run: a run is unique by its
    // head only, so two replicas that logged overlapping runs in a race both wrote
    // the messages they share (single lines are unique by their own digest).
    let mut seen = None;
    for row in lines {
        let seq: i64 = row.get(0);
        let text: &str = row.get(1);
        log.last_seq = log.last_seq.max(seq.unsigned_abs());
        let problem = |reason: String| LineProblem {
            line: usize::try_from(seq).unwrap_or(0),
            reason,
        };
        let start = log.lines.len();
        match Line::parse_into(text.as_bytes(), &mut log.lines) {
            Ok(()) => {
                if let Some(line) = log.lines[start..].iter().find(|l| l.v > NEWEST_VERSION) {
                    let v = line.v;
                    log.lines.truncate(start);
                    log.problems.push(problem(format!(
                        "format version {v} is newer than this build's {NEWEST_VERSION}"
                    )));
                } else {
                    let run = log.lines.len() - start > 1;
                    drop_read_twice(&mut log.lines, start, run, &mut seen);
                }
            }
            Err(err) => log.problems.push(problem(format!("invalid line: {err}"))),
        }
    }
    for row in records {
        let seq: i64 = row.get(0);
        let text: &str = row.get(1);
        match serde_json::from_str::<CompactionRecord>(text) {
            Ok(record) => log.compactions.push(record),
            Err(err) => log.compaction_problems.push(LineProblem {
                line: usize::try_from(seq).unwrap_or(0),
                reason: format!("invalid record: {err}"),
            }),
        }
    }
    log
}

/// Drops from the lines just read into `lines[start..]` the messages read before:
/// `seen` starts at the first run and then follows every message read.
fn drop_read_twice(
    lines: &mut Vec<Line>,
    start: usize,
    run: bool,
    seen: &mut Option<std::collections::HashSet<PrefixDigest>>,
) {
    let digest_of = |line: &Line| match &line.entry {
        Entry::Message(message) => Some(message.digest),
        _ => None,
    };
    if seen.is_none() && !run {
        return;
    }
    let seen = seen.get_or_insert_with(|| lines[..start].iter().filter_map(digest_of).collect());
    let mut fresh = lines.split_off(start);
    fresh.retain(|line| digest_of(line).is_none_or(|digest| seen.insert(digest)));
    lines.append(&mut fresh);
}

/// The columns of one written line: kind, unique digest (messages, runs of them by
/// their head, and pinned sets), parent.
pub(super) fn columns(unit: &Written<'_>) -> (&'static str, Option<String>, Option<String>) {
    let line = match unit {
        Written::Line(line) => line,
        Written::Run(_) => {
            let ends = unit.run_ends();
            return (
                RUN_KIND,
                ends.map(|(_, head)| head.to_hex()),
                ends.and_then(|(parent, _)| parent).map(|p| p.to_hex()),
            );
        }
    };
    match &line.entry {
        Entry::Message(m) => (
            "message",
            Some(m.digest.to_hex()),
            m.parent.map(|p| p.to_hex()),
        ),
        Entry::Pinned(p) => ("pinned", Some(p.digest.to_hex()), None),
        Entry::Request(r) => ("request", None, r.head.map(|h| h.to_hex())),
        Entry::CompactBoundary(b) => ("compact_boundary", None, Some(b.prefix_digest.to_hex())),
        Entry::Rescue(r) => ("rescue", None, r.head.map(|h| h.to_hex())),
        Entry::Adopt(a) => ("adopt", None, a.head.map(|h| h.to_hex())),
        // Unique by its bytes: two replicas that log one form keep one row.
        Entry::Form(f) => ("form", Some(f.digest.to_hex()), f.of.map(|o| o.to_hex())),
        Entry::Decision(d) => ("decision", None, d.head.map(|h| h.to_hex())),
        Entry::StandIn(s) => ("stand_in", None, s.head.map(|h| h.to_hex())),
    }
}

/// What a written line adds to its conversation's summary: originals, the model of a
/// request, and the line's time.
pub(super) fn counted<'a>(unit: &Written<'a>) -> (i64, Option<&'a str>, &'a str) {
    match *unit {
        Written::Run(run) => (
            i64::try_from(run.len()).unwrap_or(i64::MAX),
            None,
            run.first().map_or("", |line| line.at.as_str()),
        ),
        Written::Line(line) => match &line.entry {
            Entry::Message(_) => (1, None, line.at.as_str()),
            Entry::Request(request) => (0, Some(request.model.as_str()), line.at.as_str()),
            _ => (0, None, line.at.as_str()),
        },
    }
}

/// Reserves `count` positions in the conversation's log, taking its row lock until
/// the transaction ends; returns the first.
pub(super) async fn reserve(
    tx: &deadpool_postgres::Transaction<'_>,
    id: &ConversationId,
    count: usize,
) -> Result<i64, StoreError> {
    let count = i64::try_from(count).map_err(db)?;
    let statement = tx
        .prepare_cached(
            "INSERT INTO handoff_conversations AS c (tenant, conversation, last_seq)
             VALUES ($1, $2, $3)
             ON CONFLICT (tenant, conversation)
             DO UPDATE SET last_seq = c.last_seq + EXCLUDED.last_seq, updated_at = now()
             RETURNING last_seq",
        )
        .await
        .map_err(db)?;
    let last: i64 = tx
        .query_one(&statement, &[&id.tenant().as_str(), &id.as_str(), &count])
        .await
        .map_err(db)?
        .get(0);
    Ok(last - count + 1)
}
/// The conversation of a `(tenant, conversation)` row.
pub(super) fn conversation_of(row: &Row) -> Option<ConversationId> {
    let tenant = TenantId::parse(row.get(0)).ok()?;
    ConversationId::parse(tenant, row.get(1)).ok()
}
