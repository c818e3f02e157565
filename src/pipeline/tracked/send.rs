//! Phase 8, **send**, of a tracked request: the view goes upstream, and the answer is
//! read as far as deciding on it needs. A context-length answer that reached no client
//! byte (an error body, a reply that stopped for the window, an error event opening a
//! stream) becomes a tighter compaction and a retry; anything else goes on to
//! **reply**.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use http::Response;
use http_body_util::{BodyExt, Limited};
use hyper::body::{Body, Incoming};

use super::{reply, Exchange, Halt};
use crate::access_log::RequestLog;
use crate::base::line::DecisionLine;
use crate::body::{chunked, parts, ProxyBody};
use crate::capture::ReplyTarget;
use crate::compaction::budget::Margin;
use crate::compaction::job::Fitted;
use crate::compaction::Reason;
use crate::conversation::Tracked;
use crate::dialect::{stream_opening, Opening};
use crate::error::ApiError;
use crate::forward::{is_event_stream, relay, send_timed, upstream_request};
use crate::projection::ModelView;

/// Largest upstream error body read to look for a context-length error.
const MAX_ERROR_BODY: usize = 1024 * 1024;

/// How much each reactive retry tightens the budget.
const REACTIVE_TIGHTEN: f64 = 0.8;

impl Exchange<'_> {
    /// Phase 8, **send**: sends the view; a context-length answer, while nothing has
    /// reached the
    /// client, becomes a tighter compaction and a retry. Then **reply** answers.
    pub(super) async fn send(
        &self,
        fitted: Fitted<'_>,
        log: &mut RequestLog,
    ) -> Result<Response<ProxyBody>, Halt> {
        let Fitted {
            mut view,
            mut estimate,
            while_preparing,
            ..
        } = fitted;
        // Only the first view can have been sent while a compaction ran.
        let sent_as = |retries: u32| (retries, while_preparing.filter(|_| retries == 0));
        let tracked = self.tracked()?;
        let upstream = self.upstream();
        let mut retries = 0;
        let dialect = self.chat.dialect();
        let mut ask_usage = self.chat.usage_unasked && self.snap.config.upstream.ask_usage;
        loop {
            view.mark_cache(self.chat.tools.as_deref());
            let body = view
                .render_body(&self.body)
                .map_err(|err| ApiError::internal(err.to_string()))?;
            let (body, applied) = self.cleared(&view, body, estimate)?;
            let body = self.viewed(body).await?;
            crate::otel::input(&body);
            let asked = if ask_usage {
                dialect.ask_usage(&body)
            } else {
                None
            };
            let (body, rewrite) = match asked {
                Some((asked, rewrite)) => (parts(asked), Some(rewrite)),
                None => (chunked(&body), None),
            };
            let request = upstream_request(
                upstream,
                self.parts.method.clone(),
                &self.parts.uri,
                self.parts.headers.clone(),
                body,
            )?;
            tracing::debug!(conversation = %tracked.id, compact_id = ?view.compact_id(), "sending the view upstream");
            let response = match self.upstream_socket() {
                Some(socket) => {
                    socket
                        .send_timed(request, upstream.read_timeout(), log)
                        .await?
                }
                None => send_timed(upstream, request, log).await?,
            };

            let reactive = self
                .budget
                .as_ref()
                .filter(|_| retries < self.snap.config.compaction.max_retries);
            let (head, error_body) = match self.inspect(response).await? {
                // An upstream that refuses the ask for usage is asked as the client asked;
                // the refusal never reaches the client.
                Inspected::Refused(_, body)
                    if rewrite.is_some() && dialect.refused_usage_ask(&body) =>
                {
                    tracing::info!(conversation = %tracked.id, "upstream refused the ask for usage; sending as the client did");
                    ask_usage = false;
                    continue;
                }
                // An upstream that refuses the API's own compaction: handoff serves it.
                Inspected::Refused(head, body)
                    if retries == 0 && self.serves_after_refusal(head.status, &body) =>
                {
                    if self.asks_on_create() {
                        return Err(Halt::ServeAsks);
                    }
                    return self.serve().await;
                }
                // An error that is not about the window goes back to the client as it came.
                Inspected::Refused(head, body) if !dialect.is_overflow(&json_of(&body)) => {
                    let answered = head.status;
                    self.note_answer(tracked, &view, estimate, sent_as(retries), answered)
                        .await;
                    return Err(Halt::Respond(Box::new(crate::forward::buffered(
                        head, body,
                    ))));
                }
                Inspected::Refused(head, body) => (head, body),
                Inspected::Read(head, body) if dialect.reply_overflowed(&body) => (head, body),
                Inspected::Read(head, body) => {
                    let served = self.served_reply(applied);
                    let body = match &served {
                        Some(served) if head.status.is_success() => {
                            served.put_in_json(dialect.kind(), body)
                        }
                        _ => body,
                    };
                    let target = self.target(tracked, estimate, &view, sent_as(retries));
                    return Ok(reply::answer_read(head, body, target, self.reverse.clone()).await);
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
                        let mut target = self.target(tracked, estimate, &view, sent_as(retries));
                        let served = self.served_reply(applied);
                        target.prepend = served.as_ref().and_then(|s| s.artefact.clone());
                        let served = served.map(|served| served.stream(dialect.kind()));
                        let reverse = self.reverse.as_ref().map(|r| r.stream(dialect));
                        let rewrite = then(then(rewrite, served), reverse);
                        return Ok(reply::answer_stream(
                            upstream, head, opening, rest, target, rewrite,
                        ));
                    }
                }
                // A 5xx: no reply to log, relayed as it arrives.
                Inspected::Passed(response) => {
                    let answered = response.status();
                    self.note_answer(tracked, &view, estimate, sent_as(retries), answered)
                        .await;
                    return Ok(relay(upstream, response, None));
                }
            };
            let Some(budget) = reactive else {
                self.note_answer(tracked, &view, estimate, sent_as(retries), head.status)
                    .await;
                return Err(Halt::Respond(Box::new(crate::forward::buffered(
                    head, error_body,
                ))));
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
                view.compact_id(),
            );
            // The compaction this retry runs hangs from a span of its own.
            let retry = crate::telemetry::spans::child(
                "handoff.retry",
                opentelemetry::trace::SpanKind::Internal,
                vec![
                    opentelemetry::KeyValue::new("handoff.retry.attempt", i64::from(retries)),
                    opentelemetry::KeyValue::new(
                        crate::telemetry::spans::attr::HTTP_STATUS,
                        i64::from(head.status.as_u16()),
                    ),
                    crate::telemetry::spans::number("handoff.retry.threshold", tightened),
                ],
            );
            let compacting = Box::pin(self.state.compactor.compact(&job));
            let compacted = match &retry {
                Some(retry) => {
                    opentelemetry::context::FutureExt::with_context(
                        compacting,
                        retry.context().clone(),
                    )
                    .await
                }
                None => compacting.await,
            };
            drop(retry);
            // Boxed, as in `fit`: the rare path's future stays off every request's.
            match compacted {
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
                    self.note_answer(tracked, &view, estimate, sent_as(retries), head.status)
                        .await;
                    return Err(Halt::Respond(Box::new(crate::forward::buffered(
                        head, error_body,
                    ))));
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

    /// Logs the decision to send `view`, which the upstream answered with the error
    /// status `answered`: no reply carries it.
    async fn note_answer(
        &self,
        tracked: &Tracked,
        view: &ModelView<'_>,
        estimate: Option<u64>,
        (retries, while_preparing): (u32, Option<Margin>),
        answered: http::StatusCode,
    ) {
        let decision = self.decision(tracked, (view, estimate), retries, while_preparing);
        self.note(decision.map(|d| DecisionLine {
            upstream_status: Some(answered.as_u16()),
            ..d
        }))
        .await;
    }

    /// Where this request's reply is logged, with the decision that sent `view`.
    pub(super) fn target(
        &self,
        tracked: &Tracked,
        estimate: Option<u64>,
        view: &ModelView<'_>,
        (retries, while_preparing): (u32, Option<Margin>),
    ) -> ReplyTarget {
        ReplyTarget {
            decision: self.decision(tracked, (view, estimate), retries, while_preparing),
            trace: opentelemetry::Context::current(),
            tracker: Arc::clone(&self.state.tracker),
            parent: tracked.head(),
            id: tracked.id.clone(),
            model: self.chat.model.clone(),
            dialect: self.chat.dialect,
            estimate: estimate.map(|local| (local, view.compact_id().map(str::to_owned))),
            required: self.snap.config.store.required,
            conversation: self
                .chat
                .continues
                .clone()
                .filter(|_| self.chat.continues_conversation),
            metrics: Arc::clone(&self.state.metrics),
            price: (self.snap.config.price(&self.chat.model))
                .map(|(key, price)| (key.to_owned(), *price)),
            after: self.after_reply(),
            prepend: None,
            references: (self.chat.dialect == crate::dialect::DialectKind::Responses).then(|| {
                let tokenizer = self
                    .snap
                    .config
                    .model(&self.chat.model)
                    .map_or(crate::config::Tokenizer::default(), |m| m.tokenizer);
                (Arc::clone(&self.state.tokens), tokenizer)
            }),
        }
    }
}

impl Exchange<'_> {
    /// The upstream's own WebSocket, when the request is a socket's create and the
    /// upstream serves one.
    fn upstream_socket(&self) -> Option<&crate::upstream_socket::UpstreamSocket> {
        let held = self
            .parts
            .extensions
            .get::<crate::pipeline::HeldOnSocket>()?;
        held.upstream.as_deref()
    }

    /// What handoff puts into the reply of the asks it serves, with the clearing
    /// edits `applied` to the view sent; `None` when nothing.
    fn served_reply(
        &self,
        applied: Vec<serde_json::Value>,
    ) -> Option<crate::native::prepend::Served> {
        let mut served = self.serving.as_deref()?.reply.clone();
        served.applied = applied;
        (!served.is_empty()).then_some(served)
    }

    /// `body` through the view-stage hooks, noting what they took out for the decision
    /// line.
    async fn viewed<'b>(
        &self,
        body: std::borrow::Cow<'b, crate::base::chunks::Chunks>,
    ) -> Result<std::borrow::Cow<'b, crate::base::chunks::Chunks>, Halt> {
        use handoff_plugin_api::Stage;
        if !self.caller.has(&self.snap, &self.chat.model, Stage::View) {
            return Ok(body);
        }
        let view = self
            .chat
            .dialect
            .get()
            .parse_at(self.request_target(), &body)
            .map_err(crate::rescue::dialect)?;
        let viewed =
            super::hooks::on_view(self.state, &self.snap, &self.caller, &view, &body).await?;
        let Some((redacted, notes)) = viewed else {
            return Ok(body);
        };
        if let Ok(mut noted) = self.view_notes.lock() {
            *noted = notes;
        }
        Ok(std::borrow::Cow::Owned(crate::base::chunks::Chunks::from(
            redacted,
        )))
    }

    /// What runs the reply-stage hooks once the reply is logged, when there are any.
    fn after_reply(&self) -> Option<crate::capture::AfterReply> {
        let request = self.hooked.clone()?;
        let metrics = Arc::clone(&self.state.metrics);
        let snap = Arc::clone(&self.snap);
        let caller = self.caller.clone();
        let dialect = self.chat.dialect;
        Some(Box::new(move |messages| {
            let reply = messages
                .iter()
                .filter_map(|raw| serde_json::from_str(raw.get()).ok())
                .flat_map(|value| dialect.get().neutral(&value))
                .map(Arc::new)
                .collect();
            let reply = handoff_plugin_api::HookReply { request, reply };
            super::hooks::on_reply(metrics, &snap, &caller, reply);
        }))
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

/// `first`, then `second`, on a stream's bytes: either alone, or neither.
fn then(
    first: Option<Box<dyn crate::rewrite::Rewrite>>,
    second: Option<Box<dyn crate::rewrite::Rewrite>>,
) -> Option<Box<dyn crate::rewrite::Rewrite>> {
    match (first, second) {
        (Some(first), Some(second)) => Some(Box::new(crate::rewrite::Both(first, second))),
        (first, None) => first,
        (None, second) => second,
    }
}

fn json_of(body: &Bytes) -> serde_json::Value {
    serde_json::from_slice(body).unwrap_or_default()
}
