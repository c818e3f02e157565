//! Erasure: the answer to a deletion request. A conversation, or every conversation of
//! a tenant (a proxy key's tenant is its name), goes whole from the store and from the
//! caches; a tombstone says what went, when and for whom, without the content.

use std::collections::HashSet;
use std::sync::Arc;

use super::{forget, remove};
use crate::base::id::ConversationId;
use crate::base::tenant::TenantId;
use crate::state::AppState;
use crate::store::{Removed, Store, StoreError, Tombstone, Unless};

/// What to erase.
#[derive(Debug, Clone)]
pub(crate) enum Target {
    /// One conversation.
    Conversation(ConversationId),
    /// Every conversation of a tenant.
    Tenant(TenantId),
}

/// What an erasure did.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub(crate) struct EraseReport {
    /// The tenant.
    pub tenant: String,
    /// The conversations erased.
    pub erased: Vec<String>,
    /// Held conversations, left in place: a hold is lifted first, on purpose.
    pub held: Vec<String>,
    /// Bytes removed.
    pub bytes: u64,
}

/// Erases `target` and writes its tombstone (`by`: who asked). Held conversations are
/// left and listed: lifting a hold is its own, deliberate step.
pub(crate) async fn erase(
    store: &Arc<dyn Store>,
    state: Option<&AppState>,
    target: &Target,
    by: &str,
) -> Result<EraseReport, StoreError> {
    let (tenant, ids) = match target {
        Target::Conversation(id) => (id.tenant().clone(), vec![id.clone()]),
        Target::Tenant(tenant) => (
            tenant.clone(),
            store
                .activity(Some(tenant.clone()))
                .await?
                .into_iter()
                .map(|conversation| conversation.id)
                .collect(),
        ),
    };
    let mut report = EraseReport {
        tenant: tenant.to_string(),
        ..EraseReport::default()
    };
    let mut gone = HashSet::new();
    for id in ids {
        match remove(store, state, &id, Unless::Held).await? {
            Removed::Removed(bytes) => {
                report.erased.push(id.as_str().to_owned());
                report.bytes += bytes;
                gone.insert(id);
            }
            Removed::Held => report.held.push(id.as_str().to_owned()),
            Removed::Active | Removed::Missing => {}
        }
    }
    store.tidy_indexes(&tenant).await?;
    if let Some(state) = state {
        forget(state, &gone);
        state
            .metrics
            .add(crate::metrics::ERASED, &[], gone.len() as f64);
    }
    let mut tombstone = Tombstone::now("erase", by, &tenant);
    tombstone.whole_tenant = matches!(target, Target::Tenant(_)) && report.held.is_empty();
    tombstone.conversations = report.erased.clone();
    tombstone.bytes = report.bytes;
    store.tombstone(tombstone).await?;
    Ok(report)
}
