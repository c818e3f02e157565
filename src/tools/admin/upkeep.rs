//! The admin API of upkeep, behind the admin endpoints' authorization:
//! - `POST /handoff/erase?conversation=ID[&tenant=T]`, `?tenant=T` or `?key=NAME`;
//! - `POST` and `DELETE /handoff/conversations/{id}/hold[?tenant=T]`;
//! - `POST /handoff/store/prune[?older_than=30d][&tenant=T][&dry_run=true]`;
//! - `GET /handoff/store/stats[?tenant=T]`.

use std::net::SocketAddr;
use std::sync::Arc;

use http::Method;
use serde_json::json;

use super::rescue::invalid_tenant;
use crate::error::ApiError;
use crate::state::AppState;
use crate::store::{resolve_in, Hold};
use crate::tenant::TenantId;
use crate::tools::upkeep::{erase, prune, Policy, PruneOptions, Target};

/// Answers an upkeep endpoint; `None` when `path` is not one.
pub(super) async fn handle(
    state: &AppState,
    method: &Method,
    path: &str,
    query: Option<&str>,
    peer: SocketAddr,
) -> Option<Result<serde_json::Value, ApiError>> {
    let param = |name: &str| super::query::query_param(query, name);
    let by = format!("admin:{}", peer.ip());
    let store = Arc::clone(state.tracker.store());
    let answer = match (method, path) {
        (&Method::POST, "/handoff/erase") => {
            let target = match target(state, &param).await {
                Ok(target) => target,
                Err(err) => return Some(Err(err)),
            };
            erase(&store, Some(state), &target, &by)
                .await
                .map(|report| json!(report))
                .map_err(|err| ApiError::storage(err.to_string()))
        }
        (&Method::POST, "/handoff/store/prune") => {
            let options = match prune_options(&param) {
                Ok(options) => options,
                Err(err) => return Some(Err(err)),
            };
            let policy = Policy::of(&state.snapshot().config);
            prune(&store, Some(state), &policy, &options, &by)
                .await
                .map(|report| json!(report))
                .map_err(|err| ApiError::storage(err.to_string()))
        }
        (&Method::GET, "/handoff/store/stats") => {
            let tenant = match param("tenant").map(|t| TenantId::parse(&t)).transpose() {
                Ok(tenant) => tenant,
                Err(err) => return Some(Err(invalid_tenant(err))),
            };
            store
                .stats(tenant)
                .await
                .map(|stats| json!({"tenants": stats}))
                .map_err(|err| ApiError::storage(err.to_string()))
        }
        (&Method::POST | &Method::DELETE, _) => {
            let id = path
                .strip_prefix("/handoff/conversations/")?
                .strip_suffix("/hold")?;
            let hold = (method == Method::POST).then(|| Hold {
                at: humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string(),
                by: by.clone(),
                reason: param("reason"),
            });
            set_hold(state, id, param("tenant").as_deref(), hold).await
        }
        _ => return None,
    };
    Some(answer)
}

/// The erasure's target from `conversation` (with `tenant` when ambiguous), `tenant`
/// or `key`.
async fn target(
    state: &AppState,
    param: &impl Fn(&str) -> Option<String>,
) -> Result<Target, ApiError> {
    let store = state.tracker.store();
    match (param("conversation"), param("tenant"), param("key")) {
        (Some(id), tenant, None) => resolve_in(store.as_ref(), &id, tenant.as_deref())
            .await
            .map(Target::Conversation)
            .map_err(super::rescue::resolve_error),
        (None, Some(tenant), None) => TenantId::parse(&tenant)
            .map(Target::Tenant)
            .map_err(invalid_tenant),
        (None, None, Some(key)) => {
            let known = state
                .snapshot()
                .config
                .auth
                .keys
                .iter()
                .any(|k| k.name == key);
            if !known {
                return Err(ApiError::not_found(format!(
                    "no [[auth.keys]] entry is named {key:?}"
                )));
            }
            TenantId::parse(&key)
                .map(Target::Tenant)
                .map_err(invalid_tenant)
        }
        _ => Err(ApiError::invalid_request(
            "invalid_erase_target",
            "name one of conversation=ID (with tenant=T when several tenants have it), tenant=T or key=NAME",
        )),
    }
}

fn prune_options(param: &impl Fn(&str) -> Option<String>) -> Result<PruneOptions, ApiError> {
    let older_than = param("older_than")
        .map(|text| {
            humantime::parse_duration(&text).map_err(|err| {
                ApiError::invalid_request("invalid_duration", format!("older_than={text}: {err}"))
            })
        })
        .transpose()?;
    let tenant = param("tenant")
        .map(|t| TenantId::parse(&t))
        .transpose()
        .map_err(invalid_tenant)?;
    Ok(PruneOptions {
        older_than,
        tenant,
        dry_run: param("dry_run").is_some_and(|v| v == "true" || v == "1"),
        paced: false,
    })
}

async fn set_hold(
    state: &AppState,
    id: &str,
    tenant: Option<&str>,
    hold: Option<Hold>,
) -> Result<serde_json::Value, ApiError> {
    let store = state.tracker.store();
    let id = resolve_in(store.as_ref(), id, tenant)
        .await
        .map_err(super::rescue::resolve_error)?;
    let held = hold.is_some();
    let found = store
        .set_hold(&id, hold)
        .await
        .map_err(|err| ApiError::storage(err.to_string()))?;
    if !found {
        return Err(ApiError::not_found(format!("no conversation {id}")));
    }
    Ok(json!({"conversation": id.as_str(), "tenant": id.tenant().as_str(), "held": held}))
}
