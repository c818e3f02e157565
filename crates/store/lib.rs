//! Where originals live. The [`Store`] trait has the operations every backend
//! provides; [`DiskStore`] is the embedded default (one folder per conversation under
//! `data_dir/tenants/<tenant>/conversations/`), [`PgStore`] the shared one.
//!
//! Its own crate, `handoff-store`, on the vocabulary and the core only: it knows no wire
//! format and no compaction. [`tenant`] names tenants from credential bytes, and
//! [`adoption`] is the rule that says which compaction records count.

#![forbid(unsafe_code)]

// The layers below, under the names every layer uses for them.
use handoff_base as base;
use handoff_core::{config, metrics, redact};

pub mod adoption;

pub mod blocks;
mod conversation_log;
mod copy;
mod disk;
mod disk_read;
mod disk_upkeep;
pub mod layout;
mod listing;
mod lock;
mod memory;
mod open;
pub mod perms;
mod postgres;
mod response_index;
pub mod tenant;
pub mod upkeep;
mod writer;

use futures_util::future::BoxFuture;

/// The line format, kept here for callers of the store's API.
pub use crate::base::line;
pub use crate::base::record::TookOver;
pub use conversation_log::{ConversationLog, LineProblem};
pub use copy::{copy_data_dir, CopyError, CopyReport, Unverified, Verifier};
pub use disk::DiskStore;
pub use disk_read::{read_conversation, read_conversation_index, read_log_file};
pub use layout::{resolve_in, COMPACTIONS_FILE, MESSAGES_FILE};
pub use listing::Listing;
pub use lock::{DataDirLock, LockError, LOCK_FILE};
pub use memory::MemoryStore;
pub use open::{open, OpenError, Opened};
pub use postgres::{check_url, PgStore};
pub use upkeep::{Activity, Hold, Removed, TenantStats, Tombstone, Unless};
pub use writer::Writer;

use crate::base::digest::PrefixDigest;
use crate::base::id::ConversationId;
use crate::base::line::{Entry, Line, Source};
use crate::base::record::CompactionRecord;
use crate::base::tenant::TenantId;

/// Why the store could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A write failed (disk full, permissions...). Nothing already written is damaged.
    #[error("cannot write conversation {id}: {source}")]
    Write {
        /// The conversation.
        id: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A read failed.
    #[error("cannot read conversation {id}: {source}")]
    Read {
        /// The conversation.
        id: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A line could not be serialised.
    #[error("cannot encode a log line: {0}")]
    Encode(#[from] serde_json::Error),
    /// The database could not be reached or refused the statement.
    #[error("the database is unavailable: {0}")]
    Database(String),
    /// The write would take the tenant past `store.tenant_quota_bytes`: nothing was
    /// written.
    #[error("tenant {tenant} holds {used} bytes of logged conversations; {wanted} more would pass its quota of {quota} (store.tenant_quota_bytes)")]
    QuotaExceeded {
        /// The tenant.
        tenant: String,
        /// Bytes it holds.
        used: u64,
        /// Bytes the refused write would have added.
        wanted: u64,
        /// Its quota.
        quota: u64,
    },
    /// This replica's compaction lease expired or was taken over: it commits nothing.
    #[error("lost the compaction lease of conversation {0}; nothing was committed")]
    LeaseLost(String),
}

/// A claim on a conversation's compaction. Its epoch grows with every claim, so a
/// commit fenced by it fails once another replica has claimed the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// Who holds it: unique per claim.
    pub holder: String,
    /// The fencing token.
    pub epoch: i64,
    /// The claim this one took over whose run left no record of its work (it expired
    /// unreleased: killed, or cut off from the database; or it was released holding
    /// summary calls no committed record took), with those calls.
    pub orphan: Option<TookOver>,
}

impl Lease {
    /// The lease of a store with a single writer: the in-process lock is enough.
    pub fn local() -> Self {
        Self::new("local".into(), 0)
    }

    /// A claim by `holder` at `epoch` that took over no orphan.
    pub fn new(holder: String, epoch: i64) -> Self {
        Self {
            holder,
            epoch,
            orphan: None,
        }
    }
}

/// Where a response ended: its conversation and the prefix its last item closes.
pub(crate) type ResponseEnd = (ConversationId, Option<PrefixDigest>);

/// What a commit did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// The record and its boundary were written.
    Written,
    /// Another replica's record already covered the prefix: nothing was written, and
    /// the caller adopts that one.
    Superseded,
}

/// True when `lines` are a reply and the decision logged with it: what an admitted
/// request already caused, appended only where its request's lines are.
pub(crate) fn only_replies(lines: &[Line]) -> bool {
    lines.iter().all(|line| match &line.entry {
        Entry::Message(m) => m.source == Source::Upstream,
        Entry::Decision(_) => true,
        _ => false,
    })
}

/// Which logged messages keep their text in an index read, by their raw JSON.
pub(crate) type KeepText = fn(&str) -> bool;

/// The operations every backend provides.
pub trait Store: Send + Sync {
    /// Appends `lines` to the conversation's message log, all or nothing.
    fn append(
        &self,
        id: &ConversationId,
        lines: Vec<Line>,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Reads a conversation's whole log and its compaction records (find by digest
    /// works on the result: the adoption rule keys records by prefix digest);
    /// an unknown conversation reads as empty.
    fn read(&self, id: &ConversationId) -> BoxFuture<'_, Result<ConversationLog, StoreError>>;

    /// What tracking needs of a conversation, without holding its whole log in
    /// memory: the log with the text of each message `keep` refuses dropped (its
    /// digests stay). Tracking reads only digests, except where a format needs more.
    fn read_index(
        &self,
        id: &ConversationId,
        keep: KeepText,
    ) -> BoxFuture<'_, Result<ConversationLog, StoreError>> {
        let _ = keep;
        self.read(id)
    }

    /// Lines and records committed after `seq` (a [`ConversationLog::last_seq`]):
    /// what other replicas wrote since this one last looked. Only a shared store has any.
    fn read_after(
        &self,
        id: &ConversationId,
        seq: u64,
    ) -> BoxFuture<'_, Result<ConversationLog, StoreError>> {
        let _ = (id, seq);
        Box::pin(async { Ok(ConversationLog::default()) })
    }

    /// Whether other processes write to this store too, so that cached state can be
    /// stale and compactions need a lease.
    fn shared(&self) -> bool {
        false
    }

    /// Claims the conversation's compaction for `ttl`; `None` while another live
    /// claim holds it.
    fn acquire(
        &self,
        id: &ConversationId,
        ttl: std::time::Duration,
    ) -> BoxFuture<'_, Result<Option<Lease>, StoreError>> {
        let _ = (id, ttl);
        Box::pin(async { Ok(Some(Lease::local())) })
    }

    /// True while a live claim (another replica's, or this one's) holds the
    /// conversation's compaction: a compaction is running somewhere.
    fn leased(&self, id: &ConversationId) -> BoxFuture<'_, Result<bool, StoreError>> {
        let _ = id;
        Box::pin(async { Ok(false) })
    }

    /// Counts one summary call on `lease` before it is made; false when the lease was
    /// lost (the call must not be made: its work could not commit). A store with a
    /// single writer has nothing to count.
    fn count_call(
        &self,
        id: &ConversationId,
        lease: &Lease,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let _ = (id, lease);
        Box::pin(async { Ok(true) })
    }

    /// Extends `lease` by `ttl`; false when it was lost.
    fn renew(
        &self,
        id: &ConversationId,
        lease: &Lease,
        ttl: std::time::Duration,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let _ = (id, lease, ttl);
        Box::pin(async { Ok(true) })
    }

    /// Gives `lease` up early (a run that failed or found nothing to do).
    fn release(&self, id: &ConversationId, lease: &Lease) -> BoxFuture<'_, Result<(), StoreError>> {
        let _ = (id, lease);
        Box::pin(async { Ok(()) })
    }

    /// Commits a compaction under `lease`: its record, then its boundary. Only the
    /// pair counts; a lost lease commits nothing.
    fn commit_compaction(
        &self,
        id: &ConversationId,
        record: CompactionRecord,
        lease: &Lease,
    ) -> BoxFuture<'_, Result<Committed, StoreError>>;

    /// Every conversation named `name`, of `tenant` or of any.
    fn find(
        &self,
        name: &str,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<ConversationId>, StoreError>>;

    /// Remembers that the upstream's response `response_id` ended at `head` of `id`,
    /// for a later `previous_response_id` on any replica. Only a shared store keeps it.
    fn remember_response(
        &self,
        id: &ConversationId,
        response_id: &str,
        head: Option<PrefixDigest>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let _ = (id, response_id, head);
        Box::pin(async { Ok(()) })
    }

    /// The conversation and prefix a response id ended, if this store kept it.
    fn response(
        &self,
        tenant: &TenantId,
        response_id: &str,
    ) -> BoxFuture<'_, Result<Option<ResponseEnd>, StoreError>> {
        let _ = (tenant, response_id);
        Box::pin(async { Ok(None) })
    }

    /// Records that `tenant` created the upstream object `object` (a file, a batch, a
    /// vector store…), so that only `tenant` may name it through a shared upstream key.
    fn record_object(
        &self,
        tenant: &TenantId,
        object: &str,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// The tenant that created the upstream object `object`, if any did. One lookup in
    /// an index, whatever the number of objects.
    fn object_owner(&self, object: &str) -> BoxFuture<'_, Result<Option<TenantId>, StoreError>>;

    /// Sets the bytes each tenant may hold (0: no quota); a store that counts them
    /// refuses, before writing, a request's lines that would pass it. Replies, and the
    /// indexes written with them, are always logged: they are counted, and the next
    /// request is refused.
    fn set_quota(&self, bytes: u64) {
        let _ = bytes;
    }

    /// How many bytes `tenant`'s conversations hold in the store; `None` where the
    /// store does not count them.
    fn tenant_bytes(&self, tenant: &TenantId) -> BoxFuture<'_, Result<Option<u64>, StoreError>> {
        let _ = tenant;
        Box::pin(async { Ok(None) })
    }

    /// Every conversation of `tenant`, or of all: when it was last written, whether it
    /// is held, its size. What retention and compression choose from.
    fn activity(
        &self,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<Activity>, StoreError>> {
        let _ = tenant;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Removes a conversation whole (its log, its records, its hold), or nothing,
    /// unless `unless` applies. The response ids that lead to it go with the next
    /// [`Store::tidy_indexes`].
    fn remove(
        &self,
        id: &ConversationId,
        unless: Unless,
    ) -> BoxFuture<'_, Result<Removed, StoreError>> {
        let _ = (id, unless);
        Box::pin(async { Ok(Removed::Missing) })
    }

    /// Drops the response ids of `tenant` that lead to removed conversations, after a
    /// batch of [`Store::remove`]s. (The objects a tenant created stay its own: they
    /// may still be at the upstream, and no other tenant may reach them.)
    fn tidy_indexes(&self, tenant: &TenantId) -> BoxFuture<'_, Result<(), StoreError>> {
        let _ = tenant;
        Box::pin(async { Ok(()) })
    }

    /// Puts a hold on a conversation (`Some`) or lifts it (`None`); false when the
    /// conversation is not in the store.
    fn set_hold(
        &self,
        id: &ConversationId,
        hold: Option<Hold>,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let _ = (id, hold);
        Box::pin(async { Ok(false) })
    }

    /// Appends a tombstone: what was removed, when and by whom, never the content.
    fn tombstone(&self, tombstone: Tombstone) -> BoxFuture<'_, Result<(), StoreError>> {
        let _ = tombstone;
        Box::pin(async { Ok(()) })
    }

    /// Tombstones after position `seq`, oldest first: what a replica evicts from its
    /// caches when another process removed conversations. Only a shared store has any.
    fn tombstones_after(&self, seq: u64) -> BoxFuture<'_, Result<Vec<Tombstone>, StoreError>> {
        let _ = seq;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Compresses the conversation's log if it was last written before `idle_since`;
    /// the bytes before and after, or `None` when it did nothing.
    fn compress(
        &self,
        id: &ConversationId,
        idle_since: std::time::SystemTime,
    ) -> BoxFuture<'_, Result<Option<(u64, u64)>, StoreError>> {
        let _ = (id, idle_since);
        Box::pin(async { Ok(None) })
    }

    /// Deletes what upkeep left behind: folders a removal or a compression retired,
    /// copies a crash interrupted (`all` at start, when nothing reads them).
    fn sweep(&self, all: bool) -> BoxFuture<'_, Result<(), StoreError>> {
        let _ = all;
        Box::pin(async { Ok(()) })
    }

    /// Conversations, requests and bytes, per tenant (of `tenant`, or all).
    fn stats(
        &self,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<TenantStats>, StoreError>> {
        let _ = tenant;
        Box::pin(async { Ok(Vec::new()) })
    }

    /// Where the store is, for messages: a folder or a masked database URL.
    fn describe(&self) -> String;

    /// Conversations in (tenant, id) order, of `tenant` or of all, after `after`, at
    /// most `limit`.
    fn list(
        &self,
        tenant: Option<TenantId>,
        after: Option<ConversationId>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<ConversationId>, StoreError>>;

    /// Like [`Store::list`], with each conversation's counts, if the store keeps them;
    /// `None` when a listing must read the logs.
    fn listings(
        &self,
        tenant: Option<TenantId>,
        after: Option<ConversationId>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Option<Vec<Listing>>, StoreError>> {
        let _ = (tenant, after, limit);
        Box::pin(async { Ok(None) })
    }
}
