//! `handoff eval`: choose a strategy on data, offline. Each recorded conversation's
//! requests are replayed in order through the same tracking, projection and compaction
//! the proxy runs, with the chain and window asked for, into a store in memory: the
//! data dir is only read, and no client is involved. Summary calls go to `--upstream`
//! when one is given; without it, model strategies fail and the chain falls back.
//!
//! Like the proxy, a replayed request is calibrated by the usage its logged reply
//! reported, so on the same settings a replay makes the same compactions as the live
//! run. Tools are not in the log: requests from a data dir are replayed without them.

pub(crate) mod facts;
mod report;
pub(crate) mod source;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use handoff_plugin_api::{CancellationToken, ModelCallError, ModelClient, ModelReply};
use http::uri::PathAndQuery;
use http::HeaderMap;
use serde::Serialize;
use serde_json::Value;

pub(crate) use facts::{ClassRecall, Recall};
pub(crate) use report::write_report;
pub(crate) use source::{Replay, Step};

use crate::compaction::budget::{Calibration, RequestBudget};
use crate::compaction::continued::Continuer;
use crate::compaction::decision;
use crate::compaction::job::{Compactor, Job};
use crate::compaction::model_client::UpstreamModelClient;
use crate::compaction::spend;
use crate::compaction::Reason;
use crate::config::{Config, ModelConfig};
use crate::conversation::{CapturedReplies, ConversationId, Tracker};
use crate::dialect::{ChatRequest, DialectKind, KeyHeader};
use crate::metrics::Metrics;
use crate::state::{Snapshot, StateError};
use crate::store::{MemoryStore, Store};
use crate::tenant::TenantId;
use crate::tokens::Tokens;

/// Why an evaluation could not run.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EvalError {
    /// A conversation could not be loaded.
    #[error(transparent)]
    Source(#[from] source::SourceError),
    /// The strategies or the upstream client could not be built.
    #[error(transparent)]
    State(#[from] StateError),
    /// Nothing was given to replay.
    #[error("nothing to replay: give --data-dir or --file")]
    Nothing,
}

/// What to replay and how.
#[derive(Debug, Clone, Default)]
pub(crate) struct EvalOptions {
    /// A data dir to read conversations from.
    pub data_dir: Option<PathBuf>,
    /// Its conversations to replay; all when empty.
    pub conversations: Vec<String>,
    /// JSON conversation files to replay.
    pub files: Vec<PathBuf>,
    /// The strategy chain; the config's when unset.
    pub chain: Option<Vec<String>>,
    /// The context window of every model replayed (and of the summary model).
    pub window: Option<u64>,
    /// The summary model; the config's (else the request's) when unset.
    pub summary_model: Option<String>,
    /// The summary model's window, apart from `window` (a small local summariser).
    pub summary_window: Option<u64>,
    /// Where summary calls go; none are made when unset.
    pub upstream: Option<String>,
    /// Facts to look for: `recall` is the share of its matches in the originals that
    /// the final view still holds.
    pub probe: Option<regex::Regex>,
    /// The model of requests replayed from files.
    pub file_model: String,
}

/// The figures of one compaction.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CompactionFigures {
    /// The strategy that wrote the handoff.
    pub strategy: String,
    /// Why it ran.
    pub reason: Reason,
    /// Estimated input before.
    pub tokens_before: u64,
    /// Estimated input after.
    pub tokens_after: u64,
    /// Model calls of all its attempts.
    pub calls: u32,
    /// Time of all its attempts, in milliseconds.
    pub duration_ms: u64,
    /// Model attempts (every strategy before the chain's deterministic end) refused.
    pub refused: u32,
    /// The handoff's text.
    pub handoff: String,
}

/// The result of one conversation.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ConversationReport {
    /// The conversation id or file name.
    pub name: String,
    /// Requests replayed.
    pub requests: usize,
    /// Each compaction, in order.
    pub compactions: Vec<CompactionFigures>,
    /// Summary model calls, over every attempt.
    pub summary_calls: u64,
    /// What those calls used, summed.
    pub usage: Option<Value>,
    /// What those calls cost at the configured `[prices]`; `None` when a model that
    /// made some has no price (unpriced, never free).
    pub summary_usd: Option<f64>,
    /// The models of those calls with no `[prices]` entry.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unpriced: Vec<String>,
    /// Failed attempts by reason.
    pub failed: BTreeMap<String, u64>,
    /// The probe's recall, when a probe was given.
    pub recall: Option<Recall>,
    /// Recall of the compacted facts by class, when there was a compaction.
    pub compacted: Option<ClassRecall>,
    /// The compacted facts the final view lost, each with the compaction that lost it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lost: Vec<facts::LostFact>,
    /// Attempts of model strategies (all but the chain's deterministic end).
    pub model_attempts: u64,
    /// Those that failed, by reason: the refusal share's numerator.
    pub model_failed: BTreeMap<String, u64>,
    /// Requests that could not be replayed, and why.
    pub errors: Vec<String>,
}

/// Answers every summary call with an error: without `--upstream` there is no model.
struct NoUpstream;

impl ModelClient for NoUpstream {
    fn complete(
        &self,
        _body: Value,
    ) -> futures_util::future::BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        Box::pin(async {
            Err(ModelCallError(
                "handoff eval was given no --upstream to send summary calls to".into(),
            ))
        })
    }
}

/// The conversations `options` names.
pub(crate) fn load(options: &EvalOptions) -> Result<Vec<Replay>, EvalError> {
    let mut replays = Vec::new();
    if let Some(dir) = &options.data_dir {
        replays.extend(source::from_data_dir(dir, &options.conversations)?);
    }
    for file in &options.files {
        replays.push(source::from_file(file, &options.file_model)?);
    }
    if replays.is_empty() && options.data_dir.is_none() {
        return Err(EvalError::Nothing);
    }
    Ok(replays)
}

/// The config with the evaluation's chain, windows and summary model.
fn eval_config(mut config: Config, options: &EvalOptions, replays: &[Replay]) -> Config {
    if let Some(chain) = &options.chain {
        config.compaction.chain = chain.clone();
    }
    if let Some(model) = &options.summary_model {
        config.compaction.summary_model = Some(model.clone());
    }
    if let Some(url) = &options.upstream {
        config.upstream.base_url = url.clone();
    }
    config.compaction.enabled = true;
    let mut windows: Vec<(String, u64)> = Vec::new();
    if let Some(window) = options.window {
        windows.extend(
            replays
                .iter()
                .flat_map(|r| &r.steps)
                .filter_map(|s| serde_json::from_slice::<Value>(&s.body).ok())
                .filter_map(|b| b["model"].as_str().map(|m| (m.to_owned(), window))),
        );
    }
    // The summariser's own window, else the replayed models'.
    if let (Some(model), Some(window)) = (
        &options.summary_model,
        options.summary_window.or(options.window),
    ) {
        windows.push((model.clone(), window));
    }
    for (model, window) in windows {
        let entry = config.models.entry(model).or_insert_with(|| ModelConfig {
            context_window: window,
            tokenizer: Default::default(),
            default_output_reserve: None,
            reasoning_marker: false,
            compaction: None,
            api: None,
            native_compaction: None,
        });
        entry.context_window = window;
    }
    config
}

/// Replays `replays` with `config` adjusted by `options`; `progress` is called after
/// each request.
pub(crate) async fn evaluate(
    config: Config,
    options: &EvalOptions,
    replays: &[Replay],
    progress: &(dyn Fn() + Sync),
) -> Result<Vec<ConversationReport>, EvalError> {
    let config = eval_config(config, options, replays);
    let snapshot = Snapshot::build(config, &crate::auth::Secrets::default())?;
    let tokens = Arc::new(Tokens::new(crate::dialect::text::message_text));
    let compactor = Compactor {
        tokens: Arc::clone(&tokens),
        cancel: CancellationToken::new(),
        metrics: Arc::new(Metrics::default()),
        summary_calibrations: Default::default(),
        // A replay is sequential: nothing is prepared in the background.
        background: crate::compaction::background::Background::new(0),
        summary_slots: Arc::new(tokio::sync::Semaphore::new(
            snapshot.config.compaction.max_summary_concurrency.max(1),
        )),
        pace: Arc::default(),
    };
    let replayer = Replayer {
        snapshot,
        tokens,
        compactor,
        live: options.upstream.is_some(),
        none: Arc::new(NoUpstream),
    };
    let mut reports = Vec::with_capacity(replays.len());
    for replay in replays {
        reports.push(replayer.replay(options, replay, progress).await);
    }
    Ok(reports)
}

/// What every replayed request shares: the config, token counts, the compactor and
/// the summary client.
struct Replayer {
    snapshot: Snapshot,
    tokens: Arc<Tokens>,
    compactor: Compactor,
    /// True when summary calls go to `--upstream`; they fail at once otherwise.
    live: bool,
    /// The client that answers every call with an error.
    none: Arc<dyn ModelClient>,
}

/// The summary client for `dialect`'s requests to `model`: its own path (for the model,
/// where the path names it), the key from the variable its SDKs read
/// ([`crate::dialect::Credentials::key_env`]) where it takes one, and the headers it requires, speaking its
/// wire format under the chat-shaped interface strategies use.
///
/// [`crate::dialect::Credentials::key_env`]: crate::dialect::Credentials::key_env
/// How a replayed request's summary calls continue its conversation, as the live
/// proxy's would: its logged body, posted to its own path with the replay's key.
fn continuer(
    snapshot: &Snapshot,
    step: &Step,
    chat: &ChatRequest,
    budget: &RequestBudget,
) -> Option<Arc<Continuer>> {
    let call = Continuer::eligible(&snapshot.config, chat, &budget.info.summary_model)?;
    let path = Continuer::path(chat, &step.target)?;
    let client: Arc<dyn ModelClient> = Arc::new(UpstreamModelClient::new(
        snapshot.upstream.clone(),
        path,
        credential_headers(step.dialect),
    ));
    Some(Arc::new(Continuer {
        body: step.body.clone().into(),
        client,
        call,
        extra: snapshot.config.compaction.summary_request_extra.clone(),
    }))
}

/// The replay's credential (the API's key variable) and required headers.
fn credential_headers(dialect: DialectKind) -> HeaderMap {
    let api = dialect.get();
    let mut headers = HeaderMap::new();
    if let Ok(key) = std::env::var(api.key_env()) {
        let credential = match api.key_header() {
            KeyHeader::Bearer => format!("Bearer {key}")
                .parse()
                .ok()
                .map(|value| (http::header::AUTHORIZATION, value)),
            KeyHeader::Named(name) => key
                .parse()
                .ok()
                .map(|value| (http::header::HeaderName::from_static(name), value)),
        };
        if let Some((name, value)) = credential {
            headers.insert(name, value);
        }
    }
    for (name, value) in api.required_headers() {
        headers.insert(*name, http::HeaderValue::from_static(value));
    }
    headers
}

fn summary_client(snapshot: &Snapshot, dialect: DialectKind, model: &str) -> Arc<dyn ModelClient> {
    let api = dialect.get();
    let headers = credential_headers(dialect);
    let path = api
        .call_path(model, None)
        .parse()
        .unwrap_or_else(|_| PathAndQuery::from_static(api.path()));
    let raw: Arc<dyn ModelClient> = Arc::new(UpstreamModelClient::new(
        snapshot.upstream.clone(),
        path,
        headers,
    ));
    api.summary_client(raw)
}

impl Replayer {
    /// Replays one conversation into a fresh in-memory store and reports it.
    async fn replay(
        &self,
        options: &EvalOptions,
        replay: &Replay,
        progress: &(dyn Fn() + Sync),
    ) -> ConversationReport {
        let store = Arc::new(MemoryStore::default());
        let tracker = Tracker::new(Arc::clone(&store) as Arc<dyn Store>, 4);
        let tenant = replay.tenant.clone().unwrap_or_else(TenantId::legacy);
        let id = ConversationId::parse(tenant.clone(), &replay.name).unwrap_or_else(|_| {
            ConversationId::derived(
                tenant,
                &crate::base::digest::bytes_digest(replay.name.as_bytes()),
            )
        });
        let mut errors = Vec::new();
        let mut last = Seen::default();
        for (index, step) in replay.steps.iter().enumerate() {
            progress();
            let last_step = index + 1 == replay.steps.len();
            match self.step(&tracker, &id, step, last_step).await {
                Ok(seen) => last = seen,
                Err(err) => errors.push(format!("request {}: {err}", index + 1)),
            }
        }
        let records = store
            .read(&id)
            .await
            .map(|log| log.compactions)
            .unwrap_or_default();
        let attempts = records.iter().flat_map(|r| &r.attempts);
        let mut failed = BTreeMap::new();
        for attempt in attempts.clone().filter(|a| a.outcome != "ok") {
            let reason = attempt.reason.clone().unwrap_or_else(|| "failed".into());
            *failed.entry(reason).or_insert(0) += 1;
        }
        let usage =
            handoff_plugin_api::sum_usage(attempts.clone().filter_map(|a| a.usage.as_ref()));
        let prices = &self.snapshot.config.prices;
        let (mut summary_usd, mut unpriced) = (0.0, Vec::new());
        for priced in records.iter().flat_map(|r| spend::summary_calls(prices, r)) {
            match priced {
                spend::Priced::Cost { usd, .. } => summary_usd += usd,
                spend::Priced::Unpriced(model) => unpriced.push(model.to_owned()),
            }
        }
        unpriced.sort();
        unpriced.dedup();
        // A chain ends in its deterministic strategy; every attempt before it is a model's.
        let model_attempts: Vec<&crate::base::record::Attempt> = records
            .iter()
            .flat_map(|r| {
                r.attempts
                    .iter()
                    .filter(|a| Some(&a.strategy) != r.chain.last())
            })
            .collect();
        let mut model_failed = BTreeMap::new();
        for attempt in model_attempts.iter().filter(|a| a.outcome != "ok") {
            let reason = attempt.reason.clone().unwrap_or_else(|| "failed".into());
            *model_failed.entry(reason).or_insert(0) += 1;
        }
        ConversationReport {
            name: replay.name.clone(),
            requests: replay.steps.len(),
            compactions: records
                .iter()
                .map(|r| CompactionFigures {
                    strategy: r.strategy.clone(),
                    reason: r.reason,
                    tokens_before: r.tokens_before,
                    tokens_after: r.tokens_after,
                    calls: r.attempts.iter().filter_map(|a| a.calls).sum(),
                    duration_ms: r.attempts.iter().map(|a| a.duration_ms).sum(),
                    refused: r
                        .attempts
                        .iter()
                        .filter(|a| a.outcome != "ok" && Some(&a.strategy) != r.chain.last())
                        .count() as u32,
                    handoff: r.handoff_text().to_owned(),
                })
                .collect(),
            summary_calls: attempts.filter_map(|a| a.calls).map(u64::from).sum(),
            usage,
            summary_usd: unpriced.is_empty().then_some(summary_usd),
            unpriced,
            failed,
            recall: options
                .probe
                .as_ref()
                .map(|probe| recall(probe, &replay.originals, &last.text)),
            compacted: last
                .handoff
                .as_deref()
                .map(|handoff| facts::compacted_recall(&last.messages, &last.verbatim, handoff)),
            lost: last.handoff.as_deref().map_or_else(Vec::new, |handoff| {
                let handoffs: Vec<(usize, String)> = records
                    .iter()
                    .map(|r| (r.source.end_exclusive, r.handoff_text().to_owned()))
                    .collect();
                facts::lost_facts(
                    &last.messages,
                    (&last.verbatim, handoff),
                    &handoffs,
                    last.pinned,
                )
            }),
            model_attempts: model_attempts.len() as u64,
            model_failed,
            errors,
        }
    }

    /// One request: tracked, projected, compacted when over the trigger, and its logged
    /// reply logged again (calibrating the next). Returns what its view held, for the
    /// `last` request only: recall is judged on the final view.
    async fn step(
        &self,
        tracker: &Tracker,
        id: &ConversationId,
        step: &Step,
        last: bool,
    ) -> Result<Seen, String> {
        let Self {
            snapshot,
            tokens,
            compactor,
            live,
            none,
        } = self;
        let dialect = step.dialect.get();
        let mut chat = dialect
            .parse_at(&step.target, &step.body.clone().into())
            .map_err(|err| err.to_string())?;
        snapshot.pins.apply(&mut chat);
        let tracked = tracker
            .track(id.clone(), &chat)
            .await
            .map_err(|err| err.to_string())?;
        let config = &snapshot.config;
        let budget = RequestBudget::new(config, &chat, tokens);
        let fitted = compactor
            .fit(
                tracker,
                (&chat, &tracked),
                budget.as_ref(),
                |budget, compact_id| {
                    let mut job = Job::new(
                        tracker,
                        &chat,
                        &tracked,
                        &config.compaction,
                        budget,
                        match live {
                            true => {
                                summary_client(snapshot, step.dialect, &budget.info.summary_model)
                            }
                            false => Arc::clone(none),
                        },
                        snapshot.registry.select(config, &chat.model, None),
                    );
                    job.seen_compact_id = compact_id.map(str::to_owned);
                    if *live {
                        job.continuer = continuer(snapshot, step, &chat, budget);
                    }
                    job
                },
                // A replay compacts inline: what each view holds, not when, is measured.
                |_| None,
            )
            .await
            .map_err(|err| err.to_string())?;
        let (view, local, early) = (fitted.view, fitted.estimate, fitted.while_preparing);
        let seen = if last {
            Seen::of(&view, &chat.messages, dialect)
        } else {
            Seen::default()
        };
        if let Some((replies, usage)) = &step.reply {
            let server = usage.as_ref().and_then(|u| dialect.input_tokens(u));
            let calibration = local.zip(server).map(|(local, server)| {
                let compact_id = view.compact_id().map(str::to_owned);
                Calibration::new(chat.model.clone(), compact_id, local, server)
            });
            let batch = CapturedReplies {
                dialect: step.dialect,
                parent: tracked.head(),
                model: chat.model.clone(),
                usage: usage.clone(),
                calibration,
                replies: replies.clone(),
                incomplete: None,
                sequence: step.dialect.get().reply_is_items(),
                response_id: None,
                conversation: None,
                decision: budget.as_ref().filter(|_| tracked.logged).map(|budget| {
                    decision::sent(budget, &tracked, &chat.model, (&view, local), 0, early)
                }),
            };
            tracker
                .record_replies(id, batch)
                .await
                .map_err(|err| err.to_string())?;
        }
        Ok(seen)
    }
}

/// What one replayed request's view held.
#[derive(Default)]
struct Seen {
    /// The view's raw messages, one per line (the probe's haystack).
    text: String,
    /// The text of its verbatim messages: all but the handoff pair.
    verbatim: String,
    /// The handoff's text, when the view has one.
    handoff: Option<String>,
    /// The request's messages in the neutral form.
    messages: Vec<Value>,
    /// How many of them lead pinned, never compacted.
    pinned: usize,
}

impl Seen {
    /// What `view` holds, with the request's `messages` in the neutral form.
    fn of(
        view: &crate::projection::ModelView<'_>,
        messages: &[crate::dialect::Message],
        dialect: &dyn crate::dialect::Dialect,
    ) -> Self {
        let text = view.raw_messages().join("\n");
        let mut verbatim = String::new();
        let kept = view
            .pinned
            .iter()
            .map(|m| m.message)
            .chain(view.lifted.iter().copied())
            .chain(view.live.iter());
        for message in kept {
            facts::strings_of(message.value(), &mut verbatim);
        }
        Self {
            text,
            verbatim,
            handoff: view
                .compaction
                .as_ref()
                .map(|a| a.record.handoff_text().to_owned()),
            messages: messages
                .iter()
                .flat_map(|m| dialect.neutral(m.value()))
                .collect(),
            pinned: view
                .pinned
                .iter()
                .map(|m| dialect.neutral(m.message.value()).len())
                .sum(),
        }
    }
}

/// The share of `probe`'s distinct matches in `originals` that `view` still holds.
pub(crate) fn recall(probe: &regex::Regex, originals: &str, view: &str) -> Recall {
    let matches: std::collections::BTreeSet<&str> =
        probe.find_iter(originals).map(|m| m.as_str()).collect();
    let lost: Vec<String> = matches
        .iter()
        .filter(|m| !view.contains(*m))
        .map(|m| (*m).to_owned())
        .collect();
    let kept = matches.len() - lost.len();
    Recall {
        lost,
        ..Recall::of(matches.len(), kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_model_keeps_its_own_window() {
        let replay = Replay {
            name: "r".into(),
            tenant: None,
            steps: vec![source::Step {
                dialect: DialectKind::OpenAiChat,
                target: "/v1/chat/completions".into(),
                body: br#"{"model":"replayed","messages":[]}"#.to_vec(),
                reply: None,
            }],
            originals: String::new(),
        };
        let options = EvalOptions {
            data_dir: None,
            conversations: Vec::new(),
            files: Vec::new(),
            chain: None,
            window: Some(8192),
            summary_model: Some("small".into()),
            summary_window: Some(2048),
            upstream: None,
            probe: None,
            file_model: "replayed".into(),
        };
        let config = eval_config(Config::default(), &options, &[replay]);
        assert_eq!(config.model("replayed").unwrap().context_window, 8192);
        assert_eq!(config.model("small").unwrap().context_window, 2048);
        assert_eq!(config.compaction.summary_model.as_deref(), Some("small"));
    }
}
