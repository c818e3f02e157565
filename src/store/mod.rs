//! Where originals live. The [`Store`] trait has the operations a shared backend
//! (PostgreSQL) would also provide; [`DiskStore`] is the embedded default: one folder
//! per conversation under `data_dir/tenants/<tenant>/conversations/`.

mod disk;
pub mod layout;
mod memory;
mod writer;

use futures_util::future::BoxFuture;

/// The line format, kept here for callers of the store's API.
pub use crate::base::line;
pub use disk::{read_conversation, read_log_file, ConversationLog, DiskStore, LineProblem};
pub use layout::{COMPACTIONS_FILE, MESSAGES_FILE};
pub use memory::MemoryStore;
pub use writer::Writer;

use crate::base::id::ConversationId;
use crate::base::line::Line;
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
}

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

    /// Commits a compaction: its record, then its boundary. Only the pair counts.
    fn commit_compaction(
        &self,
        id: &ConversationId,
        record: CompactionRecord,
    ) -> BoxFuture<'_, Result<(), StoreError>>;

    /// Conversations in (tenant, id) order, of `tenant` or of all, after `after`, at
    /// most `limit`.
    fn list(
        &self,
        tenant: Option<TenantId>,
        after: Option<ConversationId>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<ConversationId>, StoreError>>;
}
