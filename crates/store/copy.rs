//! `handoff store copy`: moves a disk data dir into the shared database, conversation
//! by conversation, each in one transaction, so an interrupted copy is simply run again.

use std::path::Path;

use serde::Serialize;

use super::layout::{conversation_dir, list_ids, MESSAGES_FILE};
use super::postgres::Imported;
use super::{read_conversation, ConversationLog, LineProblem, PgStore, StoreError};

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
    /// Lines of the data dir that were unreadable (torn or invalid), not copied: only
    /// with [`Unverified::Copy`].
    pub skipped_lines: usize,
    /// Conversations copied although their logs did not verify.
    pub unverified: usize,
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
    /// Logs that do not verify, and nothing was copied: a copy would keep what reads
    /// as lines and drop the rest, silently.
    #[error("{} conversation(s) do not verify, nothing copied (see `handoff audit verify`; --allow-problems copies them without their unreadable lines): {}", .0.len(), .0.join("; "))]
    Unverified(Vec<String>),
}

/// What a copy does with a conversation whose log does not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unverified {
    /// Copy nothing, and say which ones.
    Refuse,
    /// Copy what reads, and count what did not.
    Copy,
}

/// The problems of a log, as `audit verify` finds them.
pub type Verifier<'a> = &'a (dyn Fn(&ConversationLog) -> Vec<LineProblem> + Sync);

/// Copies every conversation of `data_dir` (and its tenant secret, when the database
/// has none yet) into `store`. Every log is verified first; one that does not verify
/// stops the copy before anything is written, unless `unverified` says to copy it.
pub async fn copy_data_dir(
    data_dir: &Path,
    store: &PgStore,
    verify: Verifier<'_>,
    unverified: Unverified,
) -> Result<CopyReport, CopyError> {
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
    // Read twice rather than held: a data dir can be larger than memory.
    let mut refused = Vec::new();
    for id in &ids {
        let path = conversation_dir(data_dir, id).join(MESSAGES_FILE);
        let log = read_conversation(data_dir, &path).map_err(read_error(&path))?;
        if let Some(first) = verify(&log).first() {
            refused.push(format!(
                "{}/{id}: line {}: {}",
                id.tenant(),
                first.line,
                first.reason
            ));
        }
    }
    if unverified == Unverified::Refuse && !refused.is_empty() {
        return Err(CopyError::Unverified(refused));
    }
    report.unverified = refused.len();
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
