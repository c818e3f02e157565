//! The chat-completions pipeline, as named stages over one [`Exchange`]:
//!
//! 1. **admit**: read the body (bounded), parse it, check the client's headers, the
//!    model against the proxy key, and the reserve against the window;
//! 2. **identify**: the conversation, within the request's tenant;
//! 3. **track**: log the new originals before anything goes upstream;
//! 4. **fit**: project the model view, and compact it when it passes the trigger;
//! 5. **send**: forward it, and on a context-length answer compact tighter and retry;
//! 6. **reply**: relay the answer while the reply is logged ([`reply`]).
//!
//! Each stage returns `Result<_, Halt>`; [`handle`] is the one place where a halt
//! becomes the client's answer.

mod admit;
mod reply;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::header::{self, HeaderValue};
use http::uri::PathAndQuery;
use http::{request, Request, Response};
use http_body_util::{BodyExt, Limited};
use hyper::body::Body;
use hyper::body::Incoming;

pub use admit::STRATEGY_HEADER;

use crate::access_log::RequestLog;
use crate::auth::Admission;
use crate::body::{full, ProxyBody};
use crate::capture::ReplyTarget;
use crate::compaction::budget::RequestBudget;
use crate::compaction::chain::NamedStrategy;
use crate::compaction::model_client::UpstreamModelClient;
use crate::compaction::service::{CompactError, Fitted, Job};
use crate::compaction::Reason;
use crate::conversation::{identify, ConversationId, Tracked, CONVERSATION_HEADER};
use crate::dialect::{stream_opening, ChatRequest, DialectKind, Opening};
use crate::error::ApiError;
use crate::forward::{forward, is_event_stream, send_timed, upstream_request};
use crate::state::{AppState, Snapshot};
use crate::upstream::Upstream;

/// Largest upstream error body read to look for a context-length error.
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// How much each reactive retry tightens the budget.
const REACTIVE_TIGHTEN: f64 = 0.8;

/// Why a stage ended the request early.
enum Halt {
    /// An error, answered in the API's shape.
    Error(ApiError),
    /// A complete answer (an upstream error passed on, an untracked forward).
    Respond(Box<Response<ProxyBody>>),
}

impl From<ApiError> for Halt {
    fn from(err: ApiError) -> Self {
        Halt::Error(err)
    }
}

/// Handles a tracked request of `dialect` (`POST …/chat/completions`, `/v1/messages`).
pub async fn handle(
    state: &AppState,
    snap: Arc<Snapshot>,
    request: Request<Incoming>,
    log: &mut RequestLog,
    admission: Admission,
    dialect: DialectKind,
) -> Response<ProxyBody> {
    match run(state, snap, request, log, admission, dialect).await {
        Ok(response) => response,
        Err(Halt::Respond(response)) => *response,
        Err(Halt::Error(err)) => err.into_response_for(dialect),
    }
}

async fn run(
    state: &AppState,
    snap: Arc<Snapshot>,
    request: Request<Incoming>,
    log: &mut RequestLog,
    admission: Admission,
    dialect: DialectKind,
) -> Result<Response<ProxyBody>, Halt> {
    let mut exchange = Exchange::admit(state, snap, request, &admission, dialect).await?;
    let id = exchange.identify(admission)?;
    log.set_conversation(id.as_str());
    let Some(tracked) = exchange.track(id).await? else {
        // store.required is false and the log failed: the request goes as it came.
        let upstream = exchange.upstream().clone();
        let Exchange { parts, body, .. } = exchange;
        return Ok(forward(&upstream, parts, full(body), log).await);
    };
    exchange.tracked = Some(tracked);
    let fitted = exchange.fit().await?;
    exchange.send(fitted, log).await
}

/// One chat request, and what each stage learned about it.
struct Exchange<'s> {
    state: &'s AppState,
    /// The config snapshot for the whole request: a reload mid-way changes nothing.
    snap: Arc<Snapshot>,
    /// The request head, with the headers as the upstream will get them.
    parts: request::Parts,
    /// The body exactly as the client sent it.
    body: Bytes,
    /// The parsed request.
    chat: ChatRequest,
    /// The strategies a compaction of this request tries.
    chain: Vec<NamedStrategy>,
    /// The window budget, when compaction applies to this model.
    budget: Option<RequestBudget>,
    /// Digests and adopted compactions, once tracked.
    tracked: Option<Tracked>,
}

impl<'s> Exchange<'s> {
    /// Stage 1: reads and checks everything the request carries.
    async fn admit(
        state: &'s AppState,
        snap: Arc<Snapshot>,
        request: Request<Incoming>,
        admission: &Admission,
        dialect: DialectKind,
    ) -> Result<Self, Halt> {
        let (mut parts, body) = request.into_parts();
        let body =
            admit::read_body(body, snap.config.limits.max_body_bytes, &parts.headers).await?;
        let chat = dialect.get().parse(&body).map_err(ApiError::from)?;
        let chosen = admit::strategy_override(&snap, &parts.headers)?;
        let chain = snap.registry.select(&snap.config, &chat.model, chosen);
        admission.check_model(&chat.model)?;
        let budget = RequestBudget::new(&snap.config, &chat, &state.tokens);
        if let Some(budget) = budget.as_ref().filter(|b| b.input_budget == 0) {
            // A reserve as large as the window leaves nothing to compact into: refusing
            // beats a compaction that a client's max_tokens alone would force.
            return Err(ApiError::invalid_request(
                "context_length_exceeded",
                format!(
                    "max_tokens ({}) leaves no room for input in the {} tokens of {:?}",
                    chat.max_output.unwrap_or_default(),
                    budget.model.context_window,
                    chat.model
                ),
            )
            .into());
        }
        // The reply is read on the side (tracking, usage); a compressed body could not be.
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        // A compacted body has another length; hyper sets the right one from the body.
        parts.headers.remove(header::CONTENT_LENGTH);
        snap.credentials.rewrite(&mut parts.headers, dialect);
        Ok(Self {
            state,
            snap,
            parts,
            body,
            chat,
            chain,
            budget,
            tracked: None,
        })
    }

    /// Stage 2: the conversation, from the client's header or derived, in its tenant.
    fn identify(&self, admission: Admission) -> Result<ConversationId, ApiError> {
        let header = match self.parts.headers.get(CONVERSATION_HEADER) {
            None => None,
            Some(value) => Some(value.to_str().map_err(|_| {
                ApiError::invalid_request(
                    "invalid_conversation_id",
                    format!("{CONVERSATION_HEADER} is not visible ASCII"),
                )
            })?),
        };
        identify(admission.tenant, header, &self.chat).map_err(|err| {
            ApiError::invalid_request(
                "invalid_conversation_id",
                format!("{CONVERSATION_HEADER}: {err}"),
            )
        })
    }

    /// Stage 3: logs the new originals; `None` when they could not be logged and the
    /// store is not required.
    async fn track(&self, id: ConversationId) -> Result<Option<Tracked>, Halt> {
        match self.state.tracker.track(id.clone(), &self.chat).await {
            Ok(tracked) => Ok(Some(tracked)),
            Err(err) if self.snap.config.store.required => {
                tracing::error!(conversation = %id, error = %err, "refusing the request: its originals cannot be stored");
                Err(ApiError::storage(format!("{err}; the request was not forwarded")).into())
            }
            Err(err) => {
                tracing::warn!(conversation = %id, error = %err, "forwarding untracked: store.required is false");
                Ok(None)
            }
        }
    }

    fn tracked(&self) -> Result<&Tracked, ApiError> {
        self.tracked
            .as_ref()
            .ok_or_else(|| ApiError::internal("the request was not tracked"))
    }

    fn upstream(&self) -> &Upstream {
        self.snap.upstream_in(self.chat.dialect, &self.chat.model)
    }

    /// Stage 4: the view to send, compacted when it passes the trigger.
    async fn fit(&self) -> Result<Fitted<'_>, Halt> {
        let tracked = self.tracked()?;
        let budget = self.budget.as_ref();
        self.state
            .compactor
            .fit(&self.chat, tracked, budget, |budget, generation| {
                self.job(
                    tracked,
                    budget,
                    budget.threshold,
                    Reason::Threshold,
                    generation,
                )
            })
            .await
            .map_err(compaction_failed)
    }

    /// Stage 5: sends the view; a context-length answer, while nothing has reached the
    /// client, becomes a tighter compaction and a retry. Then stage 6 answers.
    async fn send(
        &self,
        fitted: Fitted<'_>,
        log: &mut RequestLog,
    ) -> Result<Response<ProxyBody>, Halt> {
        let Fitted {
            mut view,
            mut estimate,
        } = fitted;
        let tracked = self.tracked()?;
        let upstream = self.upstream();
        let mut retries = 0;
        loop {
            let body = view
                .render_body(&self.body)
                .map_err(|err| ApiError::internal(err.to_string()))?;
            let request = upstream_request(
                upstream,
                self.parts.method.clone(),
                &self.parts.uri,
                self.parts.headers.clone(),
                full(body),
            )?;
            tracing::debug!(conversation = %tracked.id, generation = ?view.generation(), "sending the view upstream");
            let response = send_timed(upstream, request, log).await?;

            let reactive = self
                .budget
                .as_ref()
                .filter(|_| retries < self.snap.config.compaction.max_retries);
            let dialect = self.chat.dialect();
            let (head, error_body) = match self.inspect(response).await? {
                // An error that is not about the window goes back to the client as it came.
                Inspected::Refused(head, body) if !dialect.is_overflow(&json_of(&body)) => {
                    return Err(Halt::Respond(Box::new(reply::buffered(head, body))));
                }
                Inspected::Refused(head, body) => (head, body),
                Inspected::Read(head, body) if dialect.reply_overflowed(&json_of(&body)) => {
                    (head, body)
                }
                Inspected::Read(head, body) => {
                    let target = self.target(tracked, estimate, &view);
                    return Ok(reply::answer_read(head, body, target).await);
                }
                Inspected::Stream {
                    head,
                    opening,
                    rest,
                    overflowed,
                } => {
                    if overflowed && reactive.is_some() {
                        // Nothing reached the client yet: the rest is dropped, not relayed.
                        drop(rest);
                        (head, opening)
                    } else {
                        let target = self.target(tracked, estimate, &view);
                        return Ok(reply::answer_stream(upstream, head, opening, rest, target));
                    }
                }
                Inspected::Passed(response) => {
                    let target = self.target(tracked, estimate, &view);
                    return Ok(reply::answer(upstream, response, target).await);
                }
            };
            let Some(budget) = reactive else {
                return Err(Halt::Respond(Box::new(reply::buffered(head, error_body))));
            };
            retries += 1;
            // The view that was refused was under the trigger, or it would have been
            // compacted: tighten from its size, not from a window that proved wrong.
            let refused_at = estimate.map_or(budget.threshold, |sent| sent.min(budget.threshold));
            let tightened = (refused_at as f64 * REACTIVE_TIGHTEN.powi(retries as i32)) as u64;
            tracing::warn!(conversation = %tracked.id, retry = retries, threshold = tightened, "upstream reported context length exceeded; compacting and retrying");
            let job = self.job(
                tracked,
                budget,
                tightened,
                Reason::ContextLengthExceeded,
                view.generation(),
            );
            match self.state.compactor.compact(&job).await {
                Ok(compacted) => {
                    estimate = Some(compacted.estimate(
                        &self.state.tokens,
                        budget.tokenizer(),
                        budget.tools_tokens,
                    ));
                    view = compacted;
                }
                Err(err) => {
                    tracing::warn!(conversation = %tracked.id, error = %err, "reactive compaction failed; returning the upstream's error");
                    return Err(Halt::Respond(Box::new(reply::buffered(head, error_body))));
                }
            }
        }
    }

    /// Reads what must be read of an answer before deciding on it: an error body, and a
    /// whole non-streamed reply (logged before it is answered anyway).
    async fn inspect(&self, response: Response<Incoming>) -> Result<Inspected, Halt> {
        let status = response.status();
        if status.is_client_error() {
            let (head, incoming) = response.into_parts();
            let body = Limited::new(incoming, MAX_ERROR_BODY)
                .collect()
                .await
                .map_err(|err| ApiError::bad_gateway(format!("reading the upstream error: {err}")))?
                .to_bytes();
            return Ok(Inspected::Refused(head, body));
        }
        if !status.is_success() {
            return Ok(Inspected::Passed(response));
        }
        if is_event_stream(response.headers()) {
            let (head, rest) = response.into_parts();
            return self.open_stream(head, rest).await;
        }
        let (head, incoming) = response.into_parts();
        let body = reply::read_reply(incoming, self.upstream().read_timeout()).await?;
        Ok(Inspected::Read(head, body))
    }

    /// Reads a stream's opening, up to its first output event: an overflow error there
    /// can still be retried, because nothing has reached the client.
    async fn open_stream(
        &self,
        head: http::response::Parts,
        mut rest: Incoming,
    ) -> Result<Inspected, Halt> {
        let dialect = self.chat.dialect();
        let idle = self.upstream().read_timeout();
        let mut opening = BytesMut::new();
        let overflowed = loop {
            match stream_opening(dialect, &opening) {
                Opening::Overflow => break true,
                Opening::Relay => break false,
                Opening::NeedMore if rest.is_end_stream() => break false,
                Opening::NeedMore => {}
            }
            let frame = match tokio::time::timeout(idle, rest.frame()).await {
                Err(_) => {
                    return Err(ApiError::gateway_timeout(format!(
                        "upstream sent nothing for {idle:?} after opening its stream"
                    ))
                    .into())
                }
                Ok(None) => break false,
                Ok(Some(Err(err))) => {
                    return Err(ApiError::bad_gateway(format!(
                        "upstream cut its stream at the start: {err}"
                    ))
                    .into())
                }
                Ok(Some(Ok(frame))) => frame,
            };
            if let Some(data) = frame.data_ref() {
                opening.extend_from_slice(data);
            }
        };
        Ok(Inspected::Stream {
            head,
            opening: opening.freeze(),
            rest,
            overflowed,
        })
    }

    /// Where this request's reply is logged.
    fn target(
        &self,
        tracked: &Tracked,
        estimate: Option<u64>,
        view: &crate::projection::ModelView<'_>,
    ) -> ReplyTarget {
        ReplyTarget {
            tracker: Arc::clone(&self.state.tracker),
            parent: tracked.head(),
            id: tracked.id.clone(),
            model: self.chat.model.clone(),
            dialect: self.chat.dialect,
            estimate: estimate.map(|local| (local, view.generation().map(str::to_owned))),
            required: self.snap.config.store.required,
            metrics: Arc::clone(&self.state.metrics),
        }
    }

    /// The compaction job of this request: the one place a chat request builds one.
    fn job<'e>(
        &'e self,
        tracked: &'e Tracked,
        budget: &RequestBudget,
        threshold: u64,
        reason: Reason,
        seen_generation: Option<&str>,
    ) -> Job<'e> {
        let path = self
            .parts
            .uri
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/v1/chat/completions"));
        let raw = Arc::new(UpstreamModelClient::new(
            self.upstream().clone(),
            path,
            self.parts.headers.clone(),
        ));
        let client = self.chat.dialect().summary_client(raw);
        let mut job = Job::new(
            &self.state.tracker,
            &self.chat,
            tracked,
            &self.snap.config.compaction,
            budget,
            client,
            self.chain.clone(),
        );
        job.threshold = threshold;
        job.reason = reason;
        job.seen_generation = seen_generation.map(str::to_owned);
        job
    }
}

/// An upstream answer, read as far as deciding on it needs.
enum Inspected {
    /// A 4xx and its body.
    Refused(http::response::Parts, Bytes),
    /// A whole non-streamed success.
    Read(http::response::Parts, Bytes),
    /// A stream, its opening read: relayed from there unless it opened with an overflow.
    Stream {
        head: http::response::Parts,
        opening: Bytes,
        rest: Incoming,
        overflowed: bool,
    },
    /// A 5xx, relayed as it arrives.
    Passed(Response<Incoming>),
}

fn json_of(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or_default()
}

/// The answer when a needed compaction could not make the request fit.
fn compaction_failed(err: CompactError) -> Halt {
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
    Halt::Error(api)
}
