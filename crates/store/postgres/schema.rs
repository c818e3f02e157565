//! The database schema, as numbered migrations applied at start.
//!
//! Every replica runs them when it starts, often at the same moment: one transaction
//! under an advisory lock applies what is missing and records each version, so a
//! second replica waits, then finds nothing to do.

use tokio_postgres::Client;

/// An arbitrary key for `pg_advisory_xact_lock`, the same in every replica.
const MIGRATION_LOCK: i64 = 0x6861_6e64_6f66_6601;

/// The migrations, in order; a released one is never edited, only followed.
const MIGRATIONS: &[(i32, &str)] = &[
    (
        1,
        r#"
-- The server secret that turns credentials into tenants: one row, made once.
CREATE TABLE handoff_secret (
    id smallint PRIMARY KEY CHECK (id = 1),
    secret bytea NOT NULL
);
-- One row per conversation; last_seq hands out the positions of its lines, and its
-- row lock orders concurrent appends, so a line never commits behind a later one.
CREATE TABLE handoff_conversations (
    tenant text NOT NULL,
    conversation text NOT NULL,
    last_seq bigint NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant, conversation)
);
-- The log of originals, append-only: messages (client and upstream), pinned sets,
-- requests and compaction boundaries, each line exactly as the disk store writes it.
CREATE TABLE handoff_lines (
    tenant text NOT NULL,
    conversation text NOT NULL,
    seq bigint NOT NULL,
    kind text NOT NULL,
    digest text,
    parent text,
    line text NOT NULL,
    PRIMARY KEY (tenant, conversation, seq)
);
-- A message (or pinned set) is logged once, whichever replica saw it first.
CREATE UNIQUE INDEX handoff_lines_digest
    ON handoff_lines (tenant, conversation, kind, digest) WHERE digest IS NOT NULL;
-- Compaction records; at most one per covered prefix, across replicas.
CREATE TABLE handoff_compactions (
    tenant text NOT NULL,
    conversation text NOT NULL,
    prefix_digest text NOT NULL,
    id text NOT NULL,
    seq bigint NOT NULL,
    record text NOT NULL,
    PRIMARY KEY (tenant, conversation, prefix_digest)
);
-- Single flight across replicas: who may compact a conversation, until when, and the
-- epoch that fences a holder whose claim ran out.
CREATE TABLE handoff_leases (
    tenant text NOT NULL,
    conversation text NOT NULL,
    holder text NOT NULL,
    epoch bigint NOT NULL,
    expires_at timestamptz NOT NULL,
    PRIMARY KEY (tenant, conversation)
);
-- Responses API ids, so `previous_response_id` finds its conversation on any replica.
CREATE TABLE handoff_responses (
    tenant text NOT NULL,
    response_id text NOT NULL,
    conversation text NOT NULL,
    head text,
    PRIMARY KEY (tenant, response_id)
);
"#,
    ),
    (
        2,
        r#"
-- Upstream objects (files, batches, vector stores…) by the tenant that created them.
CREATE TABLE handoff_objects (
    tenant text NOT NULL,
    object text NOT NULL,
    PRIMARY KEY (tenant, object)
);
"#,
    ),
    (
        3,
        r#"
-- An object's owner is looked up by the object alone: one tenant may name it.
CREATE INDEX handoff_objects_by_object ON handoff_objects (object);
"#,
    ),
    (
        4,
        r#"
-- Retention reads conversations by age; a hold (JSON: who, when, why) keeps one.
ALTER TABLE handoff_conversations ADD COLUMN hold text;
CREATE INDEX handoff_conversations_by_age ON handoff_conversations (updated_at);
-- What was erased or pruned, never the content; replicas follow it to evict caches.
CREATE TABLE handoff_tombstones (
    seq bigserial PRIMARY KEY,
    tombstone text NOT NULL
);
"#,
    ),
    (
        5,
        r#"
-- What a listing shows of a conversation, kept by the statements that write its lines,
-- so a page of conversations reads one row each instead of their logs. `tips` are the
-- heads no logged message continues: its length is the number of branches.
CREATE TABLE handoff_summaries (
    tenant text NOT NULL,
    conversation text NOT NULL,
    messages bigint NOT NULL DEFAULT 0,
    requests bigint NOT NULL DEFAULT 0,
    tips text[] NOT NULL DEFAULT '{}',
    models text[] NOT NULL DEFAULT '{}',
    compactions bigint NOT NULL DEFAULT 0,
    first_at text,
    last_at text,
    PRIMARY KEY (tenant, conversation)
);
-- Counts a conversation's summary from its log (of all when both are NULL): once for
-- the logs written before this migration, and after an import.
CREATE FUNCTION handoff_recount(of_tenant text, of_conversation text) RETURNS void
LANGUAGE sql AS $recount$
INSERT INTO handoff_summaries AS s
    (tenant, conversation, messages, requests, tips, models, compactions, first_at, last_at)
SELECT c.tenant, c.conversation,
    (SELECT coalesce(sum(CASE l.kind WHEN 'messages' THEN json_array_length(l.line::json -> 'messages')
                                      ELSE 1 END), 0)
       FROM handoff_lines l
      WHERE l.tenant = c.tenant AND l.conversation = c.conversation
        AND l.kind IN ('message', 'messages')),
    (SELECT count(*) FROM handoff_lines l
      WHERE l.tenant = c.tenant AND l.conversation = c.conversation AND l.kind = 'request'),
    ARRAY(SELECT DISTINCT l.digest FROM handoff_lines l
           WHERE l.tenant = c.tenant AND l.conversation = c.conversation
             AND l.kind IN ('message', 'messages')
          EXCEPT
          SELECT l.parent FROM handoff_lines l
           WHERE l.tenant = c.tenant AND l.conversation = c.conversation
             AND l.kind IN ('message', 'messages') AND l.parent IS NOT NULL),
    ARRAY(SELECT DISTINCT l.line::json ->> 'model' FROM handoff_lines l
           WHERE l.tenant = c.tenant AND l.conversation = c.conversation AND l.kind = 'request'
             AND l.line::json ->> 'model' <> ''
           ORDER BY 1),
    (SELECT count(*) FROM handoff_compactions k
      WHERE k.tenant = c.tenant AND k.conversation = c.conversation),
    (SELECT l.line::json ->> 'at' FROM handoff_lines l
      WHERE l.tenant = c.tenant AND l.conversation = c.conversation ORDER BY l.seq LIMIT 1),
    (SELECT l.line::json ->> 'at' FROM handoff_lines l
      WHERE l.tenant = c.tenant AND l.conversation = c.conversation ORDER BY l.seq DESC LIMIT 1)
FROM handoff_conversations c
WHERE (of_tenant IS NULL OR c.tenant = of_tenant)
  AND (of_conversation IS NULL OR c.conversation = of_conversation)
ON CONFLICT (tenant, conversation) DO UPDATE SET
    messages = EXCLUDED.messages, requests = EXCLUDED.requests, tips = EXCLUDED.tips,
    models = EXCLUDED.models, compactions = EXCLUDED.compactions,
    first_at = EXCLUDED.first_at, last_at = EXCLUDED.last_at
$recount$;
SELECT handoff_recount(NULL, NULL);
"#,
    ),
    (
        6,
        r#"
-- The summary calls each claim made, counted before each call: a claim taken over
-- unreleased (its replica killed, or cut off from the database) is named with them.
ALTER TABLE handoff_leases ADD COLUMN calls bigint NOT NULL DEFAULT 0;
"#,
    ),
];

/// The newest schema version this build knows.
pub(super) fn latest() -> i32 {
    MIGRATIONS.last().map_or(0, |(version, _)| *version)
}

/// Applies the missing migrations; returns how many ran. A database at a newer
/// version than this build is an error, not something to write into.
pub(crate) async fn migrate(client: &mut Client) -> Result<usize, tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS handoff_schema (
            version integer PRIMARY KEY,
            applied_at timestamptz NOT NULL DEFAULT now()
        )",
    )
    .await?;
    let current: i32 = tx
        .query_one("SELECT coalesce(max(version), 0) FROM handoff_schema", &[])
        .await?
        .get(0);
    let mut applied = 0;
    for (version, sql) in MIGRATIONS.iter().filter(|(v, _)| *v > current) {
        tx.batch_execute(sql).await?;
        tx.execute(
            "INSERT INTO handoff_schema (version) VALUES ($1)",
            &[version],
        )
        .await?;
        applied += 1;
    }
    tx.commit().await?;
    Ok(applied)
}

/// The schema version of the database.
pub(super) async fn version(client: &Client) -> Result<i32, tokio_postgres::Error> {
    Ok(client
        .query_one("SELECT coalesce(max(version), 0) FROM handoff_schema", &[])
        .await?
        .get(0))
}
