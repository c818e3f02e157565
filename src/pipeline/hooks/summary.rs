//! Summary calls through the view-stage hooks: a summary call sends the history to the
//! provider, so what those hooks keep from the provider's view they keep from its
//! input too.

use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{HookRequest, ModelCallError, ModelClient, ModelReply, Stage};
use serde_json::Value;

use super::redaction::{apply_to_value, unapplied};
use super::{outside, run, Caller};
use crate::metrics::Metrics;
use crate::plugins::BuiltHook;
use crate::state::{AppState, Snapshot};
use crate::tenant::ServerSecret;

/// A model client whose calls' messages go through view-stage hooks first.
struct ViewHooked {
    inner: Arc<dyn ModelClient>,
    chain: Vec<BuiltHook>,
    metrics: Arc<Metrics>,
    secret: ServerSecret,
    caller: Caller,
    dialect: &'static str,
}

/// `inner`, its calls through the view-stage hooks of a request of `model`; `inner`
/// itself when there are none.
pub(in crate::pipeline) fn summary_client(
    state: &AppState,
    snap: &Snapshot,
    caller: &Caller,
    model: &str,
    dialect: crate::dialect::DialectKind,
    inner: Arc<dyn ModelClient>,
) -> Arc<dyn ModelClient> {
    let chain: Vec<BuiltHook> = caller.chain(snap, model, Stage::View).cloned().collect();
    if chain.is_empty() {
        return inner;
    }
    Arc::new(ViewHooked {
        inner,
        chain,
        metrics: Arc::clone(&state.metrics),
        secret: state.secret.clone(),
        caller: caller.clone(),
        dialect: dialect.name(),
    })
}

impl ViewHooked {
    /// `body` with the hooks' redactions applied; an error when one refuses it or a
    /// closed one fails.
    async fn redacted(&self, mut body: Value) -> Result<Value, ModelCallError> {
        let messages = body
            .get("messages")
            .and_then(Value::as_array)
            .map(|list| list.iter().cloned().map(Arc::new).collect())
            .unwrap_or_default();
        let mut request = HookRequest {
            dialect: self.dialect.to_owned(),
            path: self.caller.path.clone(),
            model: body
                .get("model")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            tenant: self.caller.tenant.as_str().to_owned(),
            messages,
            outside: outside::of_value(&body, |name| name == "messages"),
            tags: Default::default(),
        };
        let chain: Vec<&BuiltHook> = self.chain.iter().collect();
        let decided = run(&self.metrics, &chain, Stage::View, &mut request)
            .await
            .map_err(|err| ModelCallError(err.message))?;
        if decided.redact.is_empty() {
            return Ok(body);
        }
        let notes = apply_to_value(&mut body, &decided.redact, |text| {
            self.secret.redaction_tag(&self.caller.tenant, text)
        })
        .map_err(|err| ModelCallError(err.message))?;
        unapplied(&chain, &notes).map_err(|err| ModelCallError(err.message))?;
        tracing::debug!(texts = notes.len(), "view hooks redacted a summary call");
        Ok(body)
    }
}

impl ModelClient for ViewHooked {
    fn complete(&self, body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        async move {
            let body = self.redacted(body).await?;
            self.inner.complete(body).await
        }
        .boxed()
    }
}
