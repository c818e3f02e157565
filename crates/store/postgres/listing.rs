//! A page of conversations with their counts, from `handoff_summaries`: one row each,
//! in primary-key order, so a listing never reads a log.

use super::rows::conversation_of;
use super::rows::db;
use super::PgStore;
use crate::base::id::ConversationId;
use crate::base::tenant::TenantId;
use crate::{Listing, StoreError};

impl PgStore {
    /// Conversations of `tenant` or of all after `after`, at most `limit`, with counts.
    pub(super) async fn listings_of(
        &self,
        tenant: Option<&TenantId>,
        after: Option<&ConversationId>,
        limit: usize,
    ) -> Result<Vec<Listing>, StoreError> {
        let client = self.pool.get().await.map_err(db)?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let (after_tenant, after_id) = after.map(|a| (a.tenant().as_str(), a.as_str())).unzip();
        // A conversation whose first append has not committed yet has no summary: it
        // is listed with nothing counted, as its log would be read.
        let rows = client
            .query(
                "SELECT c.tenant, c.conversation, s.first_at, s.last_at,
                        coalesce(s.messages, 0), coalesce(s.requests, 0),
                        coalesce(cardinality(s.tips), 0), coalesce(s.models, '{}'),
                        coalesce(s.compactions, 0)
                 FROM handoff_conversations c
                 LEFT JOIN handoff_summaries s USING (tenant, conversation)
                 WHERE ($1::text IS NULL OR c.tenant = $1)
                   AND ($2::text IS NULL OR (c.tenant, c.conversation) > ($2, $3))
                 ORDER BY c.tenant, c.conversation LIMIT $4",
                &[
                    &tenant.map(TenantId::as_str),
                    &after_tenant,
                    &after_id,
                    &limit,
                ],
            )
            .await
            .map_err(db)?;
        Ok(rows
            .iter()
            .filter_map(|row| {
                let count = |i: usize| row.get::<_, i64>(i).unsigned_abs();
                Some(Listing {
                    id: conversation_of(row)?,
                    first_seen: row.get(2),
                    last_seen: row.get(3),
                    messages: count(4),
                    requests: count(5),
                    branches: u64::from(row.get::<_, i32>(6).unsigned_abs()),
                    models: row.get(7),
                    compactions: count(8),
                })
            })
            .collect())
    }
}
