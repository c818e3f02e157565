//! Between rows and the log: lines into rows (kind, unique digest, parent), rows back
//! into a [`ConversationLog`], and the positions an append reserves.

use tokio_postgres::Row;

use super::db;
use crate::base::id::ConversationId;
use crate::base::line::{Entry, Line, FORMAT_VERSION};
use crate::base::record::CompactionRecord;
use crate::base::tenant::TenantId;
use crate::store::{ConversationLog, LineProblem, StoreError};

/// Rows into a log; a line this build cannot read is a problem, as on disk.
pub(super) fn log_of(lines: &[Row], records: &[Row], after: u64) -> ConversationLog {
    let mut log = ConversationLog {
        last_seq: after,
        ..ConversationLog::default()
    };
    for row in lines {
        let seq: i64 = row.get(0);
        let text: &str = row.get(1);
        log.last_seq = log.last_seq.max(seq.unsigned_abs());
        let problem = |reason: String| LineProblem {
            line: usize::try_from(seq).unwrap_or(0),
            reason,
        };
        match Line::parse(text.as_bytes()) {
            Ok(line) if line.v > FORMAT_VERSION => log.problems.push(problem(format!(
                "format version {} is newer than this build's {FORMAT_VERSION}",
                line.v
            ))),
            Ok(line) => log.lines.push(line),
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

/// The columns of one line: kind, unique digest (messages and pinned sets), parent.
pub(super) fn columns(line: &Line) -> (&'static str, Option<String>, Option<String>) {
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
