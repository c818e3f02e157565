//! The shared store's upkeep: ages, holds, removal, tombstones and sizes, each a
//! statement or one short transaction. A removal takes the conversation's row lock
//! first, as appends do, so an append waits for it and then starts a new conversation.
//!
//! Compression is PostgreSQL's own: a line longer than about 2 KB is compressed in its
//! TOAST storage (pglz, or lz4 with `default_toast_compression`).

use std::time::SystemTime;

use super::rows::db;
use super::PgStore;
use crate::base::id::ConversationId;
use crate::base::tenant::TenantId;
use crate::upkeep::{Activity, Hold, Removed, TenantStats, Tombstone, Unless};
use crate::StoreError;

impl PgStore {
    /// Every conversation of `tenant` or of all, oldest first.
    pub(super) async fn activity_of(
        &self,
        tenant: Option<&TenantId>,
    ) -> Result<Vec<Activity>, StoreError> {
        let client = self.pool.get().await.map_err(db)?;
        let rows = client
            .query(
                "SELECT tenant, conversation, updated_at, hold IS NOT NULL
                 FROM handoff_conversations
                 WHERE ($1::text IS NULL OR tenant = $1)
                 ORDER BY updated_at",
                &[&tenant.map(TenantId::as_str)],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                Some(Activity {
                    id: super::conversation_of(row)?,
                    last: row.get(2),
                    held: row.get(3),
                    // Summing a conversation's lines costs a scan: `stats` does it.
                    bytes: 0,
                    compressed: false,
                })
            })
            .collect())
    }

    /// Removes a conversation in one transaction, unless `unless` applies.
    pub(super) async fn remove_one(
        &self,
        id: &ConversationId,
        unless: Unless,
    ) -> Result<Removed, StoreError> {
        let mut client = self.pool.get().await.map_err(db)?;
        let tx = client.transaction().await.map_err(db)?;
        let key = (id.tenant().as_str(), id.as_str());
        let row = tx
            .query_opt(
                "SELECT hold IS NOT NULL, updated_at FROM handoff_conversations
                 WHERE tenant = $1 AND conversation = $2 FOR UPDATE",
                &[&key.0, &key.1],
            )
            .await
            .map_err(db)?;
        let Some(row) = row else {
            return Ok(Removed::Missing);
        };
        if row.get::<_, bool>(0) {
            return Ok(Removed::Held);
        }
        if let Unless::HeldOrWrittenSince(since) = unless {
            if row.get::<_, SystemTime>(1) >= since {
                return Ok(Removed::Active);
            }
        }
        let bytes: i64 = tx
            .query_one(
                "WITH gone AS (
                    DELETE FROM handoff_lines WHERE tenant = $1 AND conversation = $2
                    RETURNING octet_length(line) AS n
                 )
                 SELECT coalesce(sum(n), 0)::bigint FROM gone",
                &[&key.0, &key.1],
            )
            .await
            .map_err(db)?
            .get(0);
        for statement in ERASE_ROWS {
            tx.execute(*statement, &[&key.0, &key.1])
                .await
                .map_err(db)?;
        }
        tx.commit().await.map_err(db)?;
        Ok(Removed::Removed(bytes.unsigned_abs()))
    }

    /// Puts or lifts a hold; false for an unknown conversation.
    pub(super) async fn hold_one(
        &self,
        id: &ConversationId,
        hold: Option<&Hold>,
    ) -> Result<bool, StoreError> {
        let text = hold.map(serde_json::to_string).transpose()?;
        let client = self.pool.get().await.map_err(db)?;
        let changed = client
            .execute(
                "UPDATE handoff_conversations SET hold = $3
                 WHERE tenant = $1 AND conversation = $2",
                &[&id.tenant().as_str(), &id.as_str(), &text],
            )
            .await
            .map_err(db)?;
        Ok(changed == 1)
    }

    /// Appends a tombstone.
    pub(super) async fn bury(&self, tombstone: &Tombstone) -> Result<(), StoreError> {
        let text = serde_json::to_string(tombstone)?;
        let client = self.pool.get().await.map_err(db)?;
        client
            .execute(
                "INSERT INTO handoff_tombstones (tombstone) VALUES ($1)",
                &[&text],
            )
            .await
            .map_err(db)?;
        Ok(())
    }

    /// Tombstones after `seq`, oldest first, at most a thousand.
    pub(super) async fn buried_after(&self, seq: u64) -> Result<Vec<Tombstone>, StoreError> {
        let client = self.pool.get().await.map_err(db)?;
        let after = i64::try_from(seq).unwrap_or(i64::MAX);
        let rows = client
            .query(
                "SELECT seq, tombstone FROM handoff_tombstones
                 WHERE seq > $1 ORDER BY seq LIMIT 1000",
                &[&after],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let mut tombstone: Tombstone = serde_json::from_str(row.get(1)).ok()?;
                tombstone.seq = row.get::<_, i64>(0).unsigned_abs();
                Some(tombstone)
            })
            .collect())
    }

    /// Conversations, requests and bytes per tenant: bytes as written, and as stored
    /// (`pg_column_size`, after TOAST compression).
    pub(super) async fn stats_of(
        &self,
        tenant: Option<&TenantId>,
    ) -> Result<Vec<TenantStats>, StoreError> {
        let client = self.pool.get().await.map_err(db)?;
        let tenant = tenant.map(TenantId::as_str);
        let lines = client
            .query(
                "SELECT tenant, count(*) FILTER (WHERE kind = 'request'),
                        sum(octet_length(line))::bigint, sum(pg_column_size(line))::bigint
                 FROM handoff_lines WHERE ($1::text IS NULL OR tenant = $1)
                 GROUP BY tenant ORDER BY tenant",
                &[&tenant],
            )
            .await
            .map_err(db)?;
        let conversations = client
            .query(
                "SELECT tenant, count(*), count(*) FILTER (WHERE hold IS NOT NULL)
                 FROM handoff_conversations WHERE ($1::text IS NULL OR tenant = $1)
                 GROUP BY tenant",
                &[&tenant],
            )
            .await
            .map_err(db)?;
        let counts: std::collections::HashMap<String, (i64, i64)> = conversations
            .iter()
            .map(|row| (row.get(0), (row.get(1), row.get(2))))
            .collect();
        Ok(lines
            .iter()
            .map(|row| {
                let tenant: String = row.get(0);
                let (conversations, held) = counts.get(&tenant).copied().unwrap_or_default();
                TenantStats {
                    conversations: conversations.unsigned_abs(),
                    compressed: 0,
                    held: held.unsigned_abs(),
                    requests: row.get::<_, i64>(1).unsigned_abs(),
                    bytes_raw: row.get::<_, Option<i64>>(2).unwrap_or(0).unsigned_abs(),
                    bytes_stored: row.get::<_, Option<i64>>(3).unwrap_or(0).unsigned_abs(),
                    tenant,
                }
            })
            .collect())
    }
}

/// The rows of a conversation besides its lines, each table's statement a constant:
/// no statement is built from text at run time.
const ERASE_ROWS: &[&str] = &[
    "DELETE FROM handoff_compactions WHERE tenant = $1 AND conversation = $2",
    "DELETE FROM handoff_leases WHERE tenant = $1 AND conversation = $2",
    "DELETE FROM handoff_responses WHERE tenant = $1 AND conversation = $2",
    "DELETE FROM handoff_summaries WHERE tenant = $1 AND conversation = $2",
    "DELETE FROM handoff_conversations WHERE tenant = $1 AND conversation = $2",
];
