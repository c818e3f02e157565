//! `store copy`'s side of the database: whole conversations written in one
//! transaction each, and the tenant secret carried over.

use super::rows::columns;
use super::rows::db;
use super::PgStore;
use crate::base::id::ConversationId;
use crate::base::line::{Entry, Written};
use crate::base::record::CompactionRecord;
use crate::{ConversationLog, StoreError};

/// What importing one conversation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Imported {
    /// Its lines and records were written.
    Copied {
        /// Lines written.
        lines: usize,
        /// Compaction records written.
        records: usize,
    },
    /// The database already had it: an earlier copy, or live traffic.
    Present,
}

impl PgStore {
    /// Writes a whole conversation read elsewhere, in one transaction, keeping every
    /// line's bytes and order; a conversation the database already has is left alone,
    /// so a copy can be run again. Records without a boundary (never committed) are
    /// not copied.
    pub async fn import(
        &self,
        id: &ConversationId,
        log: &ConversationLog,
    ) -> Result<Imported, StoreError> {
        let adopted: std::collections::HashMap<&str, &CompactionRecord> =
            log.compactions.iter().map(|r| (r.id.as_str(), r)).collect();
        let mut client = self.pool.get().await.map_err(db)?;
        let tx = client.transaction().await.map_err(db)?;
        let (tenant, conversation) = (id.tenant().as_str(), id.as_str());
        let created = tx
            .execute(
                "INSERT INTO handoff_conversations (tenant, conversation) VALUES ($1, $2)
                 ON CONFLICT (tenant, conversation) DO NOTHING",
                &[&tenant, &conversation],
            )
            .await
            .map_err(db)?;
        if created == 0 {
            return Ok(Imported::Present);
        }
        let (mut lines, mut records) = (0, 0);
        for line in &log.lines {
            let seq = i64::try_from(lines + 1).map_err(db)?;
            if let Entry::CompactBoundary(boundary) = &line.entry {
                let Some(record) = adopted.get(boundary.compact_id.as_str()) else {
                    continue;
                };
                let written = tx
                    .execute(
                        "INSERT INTO handoff_compactions (tenant, conversation, prefix_digest, id, seq, record)
                         VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                        &[
                            &tenant,
                            &conversation,
                            &record.source.prefix_digest.to_hex(),
                            &record.id,
                            &seq,
                            &serde_json::to_string(record)?,
                        ],
                    )
                    .await
                    .map_err(db)?;
                if written == 0 {
                    continue;
                }
                records += 1;
            }
            let (kind, digest, parent) = columns(&Written::Line(line));
            let written = tx
                .execute(
                    "INSERT INTO handoff_lines (tenant, conversation, seq, kind, digest, parent, line)
                     VALUES ($1, $2, $3, $4, $5, $6, $7)
                     ON CONFLICT (tenant, conversation, kind, digest) WHERE digest IS NOT NULL
                     DO NOTHING",
                    &[
                        &tenant,
                        &conversation,
                        &seq,
                        &kind,
                        &digest,
                        &parent,
                        &serde_json::to_string(line)?,
                    ],
                )
                .await
                .map_err(db)?;
            lines += usize::try_from(written).unwrap_or(0);
        }
        let last = i64::try_from(lines).map_err(db)?;
        tx.execute(
            "UPDATE handoff_conversations SET last_seq = $3 WHERE tenant = $1 AND conversation = $2",
            &[&tenant, &conversation, &last],
        )
        .await
        .map_err(db)?;
        tx.execute("SELECT handoff_recount($1, $2)", &[&tenant, &conversation])
            .await
            .map_err(db)?;
        tx.commit().await.map_err(db)?;
        Ok(Imported::Copied { lines, records })
    }

    /// Makes `secret` the shared secret if the database has none yet; returns whether
    /// the database's secret is now `secret`.
    pub(crate) async fn adopt_secret(&self, secret: &[u8; 32]) -> Result<bool, StoreError> {
        Ok(self.secret_or(secret).await? == *secret)
    }
}
