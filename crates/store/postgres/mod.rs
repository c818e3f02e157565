//! The shared store: a PostgreSQL database that several replicas write at once.
//!
//! Lines keep the disk format byte for byte, one row each, ordered per conversation by
//! `seq`. Appends take the conversation's row lock first and only that, so they never
//! deadlock, and a line's seq never commits behind a later one: a replica that read up
//! to seq N and asks for what came after misses nothing. Messages are unique on their
//! chain digest, so two replicas logging the same request write it once.
//!
//! Compactions are single flight through a lease row: claims and renewals are single
//! statements, nothing is held across the model call, and the commit re-checks the
//! claim (holder and epoch) under its row lock in the transaction that writes the pair.

mod connect;
mod import;
mod listing;
mod rows;
mod schema;
mod upkeep;

pub use connect::check_url;
pub(crate) use import::Imported;

use rows::{columns, conversation_of, counted, db, reserve};

use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::{Committed, ConversationLog, Lease, ResponseEnd, Store, StoreError, TookOver};
use crate::base::digest::{Digest, PrefixDigest};
use crate::base::id::ConversationId;
use crate::base::line::{written_units, Entry, Line, Written};
use crate::base::record::CompactionRecord;
use crate::base::tenant::TenantId;

/// A pool of connections to the shared database.
pub struct PgStore {
    pool: Pool,
    /// The URL with its password masked, for messages.
    shown: String,
    /// This process's part of every lease holder name: host, pid and a start nonce.
    holder: String,
    /// Claims made so far, the last part of a holder name.
    claims: std::sync::atomic::AtomicU64,
}

/// An append's statement after its first step, `c`, which gives the conversation's
/// positions: the lines, and the conversation's summary, in one statement. `tips`
/// loses the parents of the new messages and gains their heads.
macro_rules! append_with {
    ($c:literal) => {
        concat!(
            "WITH c AS (",
            $c,
            "     ),
     u AS (
        SELECT * FROM UNNEST($4::text[], $5::text[], $6::text[], $7::text[], $8::int8[],
                             $9::text[], $10::text[])
        WITH ORDINALITY AS u(kind, digest, parent, line, originals, model, at, n)
     ),
     kept AS (
        INSERT INTO handoff_lines (tenant, conversation, seq, kind, digest, parent, line)
        SELECT $1, $2, c.last_seq - $3 + u.n, u.kind, u.digest, u.parent, u.line FROM c, u
        ON CONFLICT (tenant, conversation, kind, digest) WHERE digest IS NOT NULL
        DO NOTHING
        RETURNING seq
     ),
     new AS (SELECT u.* FROM c, kept, u WHERE u.n = kept.seq - c.last_seq + $3),
     continued AS (SELECT parent FROM new WHERE originals > 0 AND parent IS NOT NULL)
     INSERT INTO handoff_summaries AS s
        (tenant, conversation, messages, requests, tips, models, first_at, last_at)
     SELECT $1, $2, sum(originals), count(*) FILTER (WHERE kind = 'request'),
        ARRAY(SELECT digest FROM new WHERE originals > 0 AND digest IS NOT NULL
              EXCEPT SELECT parent FROM continued),
        coalesce(array_agg(DISTINCT model) FILTER (WHERE model <> ''), '{}'),
        (array_agg(at ORDER BY n))[1], (array_agg(at ORDER BY n DESC))[1]
     FROM new HAVING count(*) > 0
     ON CONFLICT (tenant, conversation) DO UPDATE SET
        messages = s.messages + EXCLUDED.messages,
        requests = s.requests + EXCLUDED.requests,
        tips = ARRAY(SELECT unnest(s.tips) EXCEPT SELECT parent FROM continued
                     UNION SELECT unnest(EXCLUDED.tips)),
        models = ARRAY(SELECT DISTINCT unnest(s.models || EXCLUDED.models) ORDER BY 1),
        first_at = coalesce(s.first_at, EXCLUDED.first_at),
        last_at = EXCLUDED.last_at"
        )
    };
}

/// An append: the conversation's row made or moved on, then its lines and summary.
const APPEND: &str = append_with!(
    "
        INSERT INTO handoff_conversations AS c (tenant, conversation, last_seq)
        VALUES ($1, $2, $3)
        ON CONFLICT (tenant, conversation)
        DO UPDATE SET last_seq = c.last_seq + EXCLUDED.last_seq, updated_at = now()
        RETURNING last_seq
"
);

/// An append of a reply: only to a conversation that still has its row. One erased
/// while its request was in flight stays erased: the reply is not logged, and neither
/// its lines nor its summary come back.
const APPEND_REPLY: &str = append_with!(
    "
        UPDATE handoff_conversations AS c
        SET last_seq = c.last_seq + $3, updated_at = now()
        WHERE tenant = $1 AND conversation = $2
        RETURNING last_seq
"
);

impl PgStore {
    /// `UPDATE handoff_leases SET {set}` on `lease`'s own row while it is live (`$1`-`$4`
    /// are the row and the claim, `$5` is `extra`): 1 when the claim still held.
    async fn on_claim(
        &self,
        id: &ConversationId,
        lease: &Lease,
        set: &str,
        extra: Option<&f64>,
    ) -> Result<u64, StoreError> {
        let client = self.pool.get().await.map_err(db)?;
        let sql = format!(
            "UPDATE handoff_leases SET {set}
             WHERE tenant = $1 AND conversation = $2 AND holder = $3 AND epoch = $4
               AND expires_at >= now()"
        );
        let (tenant, conversation) = (id.tenant().as_str(), id.as_str());
        let mut params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
            vec![&tenant, &conversation, &lease.holder, &lease.epoch];
        params.extend(extra.map(|extra| extra as &(dyn tokio_postgres::types::ToSql + Sync)));
        client.execute(&sql, &params).await.map_err(db)
    }
}

impl Store for PgStore {
    fn append(
        &self,
        id: &ConversationId,
        lines: Vec<Line>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let id = id.clone();
        async move {
            let mut texts = Vec::with_capacity(lines.len());
            let mut kinds = Vec::with_capacity(lines.len());
            let mut digests = Vec::with_capacity(lines.len());
            let mut parents = Vec::with_capacity(lines.len());
            let mut originals = Vec::with_capacity(lines.len());
            let mut models = Vec::with_capacity(lines.len());
            let mut times = Vec::with_capacity(lines.len());
            for unit in written_units(&lines) {
                let (kind, digest, parent) = columns(&unit);
                let (count, model, at) = counted(&unit);
                let mut text = Vec::new();
                unit.write(&mut text)?;
                texts.push(String::from_utf8(text).map_err(db)?);
                kinds.push(kind);
                digests.push(digest);
                parents.push(parent);
                originals.push(count);
                models.push(model);
                times.push(at);
            }
            let count = i64::try_from(texts.len()).map_err(db)?;
            let client = self.pool.get().await.map_err(db)?;
            // One statement, so one round trip and atomic by itself: the upsert takes the
            // conversation's row lock and hands out the positions, the insert uses them,
            // and the summary counts what the insert kept (a message logged before is
            // skipped by its digest). Under that row lock, summaries never race.
            // A reply goes only where its request's lines are (see `APPEND_REPLY`).
            let replies = super::only_replies(&lines);
            let statement = if replies { APPEND_REPLY } else { APPEND };
            let append = client.prepare_cached(statement).await.map_err(db)?;
            let added = client
                .execute(
                    &append,
                    &[
                        &id.tenant().as_str(),
                        &id.as_str(),
                        &count,
                        &kinds,
                        &digests,
                        &parents,
                        &texts,
                        &originals,
                        &models,
                        &times,
                    ],
                )
                .await
                .map_err(db)?;
            if replies && added == 0 {
                // No row to append to (or a reply logged before, all its lines known).
                tracing::info!(conversation = %id, "no conversation row for the reply: it was erased while its request was in flight, so its reply is not logged");
            }
            Ok(())
        }
        .boxed()
    }

    fn read(&self, id: &ConversationId) -> BoxFuture<'_, Result<ConversationLog, StoreError>> {
        let id = id.clone();
        async move { self.lines_after(&id, 0).await }.boxed()
    }

    fn read_after(
        &self,
        id: &ConversationId,
        seq: u64,
    ) -> BoxFuture<'_, Result<ConversationLog, StoreError>> {
        let id = id.clone();
        async move { self.lines_after(&id, seq).await }.boxed()
    }

    fn shared(&self) -> bool {
        true
    }

    fn acquire(
        &self,
        id: &ConversationId,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<Option<Lease>, StoreError>> {
        let id = id.clone();
        async move {
            // Unique per claim without I/O on the request path.
            let claim = self.claims.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let holder = format!("{}-{claim}", self.holder);
            let client = self.pool.get().await.map_err(db)?;
            // The database's clock decides expiry, so replicas' clocks need not agree. The
            // claim it replaces is read in the same statement: one that expired without
            // a release (`-infinity`), or holds summary calls no committed record took,
            // was orphaned, and is named with those calls. (Read from the statement's
            // snapshot, not locked: a lock would skip the row this statement updates.
            // Of two racing claims only the one whose update applies returns a row.)
            let row = client
                .query_opt(
                    "WITH previous AS (
                         SELECT holder, epoch, calls, expires_at <> '-infinity' OR calls > 0 AS orphaned
                           FROM handoff_leases
                          WHERE tenant = $1 AND conversation = $2 AND expires_at < now()
                     )
                     INSERT INTO handoff_leases AS l (tenant, conversation, holder, epoch, expires_at)
                     VALUES ($1, $2, $3, 1, now() + make_interval(secs => $4))
                     ON CONFLICT (tenant, conversation) DO UPDATE
                     SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at,
                         calls = 0
                     WHERE l.expires_at < now()
                     RETURNING epoch,
                         (SELECT holder FROM previous WHERE orphaned),
                         (SELECT epoch FROM previous WHERE orphaned),
                         (SELECT calls FROM previous WHERE orphaned)",
                    &[&id.tenant().as_str(), &id.as_str(), &holder, &ttl.as_secs_f64()],
                )
                .await
                .map_err(db)?;
            Ok(row.map(|row| {
                let previous: (Option<String>, Option<i64>, Option<i64>) =
                    (row.get(1), row.get(2), row.get(3));
                let orphan = match previous {
                    (Some(holder), Some(epoch), Some(calls)) => Some(TookOver {
                        holder,
                        epoch,
                        calls: u64::try_from(calls).unwrap_or(0),
                    }),
                    _ => None,
                };
                Lease {
                    holder,
                    epoch: row.get(0),
                    orphan,
                }
            }))
        }
        .boxed()
    }

    fn leased(&self, id: &ConversationId) -> BoxFuture<'_, Result<bool, StoreError>> {
        let id = id.clone();
        async move {
            let client = self.pool.get().await.map_err(db)?;
            let row = client
                .query_opt(
                    "SELECT 1 FROM handoff_leases
                     WHERE tenant = $1 AND conversation = $2 AND expires_at >= now()",
                    &[&id.tenant().as_str(), &id.as_str()],
                )
                .await
                .map_err(db)?;
            Ok(row.is_some())
        }
        .boxed()
    }

    fn renew(
        &self,
        id: &ConversationId,
        lease: &Lease,
        ttl: Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let (id, lease) = (id.clone(), lease.clone());
        async move {
            let ttl = ttl.as_secs_f64();
            let set = "expires_at = now() + make_interval(secs => $5)";
            let renewed = self.on_claim(&id, &lease, set, Some(&ttl)).await?;
            Ok(renewed == 1)
        }
        .boxed()
    }

    fn count_call(
        &self,
        id: &ConversationId,
        lease: &Lease,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let (id, lease) = (id.clone(), lease.clone());
        async move {
            let counted = self
                .on_claim(&id, &lease, "calls = calls + 1", None)
                .await?;
            Ok(counted == 1)
        }
        .boxed()
    }

    fn release(&self, id: &ConversationId, lease: &Lease) -> BoxFuture<'_, Result<(), StoreError>> {
        let (id, lease) = (id.clone(), lease.clone());
        async move {
            // Expired, not deleted: the epoch keeps growing across claims. Its calls stay:
            // ones no record took are named by the claim that replaces it.
            let client = self.pool.get().await.map_err(db)?;
            client
                .execute(
                    "UPDATE handoff_leases SET expires_at = '-infinity'
                     WHERE tenant = $1 AND conversation = $2 AND holder = $3 AND epoch = $4",
                    &[
                        &id.tenant().as_str(),
                        &id.as_str(),
                        &lease.holder,
                        &lease.epoch,
                    ],
                )
                .await
                .map_err(db)?;
            Ok(())
        }
        .boxed()
    }

    fn commit_compaction(
        &self,
        id: &ConversationId,
        record: CompactionRecord,
        lease: &Lease,
    ) -> BoxFuture<'_, Result<Committed, StoreError>> {
        let (id, lease) = (id.clone(), lease.clone());
        async move {
            let text = serde_json::to_string(&record)?;
            let boundary = Line::now(Entry::CompactBoundary(record.boundary()));
            let (kind, _, parent) = columns(&Written::Line(&boundary));
            let boundary_text = serde_json::to_string(&boundary)?;
            let (tenant, conversation) = (id.tenant().as_str(), id.as_str());
            let mut client = self.pool.get().await.map_err(db)?;
            let tx = client.transaction().await.map_err(db)?;
            // The fence: the claim must still be ours, and it stays locked to the commit.
            let held = tx
                .query_opt(
                    "SELECT 1 FROM handoff_leases
                     WHERE tenant = $1 AND conversation = $2 AND holder = $3 AND epoch = $4
                       AND expires_at >= now()
                     FOR UPDATE",
                    &[&tenant, &conversation, &lease.holder, &lease.epoch],
                )
                .await
                .map_err(db)?;
            if held.is_none() {
                return Err(StoreError::LeaseLost(id.to_string()));
            }
            let seq = reserve(&tx, &id, 1).await?;
            let inserted = tx
                .execute(
                    "INSERT INTO handoff_compactions (tenant, conversation, prefix_digest, id, seq, record)
                     VALUES ($1, $2, $3, $4, $5, $6)
                     ON CONFLICT (tenant, conversation, prefix_digest) DO NOTHING",
                    &[
                        &tenant,
                        &conversation,
                        &record.source.prefix_digest.to_hex(),
                        &record.id,
                        &seq,
                        &text,
                    ],
                )
                .await
                .map_err(db)?;
            if inserted == 1 {
                tx.execute(
                    "INSERT INTO handoff_lines (tenant, conversation, seq, kind, digest, parent, line)
                     VALUES ($1, $2, $3, $4, NULL, $5, $6)",
                    &[&tenant, &conversation, &seq, &kind, &parent, &boundary_text],
                )
                .await
                .map_err(db)?;
                tx.execute(
                    "INSERT INTO handoff_summaries AS s (tenant, conversation, compactions, first_at, last_at)
                     VALUES ($1, $2, 1, $3, $3)
                     ON CONFLICT (tenant, conversation) DO UPDATE
                     SET compactions = s.compactions + 1, last_at = EXCLUDED.last_at",
                    &[&tenant, &conversation, &boundary.at],
                )
                .await
                .map_err(db)?;
                // The record holds its calls now: what stays on the claim is waste.
                let recorded = i64::try_from(record.summary_calls).unwrap_or(i64::MAX);
                tx.execute(
                    "UPDATE handoff_leases SET calls = greatest(calls - $5, 0)
                     WHERE tenant = $1 AND conversation = $2 AND holder = $3 AND epoch = $4",
                    &[&tenant, &conversation, &lease.holder, &lease.epoch, &recorded],
                )
                .await
                .map_err(db)?;
            }
            // The lease stays: a run that must cut again commits a second pair under it,
            // and the caller releases it when the run ends.
            tx.commit().await.map_err(db)?;
            Ok(if inserted == 1 {
                Committed::Written
            } else {
                Committed::Superseded
            })
        }
        .boxed()
    }

    fn list(
        &self,
        tenant: Option<TenantId>,
        after: Option<ConversationId>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<ConversationId>, StoreError>> {
        async move {
            let client = self.pool.get().await.map_err(db)?;
            let limit = i64::try_from(limit).unwrap_or(i64::MAX);
            let (after_tenant, after_id) = after
                .as_ref()
                .map(|a| (a.tenant().as_str(), a.as_str()))
                .unzip();
            let rows = client
                .query(
                    "SELECT tenant, conversation FROM handoff_conversations
                     WHERE ($1::text IS NULL OR tenant = $1)
                       AND ($2::text IS NULL OR (tenant, conversation) > ($2, $3))
                     ORDER BY tenant, conversation LIMIT $4",
                    &[
                        &tenant.as_ref().map(TenantId::as_str),
                        &after_tenant,
                        &after_id,
                        &limit,
                    ],
                )
                .await
                .map_err(db)?;
            Ok(rows.iter().filter_map(conversation_of).collect())
        }
        .boxed()
    }

    fn find(
        &self,
        name: &str,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<ConversationId>, StoreError>> {
        let name = name.to_owned();
        async move {
            let client = self.pool.get().await.map_err(db)?;
            let rows = client
                .query(
                    "SELECT tenant, conversation FROM handoff_conversations
                     WHERE conversation = $1 AND ($2::text IS NULL OR tenant = $2)
                     ORDER BY tenant",
                    &[&name, &tenant.as_ref().map(TenantId::as_str)],
                )
                .await
                .map_err(db)?;
            Ok(rows.iter().filter_map(conversation_of).collect())
        }
        .boxed()
    }

    fn remember_response(
        &self,
        id: &ConversationId,
        response_id: &str,
        head: Option<PrefixDigest>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let (id, response_id) = (id.clone(), response_id.to_owned());
        async move {
            let client = self.pool.get().await.map_err(db)?;
            client
                .execute(
                    "INSERT INTO handoff_responses (tenant, response_id, conversation, head)
                     VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, response_id)
                     DO UPDATE SET conversation = EXCLUDED.conversation, head = EXCLUDED.head",
                    &[
                        &id.tenant().as_str(),
                        &response_id,
                        &id.as_str(),
                        &head.map(|h| h.to_hex()),
                    ],
                )
                .await
                .map_err(db)?;
            Ok(())
        }
        .boxed()
    }

    fn response(
        &self,
        tenant: &TenantId,
        response_id: &str,
    ) -> BoxFuture<'_, Result<Option<ResponseEnd>, StoreError>> {
        let (tenant, response_id) = (tenant.clone(), response_id.to_owned());
        async move {
            let client = self.pool.get().await.map_err(db)?;
            let row = client
                .query_opt(
                    "SELECT conversation, head FROM handoff_responses
                     WHERE tenant = $1 AND response_id = $2",
                    &[&tenant.as_str(), &response_id],
                )
                .await
                .map_err(db)?;
            Ok(row.and_then(|row| {
                let conversation: &str = row.get(0);
                let head: Option<&str> = row.get(1);
                let id = ConversationId::parse(tenant.clone(), conversation).ok()?;
                Some((id, head.and_then(Digest::from_hex)))
            }))
        }
        .boxed()
    }

    fn record_object(
        &self,
        tenant: &TenantId,
        object: &str,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let (tenant, object) = (tenant.clone(), object.to_owned());
        async move {
            let client = self.pool.get().await.map_err(db)?;
            client
                .execute(
                    "INSERT INTO handoff_objects (tenant, object) VALUES ($1, $2)
                     ON CONFLICT DO NOTHING",
                    &[&tenant.as_str(), &object],
                )
                .await
                .map_err(db)?;
            Ok(())
        }
        .boxed()
    }

    fn object_owner(&self, object: &str) -> BoxFuture<'_, Result<Option<TenantId>, StoreError>> {
        let object = object.to_owned();
        async move {
            let client = self.pool.get().await.map_err(db)?;
            // Ownership refuses to record an object for a second tenant: one row.
            let row = client
                .query_opt(
                    "SELECT tenant FROM handoff_objects WHERE object = $1 LIMIT 1",
                    &[&object],
                )
                .await
                .map_err(db)?;
            row.map(|row| TenantId::parse(row.get::<_, &str>(0)))
                .transpose()
                .map_err(|err| StoreError::Database(err.to_string()))
        }
        .boxed()
    }

    fn activity(
        &self,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<crate::Activity>, StoreError>> {
        async move { self.activity_of(tenant.as_ref()).await }.boxed()
    }

    fn remove(
        &self,
        id: &ConversationId,
        unless: crate::Unless,
    ) -> BoxFuture<'_, Result<crate::Removed, StoreError>> {
        let id = id.clone();
        async move { self.remove_one(&id, unless).await }.boxed()
    }

    fn set_hold(
        &self,
        id: &ConversationId,
        hold: Option<crate::Hold>,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let id = id.clone();
        async move { self.hold_one(&id, hold.as_ref()).await }.boxed()
    }

    fn tombstone(&self, tombstone: crate::Tombstone) -> BoxFuture<'_, Result<(), StoreError>> {
        async move { self.bury(&tombstone).await }.boxed()
    }

    fn tombstones_after(
        &self,
        seq: u64,
    ) -> BoxFuture<'_, Result<Vec<crate::Tombstone>, StoreError>> {
        async move { self.buried_after(seq).await }.boxed()
    }

    fn stats(
        &self,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<crate::TenantStats>, StoreError>> {
        async move { self.stats_of(tenant.as_ref()).await }.boxed()
    }

    fn listings(
        &self,
        tenant: Option<TenantId>,
        after: Option<ConversationId>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Option<Vec<crate::Listing>>, StoreError>> {
        async move {
            self.listings_of(tenant.as_ref(), after.as_ref(), limit)
                .await
                .map(Some)
        }
        .boxed()
    }

    fn describe(&self) -> String {
        self.shown.clone()
    }
}
