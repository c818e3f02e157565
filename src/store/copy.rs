//! `handoff store copy`: moves a disk data dir into the shared database, conversation
//! by conversation, each in one transaction, so an interrupted copy is simply run again.

use std::path::Path;

use serde::Serialize;

use super::layout::{conversation_dir, list_ids, MESSAGES_FILE};
use super::postgres::Imported;
use super::{read_conversation, PgStore, StoreError};

/// What a copy did.
#[derive(Debug, Default, Serialize)]
pub struct CopyReport {
    /// Conversations written.
    pub copied: usize,
    /// Conversations the database already had.
    pub present: usize,
    /// Lines written.
    pub lines: usize,
    /// Compaction records written.
    pub records: usize,
    /// Lines of the data dir that were unreadable (torn or invalid), not copied.
    pub skipped_lines: usize,
    /// Whether the database's tenant secret is the data dir's, so that credentials map
    /// to the same tenants as before.
    pub same_secret: bool,
}

/// Why a copy stopped.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// The data dir could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// What.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// The database refused.
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// Copies every conversation of `data_dir` (and its tenant secret, when the database
/// has none yet) into `store`.
pub async fn copy_data_dir(data_dir: &Path, store: &PgStore) -> Result<CopyReport, CopyError> {
    let read_error = |path: &Path| {
        let path = path.display().to_string();
        move |source| CopyError::Read { path, source }
    };
    let mut report = CopyReport::default();
    let secret_file = data_dir.join(super::layout::SECRET_FILE);
    report.same_secret = match std::fs::read(&secret_file) {
        Ok(bytes) => match <[u8; 32]>::try_from(bytes.as_slice()) {
            Ok(secret) => store.adopt_secret(&secret).await?,
            Err(_) => false,
        },
        // A data dir that never served a request has no secret; nothing to keep.
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => true,
        Err(err) => return Err(read_error(&secret_file)(err)),
    };
    let ids = list_ids(data_dir, None, None, usize::MAX).map_err(read_error(data_dir))?;
    for id in ids {
        let path = conversation_dir(data_dir, &id).join(MESSAGES_FILE);
        let log = read_conversation(data_dir, &path).map_err(read_error(&path))?;
        report.skipped_lines += log.problems.len();
        match store.import(&id, &log).await? {
            Imported::Copied { lines, records } => {
                report.copied += 1;
                report.lines += lines;
                report.records += records;
            }
            Imported::Present => report.present += 1,
        }
    }
    Ok(report)
}
