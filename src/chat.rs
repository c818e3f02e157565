//! The chat-completions pipeline: read the body (bounded), check it, log its new
//! originals, project the model view (compacting when it would not fit), forward it,
//! retry once compacted on a context-length answer, and capture the reply.

use std::sync::Arc;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::{request, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;

use crate::access_log::RequestLog;
use crate::auth::Admission;
use crate::body::{full, ProxyBody};
use crate::capture::{ReplyCapture, ReplyTarget};
use crate::compaction::budget::{RequestBudget, Scale};
use crate::compaction::chain::NamedStrategy;
use crate::compaction::model_client::UpstreamModelClient;
use crate::compaction::reactive::is_context_length_error;
use crate::compaction::service::{CompactError, Job};
use crate::compaction::Reason;
use crate::conversation::{identify, Tracked, CONVERSATION_HEADER};
use crate::dialect::ChatRequest;
use crate::error::ApiError;
use crate::forward::{forward, is_event_stream, reject, relay, send_timed, upstream_request};
use crate::projection::project_view;
use crate::relay::Observer;
use crate::state::{AppState, Snapshot};
use crate::upstream::Upstream;

/// Largest upstream error body read to look for a context-length error.
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// Largest non-streamed reply read (and logged) before it is answered.
const MAX_JSON_REPLY: usize = 64 * 1024 * 1024;

/// New message text above which tokenising is moved off the async path.
const BIG_UNCOUNTED: usize = 256 * 1024;

/// How much each reactive retry tightens the budget.
const REACTIVE_TIGHTEN: f64 = 0.8;

/// Handles `POST …/chat/completions`.
pub async fn handle(
    state: &AppState,
    snap: Arc<Snapshot>,
    request: Request<Incoming>,
    log: &mut RequestLog,
    admission: Admission,
) -> Response<ProxyBody> {
    let (mut parts, body) = request.into_parts();
    let bytes = match read_body(body, snap.config.limits.max_body_bytes, &parts.headers).await {
        Ok(bytes) => bytes,
        Err(err) => return reject(err),
    };
    let chat = match ChatRequest::parse(&bytes) {
        Ok(chat) => chat,
        Err(err) => return reject(err),
    };
    let upstream = snap.upstream_for(&chat.model);
    let chain = match strategy_override(&snap, &parts.headers) {
        Ok(name) => snap.registry.select(&snap.config, &chat.model, name),
        Err(err) => return reject(err),
    };
    let header = match parts.headers.get(CONVERSATION_HEADER).map(|v| v.to_str()) {
        None => None,
        Some(Ok(text)) => Some(text),
        Some(Err(_)) => {
            return reject(ApiError::invalid_request(
                "invalid_conversation_id",
                format!("{CONVERSATION_HEADER} is not visible ASCII"),
            ))
        }
    };
    if let Err(err) = admission.check_model(&chat.model) {
        return err.into_response();
    }
    let id = match identify(admission.tenant, header, &chat) {
        Ok(id) => id,
        Err(err) => {
            return reject(ApiError::invalid_request(
                "invalid_conversation_id",
                format!("{CONVERSATION_HEADER}: {err}"),
            ))
        }
    };
    log.set_conversation(id.as_str());
    // The reply is read on the side (tracking, usage); a compressed body could not be.
    parts.headers.insert(
        header::ACCEPT_ENCODING,
        HeaderValue::from_static("identity"),
    );
    // A compacted body has another length; hyper sets the right one from the body itself.
    parts.headers.remove(header::CONTENT_LENGTH);
    snap.credentials.rewrite(&mut parts.headers);

    let budget = RequestBudget::new(&snap.config, &chat, &state.tokens);
    if let Some(budget) = budget.as_ref().filter(|b| b.input_budget == 0) {
        // A reserve as large as the window leaves nothing to compact into: refusing
        // beats a compaction that a client's max_tokens alone would force.
        return reject(ApiError::invalid_request(
            "context_length_exceeded",
            format!(
                "max_tokens/max_completion_tokens ({}) leaves no room for input in the {} tokens of {:?}",
                chat.max_output.unwrap_or_default(),
                budget.model.context_window,
                chat.model
            ),
        ));
    }
    let tracked = match state.tracker.track(id.clone(), &chat).await {
        Ok(tracked) => tracked,
        Err(err) if snap.config.store.required => {
            tracing::error!(conversation = %id, error = %err, "refusing the request: its originals cannot be stored");
            return reject(ApiError::storage(format!(
                "{err}; the request was not forwarded"
            )));
        }
        Err(err) => {
            tracing::warn!(conversation = %id, error = %err, "forwarding untracked: store.required is false");
            return forward(upstream, parts, full(bytes), log).await;
        }
    };
    let scale = Scale::new(tracked.calibration.as_ref(), &chat.model);
    let context = Context {
        state,
        snap: &snap,
        upstream,
        parts: &parts,
        chat: &chat,
        tracked: &tracked,
        chain: &chain,
    };
    let mut view = project_view(&chat, &tracked, &tracked.compactions);
    if let Err(err) = view.validate() {
        // Never send an invalid view; the client's own request is always valid to send.
        tracing::error!(conversation = %id, error = %err, "projected view is invalid; sending the request uncompacted");
        view = project_view(&chat, &tracked, &Default::default());
    }
    let mut estimate = None;
    if let Some(budget) = &budget {
        let uncounted = view.uncounted_bytes(&state.tokens, budget.tokenizer());
        let local = if uncounted > BIG_UNCOUNTED || !state.tokens.is_loaded(budget.tokenizer()) {
            // Tokenising hundreds of KB, or loading the tokenizer, takes tens of ms or
            // more: let the runtime move other work off this thread meanwhile.
            tokio::task::block_in_place(|| {
                view.estimate(&state.tokens, budget.tokenizer(), budget.tools_tokens)
            })
        } else {
            view.estimate(&state.tokens, budget.tokenizer(), budget.tools_tokens)
        };
        let current = scale.view(local, view.generation());
        if current > budget.threshold {
            tracing::info!(conversation = %id, estimate = current, threshold = budget.threshold, "over the trigger; compacting");
            let job = context.job(
                budget,
                budget.threshold,
                Reason::Threshold,
                view.generation(),
            );
            match state.compactor.compact(&job).await {
                Ok(compacted) => view = compacted,
                Err(err) => return compaction_failed(err),
            }
        }
        estimate = Some(view.estimate(&state.tokens, budget.tokenizer(), budget.tools_tokens));
    }

    let mut retries = 0;
    loop {
        let body = match view.render_body(&bytes) {
            Ok(body) => body,
            Err(err) => return reject(ApiError::internal(err.to_string())),
        };
        let request = match upstream_request(
            upstream,
            parts.method.clone(),
            &parts.uri,
            parts.headers.clone(),
            full(body),
        ) {
            Ok(request) => request,
            Err(err) => return reject(err),
        };
        tracing::debug!(conversation = %id, generation = ?view.generation(), "sending the view upstream");
        let response = match send_timed(upstream, request, log).await {
            Ok(response) => response,
            Err(err) => return reject(err),
        };

        let reactive = budget
            .as_ref()
            .filter(|_| retries < snap.config.compaction.max_retries);
        if let Some(budget) = reactive.filter(|_| response.status().is_client_error()) {
            // Nothing has reached the client yet: the error can still be turned into a retry.
            let (head, incoming) = response.into_parts();
            let error_body = match Limited::new(incoming, MAX_ERROR_BODY).collect().await {
                Ok(collected) => collected.to_bytes(),
                Err(err) => {
                    return reject(ApiError::bad_gateway(format!(
                        "reading the upstream error: {err}"
                    )))
                }
            };
            let json: serde_json::Value = serde_json::from_slice(&error_body).unwrap_or_default();
            if !is_context_length_error(&json) {
                return buffered(head, error_body);
            }
            retries += 1;
            let tightened =
                (budget.threshold as f64 * REACTIVE_TIGHTEN.powi(retries as i32)) as u64;
            tracing::warn!(conversation = %id, retry = retries, threshold = tightened, "upstream reported context length exceeded; compacting and retrying");
            let job = context.job(
                budget,
                tightened,
                Reason::ContextLengthExceeded,
                view.generation(),
            );
            match state.compactor.compact(&job).await {
                Ok(compacted) => {
                    estimate = Some(compacted.estimate(
                        &state.tokens,
                        budget.tokenizer(),
                        budget.tools_tokens,
                    ));
                    view = compacted;
                    continue;
                }
                Err(err) => {
                    tracing::warn!(conversation = %id, error = %err, "reactive compaction failed; returning the upstream's error");
                    return buffered(head, error_body);
                }
            }
        }

        let target = ReplyTarget {
            tracker: Arc::clone(&state.tracker),
            parent: tracked.head(),
            id: tracked.id.clone(),
            model: chat.model.clone(),
            estimate: estimate.map(|local| (local, view.generation().map(str::to_owned))),
            required: snap.config.store.required,
            metrics: Arc::clone(&state.metrics),
        };
        return if is_event_stream(response.headers()) && response.status().is_success() {
            let observer: Box<dyn Observer> = Box::new(ReplyCapture::start(target));
            relay(upstream, response, Some(observer))
        } else if response.status().is_success() {
            answer_logged(upstream, response, target).await
        } else {
            relay(upstream, response, None)
        };
    }
}

/// Reads a non-streamed reply whole, logs it, and only then answers it: a reply that
/// cannot be logged while the store is required becomes a 503, not a silent gap.
async fn answer_logged(
    upstream: &Upstream,
    response: Response<Incoming>,
    target: ReplyTarget,
) -> Response<ProxyBody> {
    let (head, incoming) = response.into_parts();
    let body = match read_reply(incoming, upstream.read_timeout()).await {
        Ok(body) => body,
        Err(err) => return err.into_response(),
    };
    // Spawned: a client that leaves now must not cancel the log write.
    let logging = {
        let body = body.clone();
        tokio::spawn(async move { target.log_json(&body).await })
    };
    match logging.await {
        Ok(Err(unlogged)) => ApiError::storage(unlogged.to_string()).into_response(),
        Ok(Ok(())) => buffered(head, body),
        Err(err) => {
            tracing::error!(error = %err, "reply capture task failed");
            buffered(head, body)
        }
    }
}

/// Reads an upstream reply body, giving up when it stalls for `idle` or passes
/// [`MAX_JSON_REPLY`].
async fn read_reply(mut body: Incoming, idle: Duration) -> Result<Bytes, ApiError> {
    let mut out = BytesMut::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_) => {
                return Err(ApiError::gateway_timeout(format!(
                    "upstream sent nothing for {idle:?} after {} bytes of its reply",
                    out.len()
                )))
            }
            Ok(None) => return Ok(out.freeze()),
            Ok(Some(Err(err))) => {
                return Err(ApiError::bad_gateway(format!(
                    "upstream cut its reply after {} bytes: {err}",
                    out.len()
                )))
            }
            Ok(Some(Ok(frame))) => frame,
        };
        if let Some(data) = frame.data_ref() {
            if out.len() + data.len() > MAX_JSON_REPLY {
                return Err(ApiError::bad_gateway(format!(
                    "upstream reply exceeds {MAX_JSON_REPLY} bytes"
                )));
            }
            out.extend_from_slice(data);
        }
    }
}

/// What a compaction of this request needs to know.
struct Context<'a> {
    state: &'a AppState,
    snap: &'a Snapshot,
    upstream: &'a Upstream,
    parts: &'a request::Parts,
    chat: &'a ChatRequest,
    tracked: &'a Tracked,
    chain: &'a [NamedStrategy],
}

impl<'a> Context<'a> {
    fn job(
        &self,
        budget: &RequestBudget,
        threshold: u64,
        reason: Reason,
        seen_generation: Option<&str>,
    ) -> Job<'a> {
        let path = self
            .parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| http::uri::PathAndQuery::from_static("/v1/chat/completions"));
        let client = Arc::new(UpstreamModelClient::new(
            self.upstream.clone(),
            path,
            self.parts.headers.clone(),
        ));
        let mut job = Job::new(
            &self.state.tracker,
            self.chat,
            self.tracked,
            &self.snap.config.compaction,
            budget,
            client,
            self.chain.to_vec(),
        );
        job.threshold = threshold;
        job.reason = reason;
        job.seen_generation = seen_generation.map(str::to_owned);
        job
    }
}

/// The header that picks a strategy for one request.
pub const STRATEGY_HEADER: &str = "x-handoff-strategy";

/// The strategy a client asked for, if it is on `compaction.request_override_allow`.
fn strategy_override<'h>(
    snap: &Snapshot,
    headers: &'h http::HeaderMap,
) -> Result<Option<&'h str>, ApiError> {
    let Some(value) = headers.get(STRATEGY_HEADER) else {
        return Ok(None);
    };
    let allowed = &snap.config.compaction.request_override_allow;
    match value.to_str() {
        Ok(name) if allowed.iter().any(|a| a == name) => Ok(Some(name)),
        _ => Err(ApiError::invalid_request(
            "strategy_not_allowed",
            format!(
                "{STRATEGY_HEADER}: {:?} is not allowed; allowed: [{}] (compaction.request_override_allow)",
                String::from_utf8_lossy(value.as_bytes()),
                allowed.join(", ")
            ),
        )),
    }
}

/// The answer when a needed compaction could not make the request fit.
fn compaction_failed(err: CompactError) -> Response<ProxyBody> {
    tracing::warn!(error = %err, "compaction failed");
    let api = match &err {
        CompactError::TooLarge { .. } => {
            ApiError::invalid_request("context_length_exceeded", err.to_string())
        }
        CompactError::Store(_) => ApiError::storage(err.to_string()),
        CompactError::Cancelled => {
            ApiError::unavailable("handoff is shutting down; retry the request")
        }
        CompactError::View(_) | CompactError::NoHandoff(_) => ApiError::internal(err.to_string()),
    };
    api.into_response()
}

/// Sends a response whose body was read to inspect it.
fn buffered(mut head: http::response::Parts, body: Bytes) -> Response<ProxyBody> {
    crate::headers::strip_hop_by_hop(&mut head.headers);
    head.headers.remove(header::CONTENT_LENGTH);
    Response::from_parts(head, full(body))
}

/// Reads a body up to `limit` bytes; a declared or actual excess is a 413.
async fn read_body(
    body: Incoming,
    limit: usize,
    headers: &http::HeaderMap,
) -> Result<Bytes, ApiError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > limit as u64) {
        return Err(ApiError::body_too_large(limit));
    }
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(err) if err.is::<http_body_util::LengthLimitError>() => {
            Err(ApiError::body_too_large(limit))
        }
        Err(err) => Err(ApiError::invalid_request(
            "body_read_failed",
            format!("could not read the request body: {err}"),
        )),
    }
}
