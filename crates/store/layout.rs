//! Where conversations live under `data_dir`:
//! `tenants/<tenant>/conversations/<id>/{messages,compactions}.jsonl`.
//!
//! A data dir written before tenants existed keeps its conversations in
//! `conversations/<id>/`; `serve` moves that folder to the tenant `legacy` at start
//! ([`migrate_legacy_layout`]), and until then read-only tools see it as that tenant.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use crate::base::id::ConversationId;
use crate::base::tenant::{TenantId, LEGACY};

/// The file under `data_dir` that holds the server secret.
pub const SECRET_FILE: &str = "secret";

/// Folder of all tenants.
pub(crate) const TENANTS_DIR: &str = "tenants";

/// Folder of a tenant's conversations, and of a pre-tenant data dir's.
pub(crate) const CONVERSATIONS_DIR: &str = "conversations";

/// File name of a conversation's message log.
pub const MESSAGES_FILE: &str = "messages.jsonl";

/// File name of a conversation's older lines, compressed (zstd frames, one per
/// compression), read before [`MESSAGES_FILE`].
pub(crate) const COLD_FILE: &str = "messages.jsonl.zst";

/// File name of the hold that keeps a conversation from retention.
pub(crate) const HOLD_FILE: &str = "hold.json";

/// Folder under `data_dir` where upkeep builds and retires conversation folders; what
/// a crash leaves there is removed at the next start.
pub(crate) const UPKEEP_DIR: &str = "upkeep";

/// File under `data_dir` of what was erased and pruned, without content.
pub(crate) const TOMBSTONES_FILE: &str = "tombstones.jsonl";

/// File name of a conversation's compaction records.
pub const COMPACTIONS_FILE: &str = "compactions.jsonl";

/// The folder of one conversation.
pub fn conversation_dir(data_dir: &Path, id: &ConversationId) -> PathBuf {
    let dir = tenant_dir(data_dir, id.tenant()).join(id.as_str());
    if id.tenant().as_str() == LEGACY && !dir.exists() {
        // A data dir not migrated yet (read-only tools run before `serve` did).
        let old = data_dir.join(CONVERSATIONS_DIR).join(id.as_str());
        if old.exists() {
            return old;
        }
    }
    dir
}

/// The folder of a tenant's conversations.
fn tenant_dir(data_dir: &Path, tenant: &TenantId) -> PathBuf {
    data_dir
        .join(TENANTS_DIR)
        .join(tenant.as_str())
        .join(CONVERSATIONS_DIR)
}

/// Every tenant with a folder, in name order; `legacy` too for an unmigrated data dir.
pub fn tenants(data_dir: &Path) -> std::io::Result<Vec<TenantId>> {
    let mut tenants: Vec<TenantId> = names_in(&data_dir.join(TENANTS_DIR))?
        .iter()
        .filter_map(|name| TenantId::parse(name).ok())
        .collect();
    if data_dir.join(CONVERSATIONS_DIR).is_dir() && !tenants.iter().any(|t| t.as_str() == LEGACY) {
        tenants.push(TenantId::legacy());
    }
    tenants.sort();
    Ok(tenants)
}

/// Conversations in (tenant, id) order, of `tenant` or of all, after `after`, at most
/// `limit`.
pub fn list_ids(
    data_dir: &Path,
    tenant: Option<&TenantId>,
    after: Option<&ConversationId>,
    limit: usize,
) -> std::io::Result<Vec<ConversationId>> {
    let tenants = match tenant {
        Some(tenant) => vec![tenant.clone()],
        None => tenants(data_dir)?,
    };
    let mut out = Vec::new();
    for tenant in tenants {
        if after.is_some_and(|after| after.tenant() > &tenant) {
            continue;
        }
        let mut dir = tenant_dir(data_dir, &tenant);
        if tenant.as_str() == LEGACY && !dir.is_dir() {
            dir = data_dir.join(CONVERSATIONS_DIR);
        }
        let mut ids: Vec<ConversationId> = names_in(&dir)?
            .iter()
            .filter_map(|name| ConversationId::parse(tenant.clone(), name).ok())
            .filter(|id| after.is_none_or(|after| id > after))
            .collect();
        ids.sort();
        // A folder without a log (made, not yet written) is no conversation; checked
        // only for the page, not for every folder of the tenant.
        let wanted = limit - out.len();
        out.extend(
            ids.into_iter()
                .filter(|id| dir.join(id.as_str()).join(MESSAGES_FILE).is_file())
                .take(wanted),
        );
        if out.len() >= limit {
            break;
        }
    }
    Ok(out)
}

/// Every conversation named `name`, in any tenant.
pub fn find(data_dir: &Path, name: &str) -> std::io::Result<Vec<ConversationId>> {
    Ok(tenants(data_dir)?
        .into_iter()
        .filter_map(|tenant| ConversationId::parse(tenant, name).ok())
        .filter(|id| conversation_dir(data_dir, id).join(MESSAGES_FILE).is_file())
        .collect())
}

fn names_in(dir: &Path) -> std::io::Result<Vec<String>> {
    match std::fs::read_dir(dir) {
        Ok(entries) => Ok(entries
            .filter_map(Result::ok)
            .filter_map(|e| e.file_name().to_str().map(str::to_owned))
            .collect()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(err) => Err(err),
    }
}

/// Why a pre-tenant data dir could not be moved.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// Both layouts hold conversations of the tenant `legacy`.
    #[error("{data_dir} has both conversations/ and tenants/legacy/conversations/; move one of them by hand")]
    Both {
        /// The data dir.
        data_dir: String,
    },
    /// The move failed.
    #[error("cannot move {from} to {to}: {source}")]
    Move {
        /// Where from.
        from: String,
        /// Where to.
        to: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Moves a pre-tenant `conversations/` folder to the tenant `legacy`; returns whether
/// there was one. One rename: a crash leaves either layout whole.
pub fn migrate_legacy_layout(data_dir: &Path) -> Result<bool, MigrationError> {
    let old = data_dir.join(CONVERSATIONS_DIR);
    if !old.is_dir() {
        return Ok(false);
    }
    let new = tenant_dir(data_dir, &TenantId::legacy());
    if new.exists() {
        return Err(MigrationError::Both {
            data_dir: data_dir.display().to_string(),
        });
    }
    let moving = |source| MigrationError::Move {
        from: old.display().to_string(),
        to: new.display().to_string(),
        source,
    };
    if let Some(parent) = new.parent() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)
            .map_err(moving)?;
    }
    std::fs::rename(&old, &new).map_err(moving)?;
    Ok(true)
}

/// Why a conversation named by a person (CLI, admin API) could not be found.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    /// The id is not valid.
    #[error("invalid conversation id: {0}")]
    Id(#[from] crate::base::id::IdError),
    /// The tenant is not valid.
    #[error("invalid tenant: {0}")]
    Tenant(#[from] crate::base::tenant::TenantError),
    /// No such conversation.
    #[error("no conversation {id}{} in {place}", tenant.as_ref().map(|t| format!(" of tenant {t}")).unwrap_or_default())]
    Unknown {
        /// The id.
        id: String,
        /// The tenant asked for, if any.
        tenant: Option<String>,
        /// The data dir, or the database.
        place: String,
    },
    /// The id exists under several tenants and none was named.
    #[error("conversation {id} exists under several tenants ({}); name one with --tenant (?tenant= on the admin API)", tenants.join(", "))]
    Ambiguous {
        /// The id.
        id: String,
        /// Its tenants.
        tenants: Vec<String>,
    },
    /// The data dir could not be read.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// The store could not be read.
    #[error(transparent)]
    Store(#[from] super::StoreError),
}

/// The conversation `name` of `tenant`, or of whichever one tenant has it.
pub fn resolve(
    data_dir: &Path,
    name: &str,
    tenant: Option<&str>,
) -> Result<ConversationId, ResolveError> {
    let unknown = |tenant: Option<&str>| ResolveError::Unknown {
        id: name.to_owned(),
        tenant: tenant.map(str::to_owned),
        place: data_dir.display().to_string(),
    };
    if let Some(tenant) = tenant {
        let id = ConversationId::parse(TenantId::parse(tenant)?, name)?;
        return if conversation_dir(data_dir, &id)
            .join(MESSAGES_FILE)
            .is_file()
        {
            Ok(id)
        } else {
            Err(unknown(Some(tenant)))
        };
    }
    ConversationId::parse(TenantId::legacy(), name)?;
    let mut found = find(data_dir, name)?;
    match found.len() {
        0 => Err(unknown(None)),
        1 => Ok(found.remove(0)),
        _ => Err(ResolveError::Ambiguous {
            id: name.to_owned(),
            tenants: found.iter().map(|id| id.tenant().to_string()).collect(),
        }),
    }
}

/// The conversation `name` of `tenant`, or of whichever one tenant has it, in `store`.
pub async fn resolve_in(
    store: &dyn crate::Store,
    name: &str,
    tenant: Option<&str>,
) -> Result<ConversationId, ResolveError> {
    let tenant = tenant.map(TenantId::parse).transpose()?;
    // Checked before any lookup: a bad id is the caller's error, not an unknown one.
    ConversationId::parse(tenant.clone().unwrap_or_else(TenantId::legacy), name)?;
    let mut found = store.find(name, tenant.clone()).await?;
    match found.len() {
        0 => Err(ResolveError::Unknown {
            id: name.to_owned(),
            tenant: tenant.map(|t| t.to_string()),
            place: store.describe(),
        }),
        1 => Ok(found.remove(0)),
        _ => Err(ResolveError::Ambiguous {
            id: name.to_owned(),
            tenants: found.iter().map(|id| id.tenant().to_string()).collect(),
        }),
    }
}
