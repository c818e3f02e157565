//! The `[middleware]` hooks of a tracked request, at their stages ([`Stage`]): in chain
//! order, each with its time limit, each failure handled by its policy (closed:
//! refused with 503; open: skipped, logged and counted). A denial ends the chain.
//!
//! - **request**, in the **hook** phase: the redactions of every hook are applied
//!   together to the body as the client sent it, so the log, the compaction, its summary
//!   calls and the upstream all see the redacted request; a hook may send the request to
//!   another model, and tag it. What they did is noted on the request's line.
//! - **view**, in **send**: the redactions apply to the body about to go upstream (and to
//!   each summary call's input, a manual compaction's too), and are noted on the
//!   decision line; the log keeps the text.
//! - **reply**, after **reply**: on a task of its own, once the client has its answer;
//!   its tags go to the metrics and the trace.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use handoff_plugin_api::{HookDecision, HookError, HookReply, HookRequest, Redaction, Stage};

use redaction::{apply, grouped, unapplied};
pub(super) use summary::summary_client;

use crate::base::chunks::Chunks;
use crate::base::line::{HookNotes, RedactionNote};
use crate::config::{Failure, NoTurn, Turn};
use crate::dialect::ChatRequest;
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::plugins::BuiltHook;
use crate::state::{AppState, Snapshot};
use crate::tenant::TenantId;

/// The counter of hook calls, by hook, stage and outcome.
mod outside;
mod redaction;
mod reverse;
mod summary;
mod untracked;

pub(super) use reverse::Reverse;
pub(super) use untracked::{on_untracked, Untracked};

const CALLS: &str = "handoff_hook_calls_total";

/// The counter of tags added, by tag and value, for the tags `middleware.metric_tags`
/// names.
const TAGS: &str = "handoff_hook_tags_total";

/// The longest tag value a metric label takes.
const MOST_LABEL_CHARS: usize = 64;

/// What a chain decided, when it let the request through.
#[derive(Debug, Default)]
pub(super) struct Decided {
    /// Every text to take out, each once, with the hook that asked.
    pub(super) redact: Vec<(String, Redaction)>,
    /// The tags every hook added, a later hook's winning.
    pub(super) tags: BTreeMap<String, String>,
    /// The model a hook sent the request to, the last one's winning.
    pub(super) model: Option<String>,
}

/// Who sent a request, and where to: what every stage's hooks are told.
#[derive(Debug, Clone)]
pub(super) struct Caller {
    /// The request's tenant.
    pub(super) tenant: TenantId,
    /// Whether it came with a proxy key (whose name is the tenant's).
    pub(super) keyed: bool,
    /// The request's path.
    pub(super) path: String,
}

impl Caller {
    /// The hooks of a request of `model` at `stage`: the key's chain, a route's or
    /// `middleware.chain`, those of its hooks that are called at `stage`.
    fn chain<'s>(
        &self,
        snap: &'s Snapshot,
        model: &str,
        stage: Stage,
    ) -> impl Iterator<Item = &'s BuiltHook> + 's {
        let key = self.keyed.then(|| self.tenant.as_str());
        snap.hooks
            .select(&snap.config, key, model)
            .iter()
            .filter(move |hook| hook.at(stage))
    }

    /// True when some hook of a request of `model` is called at `stage`.
    pub(super) fn has(&self, snap: &Snapshot, model: &str, stage: Stage) -> bool {
        self.chain(snap, model, stage).next().is_some()
    }

    /// What the reply-stage hooks will be told of `chat` (parsed from `body`), when
    /// there are any: for a chain with no request-stage hook to have shown it to.
    pub(super) fn for_reply(
        &self,
        state: &AppState,
        snap: &Snapshot,
        chat: &ChatRequest,
        body: &Chunks,
    ) -> Result<Option<HookRequest>, ApiError> {
        if !self.has(snap, &chat.model, Stage::Reply) {
            return Ok(None);
        }
        self.request(state, chat, body).map(Some)
    }

    /// What a hook is told of `chat`, parsed from `body`.
    fn request(
        &self,
        state: &AppState,
        chat: &ChatRequest,
        body: &Chunks,
    ) -> Result<HookRequest, ApiError> {
        let dialect = chat.dialect;
        let outside = outside::of_body(body.contiguous(), |name| dialect.get().in_messages(name))?;
        Ok(HookRequest {
            dialect: dialect.name().to_owned(),
            path: self.path.clone(),
            model: chat.model.clone(),
            tenant: self.tenant.as_str().to_owned(),
            messages: state.hook_forms.of(chat, dialect),
            outside,
            tags: BTreeMap::new(),
        })
    }
}

/// What the request-stage hooks did to a request.
pub(super) struct Hooked {
    /// The body with their redactions applied, when they asked for any.
    pub(super) body: Option<Bytes>,
    /// The model they sent it to, when not the client's.
    pub(super) model: Option<String>,
    /// What the request's line notes of them (`model_from` is the caller's to set).
    pub(super) notes: HookNotes,
    /// The request as they left it, for the reply's hooks.
    pub(super) request: HookRequest,
    /// The markers of `reversible` hooks, to turn back in the reply.
    pub(super) reverse: Option<Arc<Reverse>>,
}

/// Runs the request-stage hooks over `chat` (parsed from `body`); `None` when there are
/// none, having built nothing.
pub(super) async fn on_request(
    state: &AppState,
    snap: &Snapshot,
    caller: &Caller,
    chat: &ChatRequest,
    body: &Chunks,
) -> Result<Option<Hooked>, ApiError> {
    let chain: Vec<&BuiltHook> = caller.chain(snap, &chat.model, Stage::Request).collect();
    if chain.is_empty() {
        return Ok(None);
    }
    let mut request = caller.request(state, chat, body)?;
    let decided = run(&state.metrics, &chain, Stage::Request, &mut request).await?;
    count_tags(
        &state.metrics,
        &snap.config.middleware.metric_tags,
        &decided.tags,
    );
    let mut notes = HookNotes {
        tags: decided.tags,
        ..HookNotes::default()
    };
    let mut redacted = None;
    let mut reverse = None;
    if !decided.redact.is_empty() {
        let applied = apply(body, &decided.redact, |text| {
            state.secret.redaction_tag(&caller.tenant, text)
        })?;
        unapplied(&chain, &applied.found)?;
        notes.redacted = grouped(&applied.found);
        let reversible = |name: &str| chain.iter().any(|h| h.name == name && h.reversible);
        let pairs: Vec<(String, String)> = decided
            .redact
            .iter()
            .zip(&applied.markers)
            .filter(|((hook, _), _)| reversible(hook))
            .map(|((_, redaction), marker)| (marker.clone(), redaction.find.clone()))
            .collect();
        reverse = Reverse::new(pairs);
        redacted = Some(applied.body);
    }
    Ok(Some(Hooked {
        body: redacted,
        model: decided.model.filter(|model| *model != chat.model),
        notes,
        request,
        reverse,
    }))
}

/// `body` (a JSON object) with its top-level `model` set to `model`, every other byte
/// as it was.
pub(super) fn with_model(body: &Chunks, model: &str) -> Result<Bytes, ApiError> {
    let bytes = body.contiguous();
    let members: std::collections::HashMap<String, &serde_json::value::RawValue> =
        serde_json::from_slice(bytes)
            .map_err(|err| ApiError::internal(format!("reading the body to reroute: {err}")))?;
    let Some(old) = members.get("model") else {
        return Err(ApiError::internal(
            "a hook rerouted a request whose body names no model",
        ));
    };
    // The raw value borrows from `bytes`: its place in them is its address's offset.
    let start = (old.get().as_ptr() as usize).wrapping_sub(bytes.as_ptr() as usize);
    let end = start + old.get().len();
    if end > bytes.len() {
        return Err(ApiError::internal("the body's model lies outside it"));
    }
    let quoted = serde_json::Value::String(model.to_owned()).to_string();
    let mut out = Vec::with_capacity(bytes.len() + quoted.len());
    out.extend_from_slice(&bytes[..start]);
    out.extend_from_slice(quoted.as_bytes());
    out.extend_from_slice(&bytes[end..]);
    Ok(Bytes::from(out))
}

/// Counts the tags `metric_tags` names, by tag and value.
fn count_tags(metrics: &Metrics, metric_tags: &[String], tags: &BTreeMap<String, String>) {
    for (key, value) in tags {
        if metric_tags.contains(key) {
            let value: String = value.chars().take(MOST_LABEL_CHARS).collect();
            metrics.add(
                TAGS,
                &[("tag", key.as_str()), ("value", value.as_str())],
                1.0,
            );
        }
    }
}

/// Runs the view-stage hooks over `view` (the body about to be sent, parsed), and
/// returns `body` with their redactions applied and the notes of what they took out;
/// `None` when they took out nothing.
pub(super) async fn on_view(
    state: &AppState,
    snap: &Snapshot,
    caller: &Caller,
    view: &ChatRequest,
    body: &Chunks,
) -> Result<Option<(Bytes, Vec<RedactionNote>)>, ApiError> {
    let chain: Vec<&BuiltHook> = caller.chain(snap, &view.model, Stage::View).collect();
    if chain.is_empty() {
        return Ok(None);
    }
    let mut request = caller.request(state, view, body)?;
    let decided = run(&state.metrics, &chain, Stage::View, &mut request).await?;
    if decided.redact.is_empty() {
        return Ok(None);
    }
    let applied = apply(body, &decided.redact, |text| {
        state.secret.redaction_tag(&caller.tenant, text)
    })?;
    unapplied(&chain, &applied.found)?;
    Ok(Some((applied.body, grouped(&applied.found))))
}

/// Runs the reply-stage hooks of a request on a task of its own: the client has its
/// answer, and nothing waits for them. Their tags are counted and traced.
pub(super) fn on_reply(metrics: Arc<Metrics>, snap: &Snapshot, caller: &Caller, reply: HookReply) {
    let chain: Vec<BuiltHook> = caller
        .chain(snap, &reply.request.model, Stage::Reply)
        .cloned()
        .collect();
    if chain.is_empty() {
        return;
    }
    let metric_tags = snap.config.middleware.metric_tags.clone();
    tokio::spawn(async move {
        let mut tags = BTreeMap::new();
        for hook in &chain {
            let called = match take_turn(hook, &reply.request.tenant).await {
                Ok(_turn) => tokio::time::timeout(hook.timeout, hook.hook.on_reply(&reply))
                    .await
                    .map_err(|_| format!("no answer within {:?}", hook.timeout)),
                Err(no_turn) => Err(no_turn.to_string()),
            };
            match called {
                Ok(Ok(decision)) => {
                    count(&metrics, &hook.name, Stage::Reply, "passed");
                    tags.extend(decision.tags);
                }
                Ok(Err(err)) => {
                    count(&metrics, &hook.name, Stage::Reply, "failed");
                    tracing::warn!(hook = %hook.name, error = %err, "a reply hook failed");
                }
                Err(failure) => {
                    count(&metrics, &hook.name, Stage::Reply, "failed");
                    tracing::warn!(hook = %hook.name, error = %failure, "a reply hook failed");
                }
            }
        }
        count_tags(&metrics, &metric_tags, &tags);
        if !tags.is_empty() {
            tracing::info!(?tags, model = %reply.request.model, tenant = %reply.request.tenant, "reply tagged by middleware hooks");
        }
    });
}

/// Runs `chain` at `stage` over `request`, each hook seeing the tags and model the
/// hooks before it left.
async fn run(
    metrics: &Metrics,
    chain: &[&BuiltHook],
    stage: Stage,
    request: &mut HookRequest,
) -> Result<Decided, ApiError> {
    let mut decided = Decided::default();
    for hook in chain {
        let name = hook.name.as_str();
        let span = crate::telemetry::spans::child(
            format!("handoff.hook {name}"),
            opentelemetry::trace::SpanKind::Internal,
            vec![
                opentelemetry::KeyValue::new("handoff.hook.name", name.to_owned()),
                opentelemetry::KeyValue::new("handoff.hook.stage", stage.name()),
            ],
        );
        // Each outcome counted is the hook span's too.
        let count = |metrics: &Metrics, name: &str, stage: Stage, outcome: &str| {
            count(metrics, name, stage, outcome);
            if let Some(span) = &span {
                span.set(opentelemetry::KeyValue::new(
                    "handoff.hook.outcome",
                    outcome.to_owned(),
                ));
                if outcome.starts_with("failed") || outcome == "denied" {
                    span.fail(outcome.to_owned(), format!("the hook {outcome}"));
                }
            }
        };
        let called = match take_turn(hook, &request.tenant).await {
            // The time limit runs from the turn: it measures the hook's own work.
            Ok(_turn) => tokio::time::timeout(hook.timeout, call(hook, stage, request))
                .await
                .map_err(|_| format!("no answer within {:?}", hook.timeout)),
            Err(no_turn) => Err(no_turn.to_string()),
        };
        let failure = match called {
            Ok(Ok(decision)) => {
                if let Some(denial) = decision.deny {
                    count(metrics, name, stage, "denied");
                    tracing::info!(
                        hook = name,
                        stage = stage.name(),
                        status = denial.status,
                        "a hook refused the request"
                    );
                    return Err(ApiError::denied_by_hook(denial.status, denial.message));
                }
                let outcome = if !decision.redact.is_empty() {
                    "redacted"
                } else if decision.model.is_some() && stage == Stage::Request {
                    "rerouted"
                } else {
                    "passed"
                };
                count(metrics, name, stage, outcome);
                merge(&mut decided, request, name, decision, stage);
                continue;
            }
            Ok(Err(err)) => err.to_string(),
            Err(failure) => failure,
        };
        match hook.failure {
            Failure::Closed => {
                count(metrics, name, stage, "failed_closed");
                tracing::warn!(hook = name, stage = stage.name(), error = %failure, "a hook failed; it fails closed, so the request is refused");
                return Err(ApiError::hook_failed(format!(
                    "middleware hook {name:?} failed ({failure}); it fails closed"
                )));
            }
            Failure::Open => {
                count(metrics, name, stage, "failed_open");
                tracing::warn!(hook = name, stage = stage.name(), error = %failure, "a hook failed; it fails open, so the request goes on without it");
            }
        }
    }
    Ok(decided)
}

/// A turn of `tenant`'s at `hook`, when the hook serves only so many calls at once.
async fn take_turn(hook: &BuiltHook, tenant: &str) -> Result<Option<Turn>, NoTurn> {
    match &hook.turns {
        Some(turns) => turns.take(tenant).await.map(Some),
        None => Ok(None),
    }
}

async fn call(
    hook: &BuiltHook,
    stage: Stage,
    request: &HookRequest,
) -> Result<HookDecision, HookError> {
    match stage {
        Stage::View => hook.hook.on_view(request).await,
        // Reply hooks are called by `on_reply`, with the reply: never through here.
        Stage::Request | Stage::Reply => hook.hook.on_request(request).await,
    }
}

/// Adds `decision` (of hook `name`) to what the chain decided so far.
fn merge(
    decided: &mut Decided,
    request: &mut HookRequest,
    name: &str,
    decision: HookDecision,
    stage: Stage,
) {
    for redaction in decision.redact {
        let known = decided
            .redact
            .iter()
            .any(|(_, known)| known.find == redaction.find);
        if !redaction.find.is_empty() && !known {
            decided.redact.push((name.to_owned(), redaction));
        }
    }
    request.tags.extend(decision.tags.clone());
    decided.tags.extend(decision.tags);
    // Only a request not yet tracked or sent can go elsewhere.
    if let Some(model) = decision
        .model
        .filter(|m| stage == Stage::Request && !m.is_empty())
    {
        request.model.clone_from(&model);
        decided.model = Some(model);
    }
}

fn count(metrics: &Metrics, hook: &str, stage: Stage, outcome: &str) {
    metrics.add(
        CALLS,
        &[
            ("hook", hook),
            ("stage", stage.name()),
            ("outcome", outcome),
        ],
        1.0,
    );
}
