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

mod schema;

use std::time::Duration;

use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use tokio_postgres::Row;

use super::{Committed, ConversationLog, Lease, LineProblem, ResponseEnd, Store, StoreError};
use crate::base::digest::{Digest, PrefixDigest};
use crate::base::id::ConversationId;
use crate::base::line::{Entry, Line, FORMAT_VERSION};
use crate::base::record::CompactionRecord;
use crate::base::tenant::TenantId;
use crate::redact::shown_url;

/// A pool of connections to the shared database.
pub struct PgStore {
    pool: Pool,
    /// The URL with its password masked, for messages.
    shown: String,
    /// This process's part of every lease holder name.
    holder: String,
}

fn db(err: impl std::fmt::Display) -> StoreError {
    StoreError::Database(err.to_string())
}

impl PgStore {
    /// Connects to `url` with at most `pool_size` connections and brings the schema up
    /// to date; fails when the database cannot be reached now.
    pub async fn connect(url: &str, pool_size: usize) -> Result<Self, StoreError> {
        let config: tokio_postgres::Config = url
            .parse()
            .map_err(|_| db("store.url is not a PostgreSQL connection URL"))?;
        let tls = tokio_postgres_rustls::MakeRustlsConnect::new(tls_config()?);
        let manager = Manager::from_config(
            config,
            tls,
            ManagerConfig {
                // A connection broken by a database restart is dropped and replaced.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(pool_size)
            .runtime(Runtime::Tokio1)
            // A database that is down answers quickly with 503, not after minutes.
            .wait_timeout(Some(Duration::from_secs(5)))
            .create_timeout(Some(Duration::from_secs(5)))
            .recycle_timeout(Some(Duration::from_secs(5)))
            .build()
            .map_err(db)?;
        let store = Self {
            pool,
            shown: shown_url(url).into_owned(),
            holder: format!("{}-{}", hostname(), std::process::id()),
        };
        let mut client = store.pool.get().await.map_err(db)?;
        let applied = schema::migrate(&mut client).await.map_err(db)?;
        let version = schema::version(&client).await.map_err(db)?;
        if version > schema::latest() {
            return Err(db(format!(
                "the database schema is version {version}, newer than this build's {}; upgrade handoff",
                schema::latest()
            )));
        }
        tracing::info!(database = %store.shown, applied, version, "store: postgres");
        Ok(store)
    }

    /// The server secret, created once by whichever replica starts first.
    pub async fn secret(&self) -> Result<[u8; 32], StoreError> {
        self.secret_or(&random_bytes().map_err(db)?).await
    }

    /// The database's secret, which becomes `candidate` if it has none yet.
    async fn secret_or(&self, candidate: &[u8; 32]) -> Result<[u8; 32], StoreError> {
        let client = self.pool.get().await.map_err(db)?;
        client
            .execute(
                "INSERT INTO handoff_secret (id, secret) VALUES (1, $1) ON CONFLICT (id) DO NOTHING",
                &[&candidate.as_slice()],
            )
            .await
            .map_err(db)?;
        let row = client
            .query_one("SELECT secret FROM handoff_secret WHERE id = 1", &[])
            .await
            .map_err(db)?;
        let bytes: Vec<u8> = row.get(0);
        bytes
            .try_into()
            .map_err(|_| db("handoff_secret.secret is not 32 bytes"))
    }

    async fn lines_after(
        &self,
        id: &ConversationId,
        seq: u64,
    ) -> Result<ConversationLog, StoreError> {
        let client = self.pool.get().await.map_err(db)?;
        let after = i64::try_from(seq).unwrap_or(i64::MAX);
        let lines = client
            .prepare_cached(
                "SELECT seq, line FROM handoff_lines
                 WHERE tenant = $1 AND conversation = $2 AND seq > $3 ORDER BY seq",
            )
            .await
            .map_err(db)?;
        let records = client
            .prepare_cached(
                "SELECT seq, record FROM handoff_compactions
                 WHERE tenant = $1 AND conversation = $2 AND seq > $3 ORDER BY seq",
            )
            .await
            .map_err(db)?;
        let key = (id.tenant().as_str(), id.as_str());
        // Both queries in one round trip: the client pipelines them.
        let (lines, records) = futures_util::future::try_join(
            client.query(&lines, &[&key.0, &key.1, &after]),
            client.query(&records, &[&key.0, &key.1, &after]),
        )
        .await
        .map_err(db)?;
        Ok(log_of(&lines, &records, seq))
    }
}

/// Rows into a log; a line this build cannot read is a problem, as on disk.
fn log_of(lines: &[Row], records: &[Row], after: u64) -> ConversationLog {
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
fn columns(line: &Line) -> (&'static str, Option<String>, Option<String>) {
    match &line.entry {
        Entry::Message(m) => (
            "message",
            Some(m.digest.to_hex()),
            m.parent.map(|p| p.to_hex()),
        ),
        Entry::Pinned(p) => ("pinned", Some(p.digest.to_hex()), None),
        Entry::Request(r) => ("request", None, r.head.map(|h| h.to_hex())),
        Entry::CompactBoundary(b) => ("compact_boundary", None, Some(b.prefix_digest.to_hex())),
    }
}

/// Reserves `count` positions in the conversation's log, taking its row lock until
/// the transaction ends; returns the first.
async fn reserve(
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
            for line in &lines {
                let (kind, digest, parent) = columns(line);
                texts.push(serde_json::to_string(line)?);
                kinds.push(kind);
                digests.push(digest);
                parents.push(parent);
            }
            let count = i64::try_from(lines.len()).map_err(db)?;
            let client = self.pool.get().await.map_err(db)?;
            // One statement, so one round trip and atomic by itself: the upsert takes the
            // conversation's row lock and hands out the positions, the insert uses them.
            let append = client
                .prepare_cached(
                    "WITH c AS (
                        INSERT INTO handoff_conversations AS c (tenant, conversation, last_seq)
                        VALUES ($1, $2, $3)
                        ON CONFLICT (tenant, conversation)
                        DO UPDATE SET last_seq = c.last_seq + EXCLUDED.last_seq, updated_at = now()
                        RETURNING last_seq
                     )
                     INSERT INTO handoff_lines (tenant, conversation, seq, kind, digest, parent, line)
                     SELECT $1, $2, c.last_seq - $3 + u.n, u.kind, u.digest, u.parent, u.line
                     FROM c, UNNEST($4::text[], $5::text[], $6::text[], $7::text[])
                          WITH ORDINALITY AS u(kind, digest, parent, line, n)
                     ON CONFLICT (tenant, conversation, kind, digest) WHERE digest IS NOT NULL
                     DO NOTHING",
                )
                .await
                .map_err(db)?;
            client
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
                    ],
                )
                .await
                .map_err(db)?;
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
            let holder = format!("{}-{}", self.holder, hex(&random_bytes().map_err(db)?[..6]));
            let client = self.pool.get().await.map_err(db)?;
            // The database's clock decides expiry, so replicas' clocks need not agree.
            let row = client
                .query_opt(
                    "INSERT INTO handoff_leases AS l (tenant, conversation, holder, epoch, expires_at)
                     VALUES ($1, $2, $3, 1, now() + make_interval(secs => $4))
                     ON CONFLICT (tenant, conversation) DO UPDATE
                     SET holder = EXCLUDED.holder, epoch = l.epoch + 1, expires_at = EXCLUDED.expires_at
                     WHERE l.expires_at < now()
                     RETURNING epoch",
                    &[&id.tenant().as_str(), &id.as_str(), &holder, &ttl.as_secs_f64()],
                )
                .await
                .map_err(db)?;
            Ok(row.map(|row| Lease {
                holder,
                epoch: row.get(0),
            }))
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
            let client = self.pool.get().await.map_err(db)?;
            let renewed = client
                .execute(
                    "UPDATE handoff_leases SET expires_at = now() + make_interval(secs => $5)
                     WHERE tenant = $1 AND conversation = $2 AND holder = $3 AND epoch = $4
                       AND expires_at >= now()",
                    &[
                        &id.tenant().as_str(),
                        &id.as_str(),
                        &lease.holder,
                        &lease.epoch,
                        &ttl.as_secs_f64(),
                    ],
                )
                .await
                .map_err(db)?;
            Ok(renewed == 1)
        }
        .boxed()
    }

    fn release(&self, id: &ConversationId, lease: &Lease) -> BoxFuture<'_, Result<(), StoreError>> {
        let (id, lease) = (id.clone(), lease.clone());
        async move {
            let client = self.pool.get().await.map_err(db)?;
            // Expired, not deleted: the epoch keeps growing across claims.
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
            let (kind, _, parent) = columns(&boundary);
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
            }
            tx.execute(
                "UPDATE handoff_leases SET expires_at = '-infinity'
                 WHERE tenant = $1 AND conversation = $2 AND holder = $3 AND epoch = $4",
                &[&tenant, &conversation, &lease.holder, &lease.epoch],
            )
            .await
            .map_err(db)?;
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
                     VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, response_id) DO NOTHING",
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

    fn describe(&self) -> String {
        self.shown.clone()
    }
}

fn conversation_of(row: &Row) -> Option<ConversationId> {
    let tenant = TenantId::parse(row.get(0)).ok()?;
    ConversationId::parse(tenant, row.get(1)).ok()
}

/// Server certificates are checked against the Mozilla roots; `sslmode` in the URL
/// says whether TLS is tried (`prefer`, the default), required, or off.
fn tls_config() -> Result<rustls::ClientConfig, StoreError> {
    let roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    Ok(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(db)?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

fn random_bytes() -> std::io::Result<[u8; 32]> {
    use std::io::Read;
    let mut bytes = [0u8; 32];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|name| name.trim().to_owned())
        .unwrap_or_else(|_| "replica".into())
}

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
            let (kind, digest, parent) = columns(line);
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
        tx.commit().await.map_err(db)?;
        Ok(Imported::Copied { lines, records })
    }

    /// Makes `secret` the shared secret if the database has none yet; returns whether
    /// the database's secret is now `secret`.
    pub async fn adopt_secret(&self, secret: &[u8; 32]) -> Result<bool, StoreError> {
        Ok(self.secret_or(secret).await? == *secret)
    }
}
