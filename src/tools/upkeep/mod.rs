//! What the operator's settings do to the retained log: retention prunes whole
//! conversations, erasure answers a deletion request, compression shrinks cold ones.
//! The same code runs from the background task ([`task`]), the admin API and the CLI;
//! in a serving process it also evicts what the caches hold of what it removed.

pub(crate) mod command;
mod erase;
pub(crate) mod task;

pub(crate) use erase::{erase, Target};

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::base::id::ConversationId;
use crate::base::tenant::TenantId;
use crate::config::{Config, Retention};
use crate::state::AppState;
use crate::store::{Removed, Store, StoreError, Tombstone, Unless};

/// Removals per second at most in the background: pruning a month of conversations
/// must not starve the requests' appends.
const REMOVALS_PER_SECOND: u64 = 200;

/// How long each conversation is kept, per tenant.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Policy {
    default: Option<Duration>,
    tenants: HashMap<String, Retention>,
}

impl Policy {
    /// `store.retention`, overridden by `store.tenant_retention` and by each
    /// `[[auth.keys]]`'s `retention` (a key's name is its tenant).
    pub(crate) fn of(config: &Config) -> Self {
        let mut tenants: HashMap<String, Retention> = config
            .store
            .tenant_retention
            .iter()
            .map(|(tenant, retention)| (tenant.clone(), *retention))
            .collect();
        for key in &config.auth.keys {
            if let Some(retention) = key.retention {
                tenants.insert(key.name.clone(), retention);
            }
        }
        Self {
            default: config.store.retention,
            tenants,
        }
    }

    /// How long `tenant`'s conversations are kept; `None`: forever.
    pub(crate) fn retention(&self, tenant: &TenantId) -> Option<Duration> {
        match self.tenants.get(tenant.as_str()) {
            Some(Retention::For(duration)) => Some(*duration),
            Some(Retention::Forever) => None,
            None => self.default,
        }
    }

    /// True when some tenant's conversations expire.
    pub(crate) fn prunes(&self) -> bool {
        self.default.is_some()
            || self
                .tenants
                .values()
                .any(|r| matches!(r, Retention::For(_)))
    }
}

/// What a prune is asked to do.
#[derive(Debug, Clone, Default)]
pub(crate) struct PruneOptions {
    /// One age for every tenant instead of the policy's.
    pub older_than: Option<Duration>,
    /// Only this tenant's conversations.
    pub tenant: Option<TenantId>,
    /// Say what would go; remove nothing.
    pub dry_run: bool,
    /// Pause between removals (the background task's bound on I/O).
    pub paced: bool,
}

/// What a prune did, or would do.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct PruneReport {
    /// The conversations removed (or that would be), with when each was last written.
    pub pruned: Vec<Pruned>,
    /// Expired but held.
    pub held: Vec<String>,
    /// Expired when listed, written to since: kept.
    pub active: usize,
    /// Bytes removed.
    pub bytes: u64,
    /// True for a dry run.
    pub dry_run: bool,
}

/// One pruned conversation.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Pruned {
    /// Its tenant.
    pub tenant: String,
    /// Its id.
    pub conversation: String,
    /// When it was last written, RFC 3339.
    pub last: String,
}

/// Removes the conversations whose last write is older than their tenant's retention
/// (or `older_than`), except held ones, each whole and with a tombstone per tenant.
/// `state` is the serving process, whose caches forget what goes.
pub(crate) async fn prune(
    store: &Arc<dyn Store>,
    state: Option<&AppState>,
    policy: &Policy,
    options: &PruneOptions,
    by: &str,
) -> Result<PruneReport, StoreError> {
    let now = SystemTime::now();
    let mut report = PruneReport {
        dry_run: options.dry_run,
        ..PruneReport::default()
    };
    let mut gone: HashMap<TenantId, (Vec<String>, u64)> = HashMap::new();
    for conversation in store.activity(options.tenant.clone()).await? {
        let keep = options
            .older_than
            .or_else(|| policy.retention(conversation.id.tenant()));
        let Some(cutoff) = keep.and_then(|keep| now.checked_sub(keep)) else {
            continue;
        };
        if conversation.last >= cutoff {
            continue;
        }
        let name = conversation.id.as_str().to_owned();
        if conversation.held {
            report.held.push(name);
            continue;
        }
        let pruned = Pruned {
            tenant: conversation.id.tenant().to_string(),
            conversation: name.clone(),
            last: humantime::format_rfc3339_seconds(conversation.last).to_string(),
        };
        if options.dry_run {
            report.pruned.push(pruned);
            continue;
        }
        let unless = Unless::HeldOrWrittenSince(cutoff);
        match remove(store, state, &conversation.id, unless).await? {
            Removed::Removed(bytes) => {
                report.pruned.push(pruned);
                report.bytes += bytes;
                let entry = gone.entry(conversation.id.tenant().clone()).or_default();
                entry.0.push(name);
                entry.1 += bytes;
            }
            Removed::Held => report.held.push(name),
            Removed::Active => report.active += 1,
            Removed::Missing => {}
        }
        if options.paced {
            tokio::time::sleep(Duration::from_millis(1000 / REMOVALS_PER_SECOND)).await;
        }
    }
    for (tenant, (conversations, bytes)) in gone {
        store.tidy_indexes(&tenant).await?;
        let mut tombstone = Tombstone::now("prune", by, &tenant);
        tombstone.conversations = conversations;
        tombstone.bytes = bytes;
        store.tombstone(tombstone).await?;
    }
    if let Some(state) = state {
        state
            .metrics
            .add(crate::metrics::PRUNED, &[], report.pruned.len() as f64);
        state
            .metrics
            .add(crate::metrics::PRUNED_BYTES, &[], report.bytes as f64);
    }
    Ok(report)
}

/// Removes one conversation from the store and, in a serving process, from every
/// cache: under its lock, so a request waiting on it starts it anew.
async fn remove(
    store: &Arc<dyn Store>,
    state: Option<&AppState>,
    id: &ConversationId,
    unless: Unless,
) -> Result<Removed, StoreError> {
    let Some(state) = state else {
        return store.remove(id, unless).await;
    };
    let removed = state
        .tracker
        .forget_with(id, store.remove(id, unless))
        .await?;
    if matches!(removed, Removed::Removed(_)) {
        forget(state, &std::iter::once(id.clone()).collect());
    }
    Ok(removed)
}

/// Drops from the serving process's caches what they hold of the conversations
/// `gone`, and every parsed message: a cache keyed by content cannot tell whose it is.
/// Their tenants move to new cache scopes, so what the caches that are not emptied
/// (token counts, neutral forms, verdicts) keep of them is never found again, and the
/// hooks drop what they keep of texts.
pub(crate) fn forget(state: &AppState, gone: &HashSet<ConversationId>) {
    state.tracker.forget_links(gone);
    let mut tenants = HashSet::new();
    for id in gone {
        state.compactor.background.forget(id);
        tenants.insert(id.tenant().as_str());
    }
    for tenant in tenants {
        crate::cache_scope::forget(tenant);
    }
    crate::dialect::clear_message_caches();
    state.snapshot().hooks.forget_texts();
}

/// What compressing the idle conversations did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct CompressReport {
    /// Conversations compressed.
    pub conversations: u64,
    /// Their bytes before.
    pub before: u64,
    /// And after.
    pub after: u64,
}

/// Compresses every conversation idle for `after`, one at a time; with `paced`, each
/// followed by a pause as long as it took, so compression takes at most half of a
/// core and of the disk.
pub(crate) async fn compress_idle(
    store: &Arc<dyn Store>,
    after: Duration,
    paced: bool,
) -> Result<CompressReport, StoreError> {
    let mut report = CompressReport::default();
    let Some(idle_since) = SystemTime::now().checked_sub(after) else {
        return Ok(report);
    };
    for conversation in store.activity(None).await? {
        if conversation.last >= idle_since {
            continue;
        }
        let started = std::time::Instant::now();
        if let Some((before, after)) = store.compress(&conversation.id, idle_since).await? {
            report.conversations += 1;
            report.before += before;
            report.after += after;
            if paced {
                tokio::time::sleep(started.elapsed()).await;
            }
        }
    }
    Ok(report)
}
