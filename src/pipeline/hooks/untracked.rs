//! The request-stage hooks of a request handoff does not track: a legacy completion, a
//! batch, an embedding, `/responses/compact`, a token count, any JSON `POST` whose text
//! reaches the provider. There are no messages to show; the hooks see the whole body
//! but its model in [`HookRequest::outside`], and may refuse it or take texts out of
//! it. Nothing is tracked, so there is no line to note them on: the access log and the
//! metrics say what they did.
//!
//! [`HookRequest::outside`]: handoff_plugin_api::HookRequest::outside

use std::collections::BTreeMap;

use bytes::Bytes;
use handoff_plugin_api::{HookRequest, Stage};

use super::redaction::{apply, unapplied};
use super::{count, count_tags, outside, run, Caller};
use crate::base::chunks::Chunks;
use crate::config::Failure;
use crate::dialect::DialectKind;
use crate::error::ApiError;
use crate::plugins::BuiltHook;
use crate::state::{AppState, Snapshot};

/// What the body of an untracked request runs, as the hooks need to know it.
pub(in crate::pipeline) struct Untracked<'a> {
    /// The models it names (its own, its path's, a batch's), the first shown to hooks.
    pub(in crate::pipeline) models: Vec<&'a str>,
    /// True when the text it sends lies in an uploaded file no hook can read (a batch
    /// over an input file).
    pub(in crate::pipeline) from_file: bool,
}

/// Runs the request-stage hooks of every model `untracked` names over `body` (read
/// whole, JSON): the body with their redactions applied, or `None` when it is
/// unchanged. A denial, or a closed hook that fails, refuses the request.
pub(in crate::pipeline) async fn on_untracked(
    state: &AppState,
    snap: &Snapshot,
    caller: &Caller,
    dialect: DialectKind,
    untracked: &Untracked<'_>,
    body: &Bytes,
) -> Result<Option<Bytes>, ApiError> {
    let chain = chain(snap, caller, &untracked.models);
    if chain.is_empty() || body.is_empty() {
        return Ok(None);
    }
    if untracked.from_file {
        unreadable(state, &chain, &caller.path)?;
    }
    let mut request = HookRequest {
        dialect: dialect.name().to_owned(),
        path: caller.path.clone(),
        model: untracked.models.first().copied().unwrap_or("").to_owned(),
        tenant: caller.tenant.as_str().to_owned(),
        messages: Vec::new(),
        outside: outside::of_body(body, |_| false)?,
        tags: BTreeMap::new(),
    };
    let decided = run(&state.metrics, &chain, Stage::Request, &mut request).await?;
    count_tags(
        &state.metrics,
        &snap.config.middleware.metric_tags,
        &decided.tags,
    );
    if decided.redact.is_empty() {
        tracing::info!(path = %caller.path, tenant = %caller.tenant, hooks = chain.len(), tags = ?decided.tags, "middleware hooks passed an untracked request");
        return Ok(None);
    }
    let applied = apply(&Chunks::from(body.clone()), &decided.redact, |text| {
        state.secret.redaction_tag(&caller.tenant, text)
    })?;
    unapplied(&chain, &applied.found)?;
    let texts: usize = applied.found.iter().map(|found| found.count).sum();
    tracing::info!(path = %caller.path, tenant = %caller.tenant, hooks = chain.len(), texts, tags = ?decided.tags, "middleware hooks redacted an untracked request");
    Ok(Some(applied.body))
}

/// The request-stage hooks of a request of any of `models` (none: of no model), each
/// once, in chain order.
fn chain<'s>(snap: &'s Snapshot, caller: &Caller, models: &[&str]) -> Vec<&'s BuiltHook> {
    let mut out: Vec<&BuiltHook> = Vec::new();
    let models: &[&str] = if models.is_empty() { &[""] } else { models };
    for model in models {
        for hook in caller.chain(snap, model, Stage::Request) {
            if !out.iter().any(|known| known.name == hook.name) {
                out.push(hook);
            }
        }
    }
    out
}

/// A request whose text no hook can read: refused when one of `chain` fails closed,
/// passed (and counted as a failure) when every one fails open.
fn unreadable(state: &AppState, chain: &[&BuiltHook], path: &str) -> Result<(), ApiError> {
    for hook in chain {
        let name = hook.name.as_str();
        match hook.failure {
            Failure::Closed => {
                count(&state.metrics, name, Stage::Request, "failed_closed");
                return Err(ApiError::forbidden(format!(
                    "{path}: the request's text lies in an uploaded file, which middleware hook {name:?} cannot read; it fails closed"
                )));
            }
            Failure::Open => {
                count(&state.metrics, name, Stage::Request, "failed_open");
                tracing::warn!(hook = name, path, "a hook cannot read the uploaded file a request runs; it fails open, so the request goes on without it");
            }
        }
    }
    Ok(())
}
