//! A store that keeps everything in memory: for `handoff eval`, which replays
//! conversations through compaction and must write nothing to disk.

use std::collections::BTreeMap;
use std::sync::Mutex;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::{Committed, ConversationLog, Lease, Store, StoreError};
use crate::base::id::ConversationId;
use crate::base::line::{Entry, Line};
use crate::base::record::CompactionRecord;
use crate::base::tenant::TenantId;

/// Conversations held in memory, lost with the process.
#[derive(Default)]
pub struct MemoryStore {
    conversations: Mutex<BTreeMap<ConversationId, ConversationLog>>,
    objects: Mutex<std::collections::HashMap<String, TenantId>>,
}

impl MemoryStore {
    fn with<T>(
        &self,
        id: &ConversationId,
        change: impl FnOnce(&mut ConversationLog) -> T,
    ) -> Result<T, StoreError> {
        let mut conversations = self.conversations.lock().map_err(|_| StoreError::Write {
            id: id.to_string(),
            source: std::io::Error::other("the memory store's lock is poisoned"),
        })?;
        Ok(change(conversations.entry(id.clone()).or_default()))
    }
}

impl Store for MemoryStore {
    fn append(
        &self,
        id: &ConversationId,
        lines: Vec<Line>,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        let result = self.with(id, |log| log.lines.extend(lines));
        async move { result }.boxed()
    }

    fn read(&self, id: &ConversationId) -> BoxFuture<'_, Result<ConversationLog, StoreError>> {
        let result = self.with(id, |log| log.clone());
        async move { result }.boxed()
    }

    fn commit_compaction(
        &self,
        id: &ConversationId,
        record: CompactionRecord,
        _lease: &Lease,
    ) -> BoxFuture<'_, Result<Committed, StoreError>> {
        let result = self.with(id, |log| {
            log.lines
                .push(Line::now(Entry::CompactBoundary(record.boundary())));
            log.compactions.push(record);
            Committed::Written
        });
        async move { result }.boxed()
    }

    fn find(
        &self,
        name: &str,
        tenant: Option<TenantId>,
    ) -> BoxFuture<'_, Result<Vec<ConversationId>, StoreError>> {
        let found = self
            .conversations
            .lock()
            .map(|conversations| {
                conversations
                    .keys()
                    .filter(|id| id.as_str() == name)
                    .filter(|id| tenant.as_ref().is_none_or(|t| id.tenant() == t))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        async move { Ok(found) }.boxed()
    }

    fn record_object(
        &self,
        tenant: &TenantId,
        object: &str,
    ) -> BoxFuture<'_, Result<(), StoreError>> {
        if let Ok(mut objects) = self.objects.lock() {
            objects
                .entry(object.to_owned())
                .or_insert_with(|| tenant.clone());
        }
        Box::pin(async { Ok(()) })
    }

    fn object_owner(&self, object: &str) -> BoxFuture<'_, Result<Option<TenantId>, StoreError>> {
        let owner = self
            .objects
            .lock()
            .ok()
            .and_then(|objects| objects.get(object).cloned());
        Box::pin(async move { Ok(owner) })
    }

    fn describe(&self) -> String {
        "memory".into()
    }

    fn list(
        &self,
        tenant: Option<TenantId>,
        after: Option<ConversationId>,
        limit: usize,
    ) -> BoxFuture<'_, Result<Vec<ConversationId>, StoreError>> {
        let ids = self
            .conversations
            .lock()
            .map(|conversations| {
                conversations
                    .keys()
                    .filter(|id| tenant.as_ref().is_none_or(|t| id.tenant() == t))
                    .filter(|id| after.as_ref().is_none_or(|after| *id > after))
                    .take(limit)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        async move { Ok(ids) }.boxed()
    }
}
