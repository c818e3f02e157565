//! The `[middleware]` hooks of a tracked request, run in **parse**, before the request
//! is tracked: in chain order, each with its time limit, each failure handled by its
//! policy (closed: refused with 503; open: skipped, logged and counted). A denial ends
//! the chain. The redactions of every hook are applied together to the body as the
//! client sent it, so the log, the compaction, its summary calls and the upstream all
//! see the redacted request, never the text a hook took out.

use std::collections::BTreeMap;

use aho_corasick::{AhoCorasick, MatchKind};
use bytes::Bytes;
use handoff_plugin_api::{HookRequest, Redaction};

use crate::base::chunks::Chunks;
use crate::config::Failure;
use crate::dialect::{ChatRequest, DialectKind};
use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::state::{AppState, Snapshot};
use crate::tenant::TenantId;

/// The counter of hook calls, by hook and outcome.
const CALLS: &str = "handoff_hook_calls_total";

/// What the chain decided, when it let the request through.
#[derive(Debug, Default)]
pub(super) struct Decided {
    /// Every text to take out, each once.
    pub(super) redact: Vec<Redaction>,
    /// The tags every hook added, a later hook's winning.
    pub(super) tags: BTreeMap<String, String>,
}

/// The caller of [`on_request`]: who sent the request, and where to.
pub(super) struct Caller<'a> {
    /// The request's tenant.
    pub(super) tenant: &'a TenantId,
    /// Whether it came with a proxy key (whose name is the tenant's).
    pub(super) keyed: bool,
    /// The request's path.
    pub(super) path: &'a str,
}

/// Runs the request's chain (the key's, a route's or `middleware.chain`) over `chat`.
/// Without hooks it returns at once, having built nothing.
pub(super) async fn on_request(
    state: &AppState,
    snap: &Snapshot,
    chat: &ChatRequest,
    caller: Caller<'_>,
    dialect: DialectKind,
) -> Result<Decided, ApiError> {
    let mut decided = Decided::default();
    let key = caller.keyed.then(|| caller.tenant.as_str());
    let chain = snap.hooks.select(&snap.config, key, &chat.model);
    if chain.is_empty() {
        return Ok(decided);
    }
    let (tenant, path) = (caller.tenant, caller.path);
    let mut request = HookRequest {
        dialect: dialect.name().to_owned(),
        path: path.to_owned(),
        model: chat.model.clone(),
        tenant: tenant.as_str().to_owned(),
        messages: state.hook_forms.of(chat, dialect),
        tags: BTreeMap::new(),
    };
    for hook in chain {
        let name = hook.name.as_str();
        let called = tokio::time::timeout(hook.timeout, hook.hook.on_request(&request)).await;
        let failure = match called {
            Ok(Ok(decision)) => {
                if let Some(denial) = decision.deny {
                    count(&state.metrics, name, "denied");
                    tracing::info!(
                        hook = name,
                        status = denial.status,
                        "a hook refused the request"
                    );
                    return Err(ApiError::denied_by_hook(denial.status, denial.message));
                }
                let outcome = if decision.redact.is_empty() {
                    "passed"
                } else {
                    "redacted"
                };
                count(&state.metrics, name, outcome);
                for redaction in decision.redact {
                    if !redaction.find.is_empty()
                        && !decided
                            .redact
                            .iter()
                            .any(|known| known.find == redaction.find)
                    {
                        decided.redact.push(redaction);
                    }
                }
                request.tags.extend(decision.tags.clone());
                decided.tags.extend(decision.tags);
                continue;
            }
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("no answer within {:?}", hook.timeout),
        };
        match hook.failure {
            Failure::Closed => {
                count(&state.metrics, name, "failed_closed");
                tracing::warn!(hook = name, error = %failure, "a hook failed; it fails closed, so the request is refused");
                return Err(ApiError::hook_failed(format!(
                    "middleware hook {name:?} failed ({failure}); it fails closed"
                )));
            }
            Failure::Open => {
                count(&state.metrics, name, "failed_open");
                tracing::warn!(hook = name, error = %failure, "a hook failed; it fails open, so the request goes on without it");
            }
        }
    }
    Ok(decided)
}

fn count(metrics: &Metrics, hook: &str, outcome: &str) {
    metrics.add(CALLS, &[("hook", hook), ("outcome", outcome)], 1.0);
}

/// `body` with every occurrence of each redaction's text (as it is spelt inside a JSON
/// string) replaced by its marker, `[redacted:<label>:<tag>]`; longer texts first where
/// two overlap.
pub(super) fn redacted_body(
    body: &Chunks,
    redact: &[Redaction],
    tag: impl Fn(&str) -> String,
) -> Result<Bytes, ApiError> {
    let spelt: Vec<String> = redact
        .iter()
        .map(|r| {
            let quoted = serde_json::Value::String(r.find.clone()).to_string();
            quoted[1..quoted.len() - 1].to_owned()
        })
        .collect();
    let markers: Vec<String> = redact
        .iter()
        .map(|r| format!("[redacted:{}:{}]", marker_label(&r.label), tag(&r.find)))
        .collect();
    let finder = AhoCorasick::builder()
        .match_kind(MatchKind::LeftmostLongest)
        .build(&spelt)
        .map_err(|err| ApiError::internal(format!("building the redaction search: {err}")))?;
    Ok(Bytes::from(
        finder.replace_all_bytes(body.contiguous(), &markers),
    ))
}

/// A label as it may stand in a marker: what a JSON string holds without escapes.
fn marker_label(label: &str) -> String {
    let kept: String = label
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
        .take(32)
        .collect();
    if kept.is_empty() {
        "text".to_owned()
    } else {
        kept
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn redaction(find: &str, label: &str) -> Redaction {
        Redaction {
            find: find.into(),
            label: label.into(),
        }
    }

    #[test]
    fn every_spelling_in_the_body_becomes_one_stable_marker() {
        let body = Chunks::from(
            br#"{"messages":[{"content":"mail a@b.io, say \"hi\" to a@b.io"},{"content":"x\"y"}]}"#
                .to_vec(),
        );
        let out = redacted_body(
            &body,
            &[
                redaction("a@b.io", "email"),
                redaction("x\"y", "odd label!"),
            ],
            |text| format!("{}", text.len()),
        )
        .unwrap();
        let out = String::from_utf8(out.to_vec()).unwrap();
        assert_eq!(
            out,
            r#"{"messages":[{"content":"mail [redacted:email:6], say \"hi\" to [redacted:email:6]"},{"content":"[redacted:oddlabel:3]"}]}"#
        );
        serde_json::from_str::<serde_json::Value>(&out).unwrap();
    }

    #[test]
    fn the_longer_of_two_overlapping_texts_wins() {
        let body = Chunks::from(br#"{"c":"sk-abc-def"}"#.to_vec());
        let out = redacted_body(
            &body,
            &[
                redaction("sk-abc", "short"),
                redaction("sk-abc-def", "long"),
            ],
            |_| "t".into(),
        )
        .unwrap();
        assert_eq!(&out[..], br#"{"c":"[redacted:long:t]"}"#);
    }
}
