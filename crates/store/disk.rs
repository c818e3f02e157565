//! The local-disk store: one folder per conversation ([`super::layout`]), appended by
//! the writer thread, read on demand. Start-up reads nothing.

use std::path::{Path, PathBuf};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::conversation_log::ConversationLog;
use super::disk_read::{read_conversation, read_conversation_index};
use super::disk_upkeep;
use super::layout::find;
use super::layout::{conversation_dir, list_ids, COMPACTIONS_FILE, MESSAGES_FILE};
use super::response_index;
use super::upkeep::{Activity, Hold, Removed, TenantStats, Tombstone, Unless};
use super::{Committed, KeepText, Lease, ResponseEnd, Store, StoreError, Writer};
use crate::base::digest::PrefixDigest;
use crate::base::id::ConversationId;
use crate::base::line::{encode, Entry, Line};
use crate::base::record::CompactionRecord;
use crate::base::tenant::TenantId;

/// The embedded store: one folder per conversation.
pub struct DiskStore {
    data_dir: PathBuf,
    writer: Writer,
    /// Bytes each tenant's folder holds, counted once (a walk of the folder) and then
    /// kept up to date by the appends.
    usage: std::sync::Mutex<std::collections::HashMap<TenantId, u64>>,
    /// Who created each upstream object, read on the first lookup.
    objects: tokio::sync::OnceCell<std::sync::Mutex<response_index::ObjectOwners>>,
    /// `store.tenant_quota_bytes`; 0: none.
    quota: std::sync::atomic::AtomicU64,
}

/// Whether a write may be refused for the tenant's quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Quota {
    /// A request's lines, a compaction: refused when they would pass the quota.
    Checked,
    /// A reply and its indexes, written after the client was answered: always logged.
    Counted,
}

impl DiskStore {
    /// True when a tombstone erased `id` (or its whole tenant) at or after `since`, in
    /// milliseconds since the epoch. Read at each compaction commit: tombstones are a
    /// line an erasure, and commits are rare.
    async fn erased_since(&self, id: &ConversationId, since: i64) -> Result<bool, StoreError> {
        let path = self.data_dir.join(super::layout::TOMBSTONES_FILE);
        let bytes = match tokio::fs::read(&path).await {
            Ok(bytes) => bytes,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source) => {
                return Err(StoreError::Read {
                    id: super::layout::TOMBSTONES_FILE.into(),
                    source,
                })
            }
        };
        let erased = bytes
            .split(|b| *b == b'\n')
            .filter_map(|line| serde_json::from_slice::<Tombstone>(line).ok())
            .filter(|tombstone| tombstone.tenant == id.tenant().as_str())
            .filter(|tombstone| {
                tombstone.whole_tenant || tombstone.conversations.iter().any(|c| c == id.as_str())
            })
            .filter_map(|tombstone| humantime::parse_rfc3339_weak(&tombstone.at).ok())
            .filter_map(|at| at.duration_since(std::time::UNIX_EPOCH).ok())
            .any(|at| i64::try_from(at.as_millis()).unwrap_or(i64::MAX) >= since);
        Ok(erased)
    }

    /// A store under `data_dir`, writing through `writer`.
    pub fn new(data_dir: &Path, writer: Writer) -> Self {
        Self {
            data_dir: data_dir.to_owned(),
            writer,
            usage: std::sync::Mutex::default(),
            objects: tokio::sync::OnceCell::new(),
            quota: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Counts `bytes` against `tenant`'s usage before they are written; a checked write
    /// that would pass the quota is refused, and nothing is counted.
    async fn account(&self, tenant: &TenantId, bytes: u64, quota: Quota) -> Result<(), StoreError> {
        let limit = self.quota.load(std::sync::atomic::Ordering::Relaxed);
        if limit > 0 {
            // Usage is read from the folder once, then kept by these counts.
            self.tenant_bytes(tenant).await?;
        }
        let Ok(mut usage) = self.usage.lock() else {
            return Ok(());
        };
        // Without a quota nobody asked yet: the first count walks the folder.
        let Some(used) = usage.get_mut(tenant) else {
            return Ok(());
        };
        if quota == Quota::Checked && limit > 0 && *used + bytes > limit {
            return Err(StoreError::QuotaExceeded {
                tenant: tenant.to_string(),
                used: *used,
                wanted: bytes,
                quota: limit,
            });
        }
        *used += bytes;
        Ok(())
    }

    /// Takes back the count of a write that failed.
    fn unaccount(&self, tenant: &TenantId, bytes: u64) {
        if let Ok(mut usage) = self.usage.lock() {
            if let Some(used) = usage.get_mut(tenant) {
                *used = used.saturating_sub(bytes);
            }
        }
    }

    /// The object owners, read from every tenant's index the first time.
    async fn owners(&self) -> Result<&std::sync::Mutex<response_index::ObjectOwners>, StoreError> {
        let data_dir = self.data_dir.clone();
        self.objects
            .get_or_try_init(|| async move {
                tokio::task::spawn_blocking(move || response_index::ObjectOwners::load(&data_dir))
                    .await
                    .map_err(|join| std::io::Error::other(join.to_string()))
                    .and_then(|read| read)
                    .map(std::sync::Mutex::new)
                    .map_err(|source| StoreError::Read {
                        id: response_index::OBJECTS_FILE.into(),
                        source,
                    })
            })
            .await
    }

    fn messages_path(&self, id: &ConversationId) -> PathBuf {
        conversation_dir(&self.data_dir, id).join(MESSAGES_FILE)
    }

    fn compactions_path(&self, id: &ConversationId) -> PathBuf {
        conversation_dir(&self.data_dir, id).join(COMPACTIONS_FILE)
    }

    /// Reads a conversation off the runtime's threads; with `index`, drops the text of
    /// each message it refuses as each line is read.
    fn read_with(
        &self,
        id: &ConversationId,
        index: Option<KeepText>,
    ) -> BoxFuture<'_, Result<ConversationLog, StoreError>> {
        let path = self.messages_path(id);
        let root = self.data_dir.clone();
        let id = id.to_string();
        async move {
            let read = tokio::task::spawn_blocking(move || match index {
                Some(keep) => read_conversation_index(&root, &path, keep),
                None => read_conversation(&root, &path),
            })
            .await;
            match read {
                Ok(Ok(log)) => Ok(log),
                Ok(Err(source)) => Err(StoreError::Read { id, source }),
                Err(join) => Err(StoreError::Read {
                    id,
                    source: std::io::Error::other(join.to_string()),
                }),
            }
        }
        .boxed()
    }
}

impl Store for DiskStore {
    fn append(
        &self,
        id: &ConversationId,
        lines: Vec<Line>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let path = self.messages_path(id);
        let tenant = id.tenant().clone();
        let id = id.to_string();
        let root = self.data_dir.clone();
        async move {
            let mut lines = lines;
            // Pinned sets many conversations open with are written once per tenant.
            let mut blocks = Vec::new();
            let mut block_bytes = 0;
            let blocks_dir = super::blocks::blocks_dir(&root, &tenant);
            for line in &mut lines {
                if let Some((digest, array)) = super::blocks::candidate(line) {
                    if !blocks_dir.join(format!("{digest}.json")).exists() {
                        block_bytes += array.len() as u64;
                    }
                    super::blocks::by_reference(line, digest.clone());
                    blocks.push((digest, array));
                }
            }
            let bytes = encode(&lines)?;
            let written = bytes.len() as u64 + block_bytes;
            // A reply, and the decision logged with it, are what an admitted request
            // already caused: counted, never refused half-way.
            let replies = super::only_replies(&lines);
            let quota = if replies {
                Quota::Counted
            } else {
                Quota::Checked
            };
            self.account(&tenant, written, quota).await?;
            let appended = if replies {
                // A reply goes only where its request's lines are: a conversation
                // erased while the request was in flight stays erased.
                match self.writer.append_in_folder(path, bytes).await {
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                        tracing::info!(conversation = %id, "the conversation was erased while its request was in flight: its reply is not logged");
                        self.unaccount(&tenant, written);
                        return Ok(());
                    }
                    appended => appended,
                }
            } else if blocks.is_empty() {
                self.writer.append(path, bytes).await
            } else {
                let ensure = move || {
                    for (digest, array) in &blocks {
                        super::blocks::ensure(&root, &blocks_dir, digest, array)?;
                    }
                    Ok(())
                };
                self.writer.append_after(path, bytes, ensure).await
            };
            appended.map_err(|source| {
                self.unaccount(&tenant, written);
                StoreError::Write { id, source }
            })
        }
        .boxed()
    }

    fn set_quota(&self, bytes: u64) {
        self.quota
            .store(bytes, std::sync::atomic::Ordering::Relaxed);
    }

    fn tenant_bytes(&self, tenant: &TenantId) -> BoxFuture<'_, Result<Option<u64>, StoreError>> {
        let tenant = tenant.clone();
        async move {
            if let Some(used) = self.usage.lock().ok().and_then(|u| u.get(&tenant).copied()) {
                return Ok(Some(used));
            }
            let folder = self
                .data_dir
                .join(super::layout::TENANTS_DIR)
                .join(tenant.as_str());
            let used = tokio::task::spawn_blocking(move || folder_bytes(&folder))
                .await
                .map_err(|join| StoreError::Read {
                    id: tenant.to_string(),
                    source: std::io::Error::other(join.to_string()),
                })?;
            if let Ok(mut usage) = self.usage.lock() {
                usage.entry(tenant).or_insert(used);
            }
            Ok(Some(used))
        }
        .boxed()
    }

    fn read_index(
        &self,
        id: &ConversationId,
        keep: KeepText,
    ) -> BoxFuture<'_, Result<ConversationLog, StoreError>> {
        self.read_with(id, Some(keep))
    }

    fn read(&self, id: &ConversationId) -> BoxFuture<'_, Result<ConversationLog, StoreError>> {
        self.read_with(id, None)
    }

    /// A claim stamped with when it was made: an erasure after it (any process's, by
    /// its tombstone) fences the compaction's commit.
    fn acquire(
        &self,
        _id: &ConversationId,
        _ttl: std::time::Duration,
    ) -> BoxFuture<'_, Result<Option<Lease>, StoreError>> {
        let since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| {
                i64::try_from(since.as_millis()).unwrap_or(i64::MAX)
            });
        Box::pin(async move { Ok(Some(Lease::new("local".into(), since))) })
    }

    fn commit_compaction(
        &self,
        id: &ConversationId,
        record: CompactionRecord,
        lease: &Lease,
    ) -> BoxFuture<'_, Result<Committed, StoreError>> {
        let records = self.compactions_path(id);
        let messages = self.messages_path(id);
        let tenant = id.tenant().clone();
        let conversation = id.clone();
        let since = lease.epoch;
        let id = id.to_string();
        async move {
            // A conversation erased while it was summarised stays erased: its summary
            // would bring its text back.
            if self.erased_since(&conversation, since).await? {
                tracing::info!(conversation = %id, "the conversation was erased while it was compacted: the compaction is not committed");
                return Err(StoreError::LeaseLost(id));
            }
            let mut record_bytes = serde_json::to_vec(&record)?;
            record_bytes.push(b'\n');
            let boundary = encode(&[Line::now(Entry::CompactBoundary(record.boundary()))])?;
            let both = (record_bytes.len() + boundary.len()) as u64;
            self.account(&tenant, both, Quota::Checked).await?;
            // Record first, boundary second: a crash between them leaves an orphan record,
            // which recovery ignores, never a boundary that points at nothing.
            self.writer
                .append(records, record_bytes)
                .await
                .map_err(|source| StoreError::Write {
                    id: id.clone(),
                    source,
                })?;
            self.writer
                .append(messages, boundary)
                .await
                .map_err(|source| StoreError::Write { id, source })?;
            Ok(Committed::Written)
        }
        .boxed()
    }

    fn find(
        &self,
        name: &str,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<ConversationId>, StoreError>> {
        let data_dir = self.data_dir.clone();
        let name = name.to_owned();
        async move {
            // Finding an id across tenants reads folders: off the runtime's threads.
            scan(move || match tenant {
                Some(tenant) => Ok(ConversationId::parse(tenant, &name)
                    .ok()
                    .filter(|id| {
                        conversation_dir(&data_dir, id)
                            .join(MESSAGES_FILE)
                            .is_file()
                    })
                    .into_iter()
                    .collect()),
                None => find(&data_dir, &name),
            })
            .await
        }
        .boxed()
    }

    fn remember_response(
        &self,
        id: &ConversationId,
        response_id: &str,
        head: Option<PrefixDigest>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let path = response_index::index_path(&self.data_dir, id.tenant());
        let line = response_index::encode_line(id, response_id, head);
        let tenant = id.tenant().clone();
        let id = id.to_string();
        async move {
            let line = line.map_err(|err| StoreError::Write {
                id: id.clone(),
                source: std::io::Error::other(err),
            })?;
            self.account(&tenant, line.len() as u64, Quota::Counted)
                .await?;
            self.writer
                .append(path, line)
                .await
                .map_err(|source| StoreError::Write { id, source })
        }
        .boxed()
    }

    fn response(
        &self,
        tenant: &TenantId,
        response_id: &str,
    ) -> BoxFuture<'_, Result<Option<ResponseEnd>, StoreError>> {
        let path = response_index::index_path(&self.data_dir, tenant);
        let root = self.data_dir.clone();
        let (tenant, response_id) = (tenant.clone(), response_id.to_owned());
        async move {
            let found = tokio::task::spawn_blocking(move || {
                response_index::lookup(&root, &path, &tenant, &response_id)
            })
            .await
            .map_err(|join| std::io::Error::other(join.to_string()))
            .and_then(|read| read);
            found.map_err(|source| StoreError::Read {
                id: "responses.jsonl".into(),
                source,
            })
        }
        .boxed()
    }

    fn record_object(
        &self,
        tenant: &TenantId,
        object: &str,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let path = response_index::objects_path(&self.data_dir, tenant);
        let line = response_index::encode_object(object);
        let (tenant, object) = (tenant.clone(), object.to_owned());
        async move {
            let owners = self.owners().await?;
            // The object exists upstream already: recorded, counted, never refused.
            self.account(&tenant, line.len() as u64, Quota::Counted)
                .await?;
            self.writer
                .append(path, line)
                .await
                .map_err(|source| StoreError::Write {
                    id: response_index::OBJECTS_FILE.into(),
                    source,
                })?;
            if let Ok(mut owners) = owners.lock() {
                owners.insert(&object, &tenant);
            }
            Ok(())
        }
        .boxed()
    }

    fn object_owner(&self, object: &str) -> BoxFuture<'_, Result<Option<TenantId>, StoreError>> {
        let object = object.to_owned();
        async move {
            let owners = self.owners().await?;
            Ok(owners
                .lock()
                .ok()
                .and_then(|owners| owners.owner(&object).cloned()))
        }
        .boxed()
    }

    fn describe(&self) -> String {
        self.data_dir.display().to_string()
    }

    fn activity(
        &self,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<Activity>, StoreError>> {
        let data_dir = self.data_dir.clone();
        async move { scan(move || disk_upkeep::activity(&data_dir, tenant.as_ref())).await }.boxed()
    }

    fn remove(
        &self,
        id: &ConversationId,
        unless: Unless,
    ) -> BoxFuture<'_, Result<Removed, StoreError>> {
        let dir = conversation_dir(&self.data_dir, id);
        let data_dir = self.data_dir.clone();
        let id = id.clone();
        async move {
            let write = |source| StoreError::Write {
                id: id.to_string(),
                source,
            };
            let (removed, trash) = self
                .writer
                .exclusive(dir.clone(), move || {
                    disk_upkeep::retire(&data_dir, &dir, unless)
                })
                .await
                .map_err(write)?;
            if !trash.is_empty() {
                scan(move || {
                    for folder in trash {
                        match std::fs::remove_dir_all(&folder) {
                            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                                return Err(err)
                            }
                            _ => {}
                        }
                    }
                    Ok(())
                })
                .await?;
            }
            if let Removed::Removed(bytes) = removed {
                self.unaccount(id.tenant(), bytes);
            }
            Ok(removed)
        }
        .boxed()
    }

    fn tidy_indexes(&self, tenant: &TenantId) -> BoxFuture<'_, Result<(), StoreError>> {
        let index = response_index::index_path(&self.data_dir, tenant);
        let data_dir = self.data_dir.clone();
        let (tenant_of_blocks, tenant_of_dir) = (tenant.clone(), tenant.clone());
        let tenant = tenant.clone();
        async move {
            let path = index.clone();
            self.writer
                .exclusive(index, move || {
                    response_index::drop_conversations(&path, |name| {
                        ConversationId::parse(tenant.clone(), name).is_ok_and(|id| {
                            !conversation_dir(&data_dir, &id)
                                .join(MESSAGES_FILE)
                                .is_file()
                        })
                    })
                })
                .await
                .map_err(|source| StoreError::Write {
                    id: response_index::RESPONSES_FILE.into(),
                    source,
                })?;
            let scanned = self.data_dir.clone();
            let owner = tenant_of_blocks;
            let (unnamed, began) = scan(move || super::blocks::unnamed(&scanned, &owner)).await?;
            if !unnamed.is_empty() {
                let dir = super::blocks::blocks_dir(&self.data_dir, &tenant_of_dir);
                let root = self.data_dir.clone();
                self.writer
                    .exclusive(dir, move || {
                        super::blocks::remove_unnamed(&root, &unnamed, began)
                    })
                    .await
                    .map_err(|source| StoreError::Write {
                        id: super::blocks::BLOCKS_DIR.into(),
                        source,
                    })?;
            }
            Ok(())
        }
        .boxed()
    }

    fn set_hold(
        &self,
        id: &ConversationId,
        hold: Option<Hold>,
    ) -> BoxFuture<'_, Result<bool, StoreError>> {
        let dir = conversation_dir(&self.data_dir, id);
        let id = id.to_string();
        async move {
            self.writer
                .exclusive(dir.clone(), move || {
                    disk_upkeep::write_hold(&dir, hold.as_ref())
                })
                .await
                .map_err(|source| StoreError::Write { id, source })
        }
        .boxed()
    }

    fn tombstone(&self, tombstone: Tombstone) -> BoxFuture<'_, Result<(), StoreError>> {
        let path = self.data_dir.join(super::layout::TOMBSTONES_FILE);
        async move {
            let mut line = serde_json::to_vec(&tombstone)?;
            line.push(b'\n');
            self.writer
                .append(path, line)
                .await
                .map_err(|source| StoreError::Write {
                    id: super::layout::TOMBSTONES_FILE.into(),
                    source,
                })
        }
        .boxed()
    }

    fn compress(
        &self,
        id: &ConversationId,
        idle_since: std::time::SystemTime,
    ) -> BoxFuture<'_, Result<Option<(u64, u64)>, StoreError>> {
        let dir = conversation_dir(&self.data_dir, id);
        let data_dir = self.data_dir.clone();
        let tenant = id.tenant().clone();
        let id = id.to_string();
        async move {
            let build = dir.clone();
            let Some(copy) =
                scan(move || disk_upkeep::build_compressed(&data_dir, &build, idle_since)).await?
            else {
                return Ok(None);
            };
            let bytes = copy.bytes;
            let swapped = self
                .writer
                .exclusive(dir.clone(), move || {
                    disk_upkeep::swap_compressed(&dir, &copy)
                })
                .await
                .map_err(|source| StoreError::Write { id, source })?;
            if !swapped {
                // Written meanwhile: it is not cold; the copy goes with the next clean.
                return Ok(None);
            }
            self.unaccount(&tenant, bytes.0.saturating_sub(bytes.1));
            Ok(Some(bytes))
        }
        .boxed()
    }

    fn sweep(&self, all: bool) -> BoxFuture<'_, Result<(), StoreError>> {
        let data_dir = self.data_dir.clone();
        async move { scan(move || disk_upkeep::clean(&data_dir, all)).await }.boxed()
    }

    fn stats(
        &self,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<TenantStats>, StoreError>> {
        let data_dir = self.data_dir.clone();
        async move { scan(move || disk_upkeep::stats(&data_dir, tenant.as_ref())).await }.boxed()
    }

    fn list(
        &self,
        tenant: Option<TenantId>,
        after: Option<ConversationId>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<ConversationId>, StoreError>> {
        let data_dir = self.data_dir.clone();
        async move { scan(move || list_ids(&data_dir, tenant.as_ref(), after.as_ref(), limit)).await }
            .boxed()
    }
}

/// Runs a scan of the data dir's folders off the runtime's threads.
async fn scan<T: Send + 'static>(
    work: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> Result<T, StoreError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|join| std::io::Error::other(join.to_string()))
        .and_then(|inner| inner)
        .map_err(|source| StoreError::Read {
            id: "*".into(),
            source,
        })
}

/// The bytes of the files under `folder` (blocking; an unreadable entry counts 0).
fn folder_bytes(folder: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(folder) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| match entry.file_type() {
            Ok(kind) if kind.is_dir() => folder_bytes(&entry.path()),
            Ok(kind) if kind.is_file() => entry.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::digest::{message_digest, next_prefix};
    use crate::base::line::{MessageLine, Source};

    /// A client's message line of `value`.
    pub(super) fn message(value: serde_json::Value) -> Line {
        Line::now(Entry::Message(MessageLine {
            digest: next_prefix(None, &message_digest(&value)),
            parent: None,
            message_digest: message_digest(&value),
            source: Source::Client,
            model: "m".into(),
            message: serde_json::value::to_raw_value(&value).unwrap(),
            usage: None,
            finish_reason: None,
            choice: None,
            complete: None,
            incomplete: None,
        }))
    }

    #[test]
    fn the_index_keeps_digests_and_the_texts_it_is_told_to_but_drops_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(MESSAGES_FILE);
        let big = serde_json::json!({"role": "user", "content": "x".repeat(100_000)});
        let call = serde_json::json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
        std::fs::write(
            &path,
            encode(&[message(big.clone()), message(call.clone())]).unwrap(),
        )
        .unwrap();
        let index =
            read_conversation_index(dir.path(), &path, |raw| raw.contains("\"tool_calls\""))
                .unwrap();
        let full = read_conversation(dir.path(), &path).unwrap();
        let texts = |log: &ConversationLog| -> Vec<(String, String)> {
            log.lines
                .iter()
                .filter_map(|l| match &l.entry {
                    Entry::Message(m) => Some((m.digest.to_hex(), m.message.get().to_owned())),
                    _ => None,
                })
                .collect()
        };
        let (index, full) = (texts(&index), texts(&full));
        assert_eq!(index[0].0, full[0].0, "digests stay");
        assert_eq!(index[0].1, "null", "the 100 KB text is not held");
        assert_eq!(index[1], full[1], "tool calls are kept for echo matching");
    }

    #[tokio::test]
    async fn object_owners_are_one_index_read_once_not_a_scan_per_lookup() {
        let dir = tempfile::tempdir().unwrap();
        let writer = Writer::start(
            crate::config::FsyncPolicy::Never,
            Default::default(),
            dir.path().to_owned(),
        )
        .unwrap();
        let store = DiskStore::new(dir.path(), writer);
        let (a, b) = (
            TenantId::parse("team-a").unwrap(),
            TenantId::parse("team-b").unwrap(),
        );
        store.record_object(&a, "file-a1").await.unwrap();
        store.record_object(&b, "file-b1").await.unwrap();
        let index = dir
            .path()
            .join(super::super::layout::TENANTS_DIR)
            .join("team-a")
            .join(response_index::OBJECTS_FILE);
        assert!(index.is_file());
        // With its file gone, every lookup still answers: from the index in memory, which
        // the records after it keep up to date, never from a scan of the file.
        std::fs::remove_file(&index).unwrap();
        for _ in 0..10_000 {
            assert_eq!(
                store.object_owner("file-a1").await.unwrap(),
                Some(a.clone())
            );
        }
        assert_eq!(store.object_owner("file-b1").await.unwrap(), Some(b));
        assert_eq!(store.object_owner("file-c1").await.unwrap(), None);
    }
}

#[cfg(test)]
#[path = "disk_erased_tests.rs"]
mod erased_tests;
