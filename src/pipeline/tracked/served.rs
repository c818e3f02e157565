//! The APIs' own compaction served by handoff (`upstream.native_compaction`): the
//! handles a request carries opened into what they stand for, and a request that asks
//! the API to compact (a trailing `compaction_trigger`, `POST /v1/responses/compact`)
//! answered with a handle in place of the provider's sealed item, made by the
//! strategy chain over everything the request sends.

use std::sync::Arc;

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::Value;

use super::{reply, Exchange, Halt};
use crate::base::chunks::Chunks;
use crate::body::{full, ProxyBody};
use crate::compaction::budget::RequestBudget;
use crate::compaction::job::CompactError;
use crate::compaction::Reason;
use crate::config::NativeCompaction;
use crate::conversation::Tracked;
use crate::dialect::{DialectKind, Expanded, Message, RawMessage};
use crate::error::ApiError;
use crate::native::{handle, reply as native_reply, strip, SERVED};
use crate::projection::project_view;

impl Exchange<'_> {
    /// Who serves this request's native compaction, as configured.
    pub(super) fn native_mode(&self) -> NativeCompaction {
        let dialect = self.chat.dialect.name();
        self.snap
            .config
            .native_compaction(dialect, &self.chat.model)
    }

    /// The key `auto` remembers a refusal under: the upstream and the model.
    pub(super) fn refusal_key(&self) -> String {
        (self.upstream().target(None)).map_or_else(|_| String::new(), |uri| uri.to_string())
    }

    /// True when handoff answers this request's ask itself: configured to, or `auto`
    /// and the upstream already refused such an ask. Only the asks it serves: a trailing
    /// trigger and the compaction endpoint of the Responses API.
    pub(super) fn serves_native(&self) -> bool {
        self.serves_this_ask() && self.serves_here()
    }

    /// True when handoff serves the APIs' own compaction for this request's upstream
    /// and model: configured to, or `auto` and the upstream refused it before.
    pub(super) fn serves_here(&self) -> bool {
        match self.native_mode() {
            NativeCompaction::Pass => false,
            NativeCompaction::Serve => true,
            NativeCompaction::Auto => {
                (self.state.native_refusals).known(&self.refusal_key(), &self.chat.model)
            }
        }
    }

    /// True for an ask handoff can serve: a Responses create whose last item is a
    /// `compaction_trigger`, or the `/v1/responses/compact` endpoint.
    fn serves_this_ask(&self) -> bool {
        self.chat.dialect == DialectKind::Responses
            && (self.at_compact_endpoint()
                || self
                    .chat
                    .messages
                    .last()
                    .is_some_and(Message::is_compaction_trigger))
    }

    fn at_compact_endpoint(&self) -> bool {
        (self.chat.asked.as_ref()).is_some_and(|asked| asked.path.is_some())
    }

    /// True when `auto` may serve after the upstream answered `status` with `body`:
    /// the ask is one handoff serves and the answer refuses it. Remembered, logged and
    /// counted the first time for the upstream and model.
    pub(super) fn serves_after_refusal(&self, status: StatusCode, body: &[u8]) -> bool {
        // Served already: a refusal now is about something else, and goes back as it came.
        if self.native_mode() != NativeCompaction::Auto
            || self.serving.is_some()
            || !(self.serves_this_ask() || self.asks_on_create())
        {
            return false;
        }
        let endpoint = self.at_compact_endpoint();
        if !crate::native::refuses_the_ask(status.as_u16(), body, endpoint) {
            return false;
        }
        let upstream = self.refusal_key();
        if self
            .state
            .native_refusals
            .remember(&upstream, &self.chat.model)
        {
            tracing::info!(%upstream, model = %self.chat.model, status = status.as_u16(), "the upstream refuses the API's own compaction: handoff serves it from now on");
            self.state
                .metrics
                .add(SERVED, &[("how", "upstream_refused")], 1.0);
        }
        true
    }

    /// Opens every handle of handoff's the request carries: a forged, altered or
    /// foreign one is refused, naming the item, before anything goes upstream; the
    /// latest is sent as what it stands for. Where handoff serves the compaction, a
    /// provider's sealed item is refused too: the upstream cannot read it, and dropping
    /// it would lose the context it carries.
    pub(super) fn open_handles(&mut self, tracked: &Tracked) -> Result<(), ApiError> {
        if !self.chat.compacted_history {
            return Ok(());
        }
        let dialect = self.chat.dialect;
        let serving = self.native_mode() == NativeCompaction::Serve;
        let mut latest = None;
        for (at, message) in self.chat.messages.iter().enumerate() {
            if !message.is_compacted_history() {
                continue;
            }
            let place = self.item_place(at);
            let Some(sealed) = message.handle() else {
                if serving {
                    return Err(ApiError::invalid_request(
                        "invalid_encrypted_content",
                        format!("{place} is a compaction the provider sealed, and this upstream cannot read it: handoff serves compaction here (upstream.native_compaction = \"serve\"). Send the history it stands for, or a compaction handoff answered."),
                    ));
                }
                continue;
            };
            let payload = handle::open(
                &self.state.secret,
                tracked.id.tenant(),
                Some(&tracked.id),
                sealed,
            )
            .map_err(|err| {
                ApiError::invalid_request(
                    "invalid_encrypted_content",
                    format!("The encrypted content of {place} could not be verified: {err}."),
                )
            })?;
            if payload.dialect != dialect.name() {
                return Err(ApiError::invalid_request(
                    "invalid_encrypted_content",
                    format!("{place} is a compaction handoff answered in another API ({}); it stands for that API's messages", payload.dialect),
                ));
            }
            latest = Some((at, payload));
        }
        let Some((at, payload)) = latest else {
            return Ok(());
        };
        let messages = (payload.expansion.into_iter())
            .map(|raw| {
                let raw: Box<str> = raw.into();
                dialect
                    .get()
                    .read_reply(RawMessage::from(String::from(raw)))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| {
                ApiError::invalid_request(
                    "invalid_encrypted_content",
                    format!(
                        "{}: what it stands for cannot be read: {err}",
                        self.item_place(at)
                    ),
                )
            })?;
        // A Messages reply goes on after its compaction block: those blocks stay.
        let remainder = (handle::remainder(self.chat.messages[at].value())).and_then(|rest| {
            dialect
                .get()
                .read_reply(RawMessage::from(rest.to_string()))
                .ok()
        });
        self.chat.expanded = Some(Arc::new(Expanded {
            at,
            messages,
            remainder,
        }));
        Ok(())
    }

    /// How the API's errors name the request's message `at`: its place in the list,
    /// past the top-level fields.
    fn item_place(&self, at: usize) -> String {
        let index = at - self.chat.top_level.min(at);
        match self.chat.dialect {
            DialectKind::Anthropic => format!("messages.{index}"),
            _ => format!("input[{index}]"),
        }
    }

    /// Serves the request's ask: the strategy chain compacts everything the request
    /// would send (the trigger aside), the view it leaves is sealed into a handle, and
    /// the API's answer carries it, logged as the request's reply.
    pub(super) async fn serve(&self) -> Result<Response<ProxyBody>, Halt> {
        let tracked = self.tracked()?;
        // Everything but the newest unit goes into the handoff: the client keeps none
        // of what the handle stands for.
        let minted = self.mint(false).await?;
        let usage = native_reply::responses_usage(&minted.usage);
        let answer = match self.at_compact_endpoint() {
            true => native_reply::compacted(&minted.input, &minted.handle, usage),
            false => native_reply::triggered(&self.chat.model, &minted.handle, usage),
        };
        let how = if self.at_compact_endpoint() {
            "endpoint"
        } else {
            "trigger"
        };
        self.state.metrics.add(SERVED, &[("how", how)], 1.0);
        tracing::info!(conversation = %tracked.id, record = ?minted.record, how, "served the API's compaction");
        self.answer_served(answer).await
    }

    /// Compacts everything the request would send (a trailing trigger aside) with the
    /// strategy chain, and seals the view it leaves into a handle. `keep_recent`: the
    /// configured recent part stays verbatim; otherwise only the newest unit does.
    pub(super) async fn mint(&self, keep_recent: bool) -> Result<Minted, Halt> {
        let tracked = self.tracked()?;
        let dialect = self.chat.dialect;
        // What the request would send, the trigger aside: handles opened, what the
        // latest stands for first; for a request that continues a response the
        // upstream holds, the whole chain, from the record.
        let view = project_view(&self.chat, tracked, &tracked.compactions);
        let chain;
        let mut list = match self.chat.server_held {
            true => {
                chain = self.chain_history(tracked).await?;
                chain.iter().map(String::as_str).collect()
            }
            false => view.raw_messages(),
        };
        if self
            .chat
            .messages
            .last()
            .is_some_and(Message::is_compaction_trigger)
        {
            list.pop();
        }
        let (_, history) = self.standing_alone(&view, &list)?;
        let computed;
        let budget = match self.budget.as_ref() {
            Some(budget) => budget,
            None => {
                computed = RequestBudget::new(&self.snap.config, &history, &self.state.tokens);
                computed.as_ref().ok_or_else(|| {
                    ApiError::invalid_request(
                        "model_not_configured",
                        format!(
                            "handoff serves this API's compaction, and needs {:?}'s window for it: add [models.\"{}\"] context_window to its config",
                            self.chat.model, self.chat.model
                        ),
                    )
                })?
            }
        };
        let mut history_tracked = Tracked::compute(tracked.id.clone(), &history);
        history_tracked.calibration = tracked.calibration.clone();
        let mut job = self.job_over(
            &history,
            &history_tracked,
            budget,
            budget.threshold,
            Reason::Manual,
        );
        if !keep_recent {
            job.keep_recent = 0.0;
        }
        job.continuer = None;
        let compacted = match Box::pin(self.state.compactor.compact(&job)).await {
            Ok(compacted) => compacted,
            // Too little to compact: the handle carries the history as it is.
            Err(CompactError::TooLarge { .. }) => {
                project_view(&history, &history_tracked, &Default::default())
            }
            Err(err) => return Err(crate::rescue::compaction(err).into()),
        };
        let usage = (compacted.compaction.as_ref())
            .map(|adopted| crate::compaction::chain::sum_usage(&adopted.record.attempts))
            .unwrap_or_default();
        let summary = (compacted.compaction.as_ref())
            .map(|adopted| native_reply::text_of(&adopted.record.handoff))
            .unwrap_or_default();
        let raw = compacted.raw_messages();
        let expansion = (raw.iter())
            .filter_map(|raw| serde_json::value::RawValue::from_string((*raw).to_owned()).ok())
            .collect();
        let messages = (raw.iter())
            .map(|raw| {
                dialect
                    .get()
                    .read_reply(RawMessage::from((*raw).to_owned()))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| ApiError::internal(err.to_string()))?;
        let payload = handle::Payload {
            conversation: tracked.id.to_string(),
            dialect: dialect.name().to_owned(),
            record: compacted.compact_id().map(str::to_owned),
            expansion,
        };
        let handle = handle::seal(&self.state.secret, tracked.id.tenant(), &payload);
        let compacted_input = (history.messages.iter().skip(history.top_level))
            .map(|m| m.value().clone())
            .collect();
        Ok(Minted {
            handle,
            messages,
            usage,
            summary,
            record: payload.record,
            input: compacted_input,
        })
    }

    /// The request with `list` (the view's, or a history from the record) as its list
    /// and continuing no response the upstream holds: its body, and that body read.
    pub(super) fn standing_alone(
        &self,
        view: &crate::projection::ModelView<'_>,
        list: &[&str],
    ) -> Result<(Chunks, crate::dialect::ChatRequest), ApiError> {
        let rendered = view
            .render_list(&self.body, list)
            .map_err(|err| ApiError::internal(err.to_string()))?;
        let body = strip::without_members(
            rendered.contiguous(),
            &["previous_response_id", "conversation"],
        )
        .map_or(rendered, |alone| Chunks::from(Bytes::from(alone)));
        let mut chat = (self.chat.dialect.get())
            .parse_at(self.request_target(), &body)
            .map_err(crate::rescue::dialect)?;
        self.snap.pins.apply(&mut chat);
        Ok((body, chat))
    }

    /// The history a request that continues a response the upstream holds
    /// (`previous_response_id`) stands for: its own pinned items, then every original of
    /// the chain, from the record. Refused when handoff does not hold the response.
    pub(super) async fn chain_history(&self, tracked: &Tracked) -> Result<Vec<String>, ApiError> {
        let continues = self.chat.continues.as_deref().unwrap_or("");
        let not_held = || {
            ApiError::invalid_request(
                "previous_response_not_found",
                format!("handoff serves this API's compaction, and does not hold response {continues:?}: send the history itself, or a response it answered"),
            )
        };
        let tip = tracked.head().ok_or_else(not_held)?;
        let log = (self.state.tracker.store().read(&tracked.id).await)
            .map_err(|err| ApiError::storage(err.to_string()))?;
        let tree = crate::audit::Tree::new(&log);
        let branch = tree.branch(&tip).ok_or_else(not_held)?;
        let pinned = self.chat.pinned_len().min(self.chat.messages.len());
        // Only this request's own items: the chain's start is not in the record.
        if branch.len() <= self.chat.messages.len() - pinned {
            return Err(not_held());
        }
        let mut list: Vec<String> = (self.chat.messages[self.chat.top_level.min(pinned)..pinned]
            .iter())
        .map(|m| m.raw.get().to_owned())
        .collect();
        list.extend(branch.iter().map(|line| line.message.get().to_owned()));
        Ok(list)
    }

    /// Logs the served `answer` as the request's reply, then answers it as the client
    /// asked: JSON, or the API's event stream.
    pub(super) async fn answer_served(&self, answer: Value) -> Result<Response<ProxyBody>, Halt> {
        let tracked = self.tracked()?;
        let view = project_view(&self.chat, tracked, &tracked.compactions);
        let json = Bytes::from(serde_json::to_vec(&answer).unwrap_or_default());
        let target = self.target(tracked, None, &view, (0, None));
        let (mut head, ()) = Response::new(()).into_parts();
        head.headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        let logged = reply::answer_read(head, json, target, None).await;
        if !self.chat.stream || logged.status() != StatusCode::OK {
            return Ok(logged);
        }
        let stream = match self.chat.dialect {
            DialectKind::Anthropic => native_reply::message_stream(&answer),
            _ => native_reply::event_stream(&answer),
        };
        let mut response = Response::new(full(Bytes::from(stream)));
        response.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream"),
        );
        Ok(response)
    }
}

/// A compaction handoff made for the API's own compaction.
pub(super) struct Minted {
    /// The handle, sealed.
    pub(super) handle: String,
    /// What it stands for: the view the compaction left.
    pub(super) messages: Vec<Message>,
    /// The summary calls' usage, in the chat shape.
    pub(super) usage: Value,
    /// The handoff's text, for an API whose item carries it readable.
    pub(super) summary: String,
    /// The compaction record that wrote it.
    pub(super) record: Option<String>,
    /// The list compacted, for an answer that keeps its user messages.
    pub(super) input: Vec<Value>,
}
