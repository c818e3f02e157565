//! The tracked route: every phase of [`super`], over one [`Exchange`] that holds what
//! each phase learned. The dialect ([`crate::dialect::Dialect`]) decides everything
//! format-specific; the phases here are **parse** ([`Exchange::parse`]), **hook**, **identify**,
//! **track** (a server-held request past the window then sent from the record), **fit** (with a compaction prepared in the background past
//! `compaction.prepare_at`), **send** ([`send`]) and **reply** ([`reply`]).

mod asked;
mod charged;
mod decided;
pub(super) mod reply;
mod send;
mod served;
mod strategy;
mod unchained;

use std::sync::Arc;

use handoff_plugin_api::Stage;
use http::header::{self, HeaderValue};
use http::{request, Request, Response};
use hyper::body::Incoming;

use super::authorize::{authorize, Claims};
use super::halt::Halt;
use super::{hooks, intake};
use crate::access_log::RequestLog;
use crate::auth::Admission;
use crate::base::chunks::Chunks;
use crate::base::digest::PrefixDigest;
use crate::base::line::{HookNotes, RedactionNote};
use crate::body::{chunked, ProxyBody};
use crate::compaction::budget::{RequestBudget, Scale};
use crate::compaction::chain::Chain;
use crate::compaction::continued::Continuer;
use crate::compaction::job::{FitError, Fitted, Job};
use crate::compaction::{prepare, Reason};
use crate::config::PrepareAt;
use crate::conversation::{identify, Across, ConversationId, Tracked, CONVERSATION_HEADER};
use crate::dialect::{ChatRequest, DialectKind};
use crate::error::ApiError;
use crate::forward::forward;
use crate::state::{AppState, Snapshot};
use crate::upstream::Upstream;

/// Runs a tracked request of `dialect` (`POST …/chat/completions`, `/v1/messages`,
/// `/v1/responses`) through every phase.
pub(super) async fn run(
    state: &AppState,
    snap: Arc<Snapshot>,
    request: Request<Incoming>,
    log: &mut RequestLog,
    admission: Admission,
    dialect: DialectKind,
) -> Result<Response<ProxyBody>, Halt> {
    // Held until the response head: the body, its parse and any compaction.
    let _slot = enter(state).await?;
    let (parts, body) = request.into_parts();
    let body = intake::whole(state, &snap, &parts, body, &admission).await?;
    exchange(state, snap, (parts, body), log, admission, dialect).await
}

/// Runs a tracked request whose body was read already (a `response.create` of a
/// WebSocket) through every phase after **parse**.
pub(super) async fn run_read(
    state: &AppState,
    snap: Arc<Snapshot>,
    (parts, body): (request::Parts, Chunks),
    log: &mut RequestLog,
    admission: Admission,
    dialect: DialectKind,
) -> Result<Response<ProxyBody>, Halt> {
    let _slot = enter(state).await?;
    exchange(state, snap, (parts, body), log, admission, dialect).await
}

/// A slot of the chat gate, held until the response head: the body, its parse and any
/// compaction.
async fn enter(state: &AppState) -> Result<tokio::sync::OwnedSemaphorePermit, Halt> {
    let slot = state.chat_gate.enter().await.inspect_err(|_| {
        state
            .metrics
            .add("handoff_chat_rejected_total", &[("reason", "busy")], 1.0);
    })?;
    Ok(slot)
}

/// Every phase from **parse** on.
async fn exchange(
    state: &AppState,
    snap: Arc<Snapshot>,
    (parts, body): (request::Parts, Chunks),
    log: &mut RequestLog,
    admission: Admission,
    dialect: DialectKind,
) -> Result<Response<ProxyBody>, Halt> {
    let mut exchange = Exchange::parse(state, snap, parts, body, &admission, dialect)?;
    let claims = exchange.claims();
    authorize(state, &exchange.snap, &admission, &claims).await?;
    if exchange.hook().await? {
        // Sent to another model by a hook: the key must allow that one too.
        let claims = exchange.claims();
        authorize(state, &exchange.snap, &admission, &claims).await?;
    }
    exchange.settle();
    crate::otel::request_model(&exchange.chat.model);
    exchange.note_asks();
    let (id, base, across) = exchange.identify(admission).await?;
    log.set_conversation(&id);
    let Some(tracked) = exchange.track(id, base, across).await? else {
        // store.required is false and the log failed: the request goes as it came.
        let upstream = exchange.upstream().clone();
        let Exchange { parts, body, .. } = exchange;
        return Ok(forward(&upstream, parts, chunked(&body), log).await);
    };
    if tracked.pinned_len != exchange.chat.pinned_len() {
        // What the client kept before a provider's compaction is pinned: the
        // provider's to keep, never handoff's to compact.
        exchange.chat.pinned = Some(tracked.pinned_len);
    }
    exchange.open_handles(&tracked)?;
    exchange.tracked = Some(tracked);
    exchange.unchain().await?;
    if exchange.serves_native() {
        return exchange.serve().await;
    }
    if let Some(answered) = exchange.serve_asks().await? {
        return Ok(answered);
    }
    let fitted = exchange.fit().await?;
    exchange.prepare(&fitted);
    match exchange.send(fitted, log).await {
        // The upstream refused the asks: handoff serves them, and sends again.
        Err(Halt::ServeAsks) => {
            if let Some(answered) = exchange.serve_asks().await? {
                return Ok(answered);
            }
            let fitted = exchange.fit().await?;
            exchange.send(fitted, log).await
        }
        sent => sent,
    }
}

/// One tracked request, and what each phase learned about it.
struct Exchange<'s> {
    state: &'s AppState,
    /// The config snapshot for the whole request: a reload mid-way changes nothing.
    snap: Arc<Snapshot>,
    /// The request head, with the headers as the upstream will get them.
    parts: request::Parts,
    /// The body exactly as the client sent it, in the frames it arrived in.
    body: Chunks,
    /// The parsed request.
    chat: ChatRequest,
    /// The strategies a compaction of this request tries.
    chain: Chain,
    /// The window budget, when compaction applies to this model.
    budget: Option<RequestBudget>,
    /// Digests and adopted compactions, once tracked.
    tracked: Option<Tracked>,
    /// The proxy key its summary calls are charged to, when keys are configured.
    key: Option<Arc<crate::auth::ProxyKey>>,
    /// Who sent it, as the middleware hooks are told.
    caller: hooks::Caller,
    /// The request as the request-stage hooks left it, when reply-stage hooks follow.
    hooked: Option<handoff_plugin_api::HookRequest>,
    /// What the request-stage hooks did, for the request's line.
    notes: Option<HookNotes>,
    /// What the view-stage hooks took out of the view last sent, for the decision line.
    view_notes: std::sync::Mutex<Vec<RedactionNote>>,
    /// The markers `reversible` hooks put in, turned back in the client's reply.
    reverse: Option<Arc<hooks::Reverse>>,
    /// The asks on create handoff serves, once it serves them.
    serving: Option<Box<Serving>>,
    /// What held the history of a server-held request sent from the record instead.
    from_record: Option<&'static str>,
}

/// What handoff serves of one request's asks.
struct Serving {
    /// The asks, read.
    asks: crate::native::asks::Asks,
    /// What the reply gets put in.
    reply: crate::native::prepend::Served,
}

impl<'s> Exchange<'s> {
    /// Phase 2, **parse**: the body in its dialect's shape, then what only a tracked
    /// request is checked for, and its headers as the upstream will get them.
    fn parse(
        state: &'s AppState,
        snap: Arc<Snapshot>,
        mut parts: request::Parts,
        body: Chunks,
        admission: &Admission,
        dialect: DialectKind,
    ) -> Result<Self, Halt> {
        let target = parts.uri.path_and_query().map_or("", |t| t.as_str());
        let mut chat = dialect
            .get()
            .parse_at(target, &body)
            .map_err(crate::rescue::dialect)?;
        let most = snap.config.limits.max_messages;
        if chat.messages.len() > most {
            return Err(ApiError::invalid_request(
                "too_many_messages",
                format!(
                    "the request carries {} messages; this proxy takes at most {most} (limits.max_messages)",
                    chat.messages.len()
                ),
            )
            .into());
        }
        snap.pins.apply(&mut chat);
        let (chain, budget) = Self::for_model(state, &snap, &parts.headers, &chat)?;
        // The reply is read on the side (tracking, usage); a compressed body could not be.
        parts.headers.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_static("identity"),
        );
        // A compacted body has another length; hyper sets the right one from the body.
        parts.headers.remove(header::CONTENT_LENGTH);
        let caller = hooks::Caller {
            tenant: admission.tenant.clone(),
            keyed: admission.key.is_some(),
            path: parts.uri.path().to_owned(),
        };
        Ok(Self {
            state,
            snap,
            parts,
            body,
            chat,
            chain,
            budget,
            tracked: None,
            key: admission.key.clone(),
            caller,
            hooked: None,
            notes: None,
            view_notes: std::sync::Mutex::default(),
            reverse: None,
            serving: None,
            from_record: None,
        })
    }

    /// What depends on the request's model: the strategies a compaction tries, and the
    /// window budget (none for a server-held conversation, the upstream's to manage).
    fn for_model(
        state: &AppState,
        snap: &Snapshot,
        headers: &http::HeaderMap,
        chat: &ChatRequest,
    ) -> Result<(Chain, Option<RequestBudget>), Halt> {
        let chosen = strategy::strategy_override(snap, headers)?;
        let chain = snap.registry.select(&snap.config, &chat.model, chosen);
        let budget = (!chat.server_held)
            .then(|| RequestBudget::new(&snap.config, chat, &state.tokens))
            .flatten();
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
        Ok((chain, budget))
    }

    /// The end of **hook**: the upstream's credentials, for the model the request now
    /// goes to.
    fn settle(&mut self) {
        let upstream = self.snap.upstream_in(self.chat.dialect, &self.chat.model);
        self.snap
            .credentials
            .rewrite(&mut self.parts.headers, self.chat.dialect, upstream);
    }

    /// Phase 4, **hook**: the request-stage `[middleware]` hooks. Their redactions
    /// replace the body (and its parse) before anything reads it for tracking,
    /// compaction or the upstream; true when they sent the request to another model.
    async fn hook(&mut self) -> Result<bool, Halt> {
        let Some(hooked) =
            hooks::on_request(self.state, &self.snap, &self.caller, &self.chat, &self.body).await?
        else {
            self.hooked = self
                .caller
                .for_reply(self.state, &self.snap, &self.chat, &self.body)?;
            return Ok(false);
        };
        let hooks::Hooked {
            body,
            model,
            mut notes,
            request,
            reverse,
        } = hooked;
        self.reverse = reverse;
        let mut body = body.map(Chunks::from);
        if let Some(model) = &model {
            let dialect = self.chat.dialect.get();
            let target = self.request_target().to_owned();
            match dialect.retarget(&target, model) {
                // The model is in the path (Gemini): the body stays as it is.
                Some(moved) => {
                    self.parts.uri = moved.parse().map_err(|_| {
                        ApiError::internal(format!("a hook's model {model:?} makes no valid path"))
                    })?;
                    body = Some(body.unwrap_or_else(|| self.body.clone()));
                }
                None => {
                    let sent = body.as_ref().unwrap_or(&self.body);
                    body = Some(Chunks::from(hooks::with_model(sent, model)?));
                }
            }
            notes.model_from = Some(self.chat.model.clone());
            tracing::info!(from = %self.chat.model, to = %model, "a middleware hook sent the request to another model");
        }
        if let Some(body) = body {
            let mut chat = self
                .chat
                .dialect
                .get()
                .parse_at(self.request_target(), &body)
                .map_err(crate::rescue::dialect)?;
            self.snap.pins.apply(&mut chat);
            if model.is_some() {
                (self.chain, self.budget) =
                    Self::for_model(self.state, &self.snap, &self.parts.headers, &chat)?;
            }
            self.chat = chat;
            self.body = body;
        }
        if !notes.redacted.is_empty() || !notes.tags.is_empty() {
            tracing::info!(tags = ?notes.tags, redacted = notes.redacted.len(), "middleware hooks changed the request");
        }
        if self.caller.has(
            &self.snap,
            &self.chat.model,
            handoff_plugin_api::Stage::Reply,
        ) {
            self.hooked = Some(request);
        }
        self.notes = (!notes.is_empty()).then_some(notes);
        Ok(model.is_some())
    }

    /// What **authorize** checks: the model, and (through a shared upstream key) the
    /// objects the body names, each message searched once in its life.
    fn claims(&self) -> Claims {
        let named = if self.snap.credentials.shares_upstream_key() {
            crate::ownership::request_objects(&self.body, &self.chat)
        } else {
            crate::ownership::Named::default()
        };
        Claims {
            model: Some(self.chat.model.clone()),
            path_model: None,
            batch: None,
            objects: named.objects,
            unknown_ids: named.unknown,
        }
    }

    /// Phase 5, **identify**: the conversation, from the client's header or derived, in
    /// its tenant. A server-held request that continues a logged response also gets the prefix it
    /// continues.
    async fn identify(
        &self,
        admission: Admission,
    ) -> Result<(ConversationId, Option<PrefixDigest>, Option<Across>), ApiError> {
        let header = match self.parts.headers.get(CONVERSATION_HEADER) {
            None => None,
            Some(value) => Some(value.to_str().map_err(|_| {
                ApiError::invalid_request(
                    "invalid_conversation_id",
                    format!("{CONVERSATION_HEADER} is not visible ASCII"),
                )
            })?),
        };
        // A stateful Responses request continues a response that was logged (here, or
        // by another replica of a shared store): it joins that conversation, after it.
        let continued = match self.chat.continues.as_deref() {
            // An artefact's index key is no response the client can name.
            Some(response) if crate::conversation::is_artefact_key(response) => None,
            Some(response) => self
                .state
                .tracker
                .conversation_of_response(&admission.tenant, response)
                .await
                .or_else(|err| {
                    if self.snap.config.store.required {
                        return Err(ApiError::storage(err.to_string()));
                    }
                    tracing::warn!(error = %err, "cannot look up the response this request continues: store.required is false");
                    Ok(None)
                })?,
            None => None,
        };
        let invalid = |err: crate::conversation::IdError| {
            ApiError::invalid_request(
                "invalid_conversation_id",
                format!("{CONVERSATION_HEADER}: {err}"),
            )
        };
        // A request that carries a provider compaction artefact a reply of this tenant
        // minted continues that conversation after it, though the items before it are
        // gone. Looked up only for a request that carries one.
        let across = match continued {
            Some(_) => None,
            None if !self.chat.compacted_history => None,
            // Boxed: the lookup's state stays out of every request's future.
            None => Box::pin(
                self.state
                    .tracker
                    .across_compaction(&admission.tenant, &self.chat),
            )
            .await
                .or_else(|err| {
                    if self.snap.config.store.required {
                        return Err(ApiError::storage(err.to_string()));
                    }
                    tracing::warn!(error = %err, "cannot look up the provider compaction this request carries: store.required is false");
                    Ok(None)
                })?,
        };
        if let Some(text) = header {
            let id = ConversationId::parse(admission.tenant, text).map_err(invalid)?;
            let base = continued
                .filter(|(found, _)| *found == id)
                .and_then(|(_, base)| base);
            return Ok((id, base, across));
        }
        if let Some((id, base)) = continued {
            return Ok((id, base, None));
        }
        if let Some(continues) = &self.chat.continues {
            // Continuing a response this process never saw: a conversation named after it.
            let digest = crate::base::digest::message_digest(&serde_json::json!(continues));
            return Ok((
                ConversationId::derived(admission.tenant, &digest),
                None,
                None,
            ));
        }
        if let Some(across) = across {
            return Ok((across.id.clone(), None, Some(across)));
        }
        let id = identify(admission.tenant, None, &self.chat).map_err(invalid)?;
        let id = match self.state.tracker.opening(id.clone(), &self.chat).await {
            Ok(found) => found,
            Err(err) if self.snap.config.store.required => {
                return Err(ApiError::storage(err.to_string()))
            }
            Err(err) => {
                tracing::warn!(error = %err, "cannot read the conversation: store.required is false");
                id
            }
        };
        Ok((id, None, None))
    }

    /// The beta headers that switch the provider's compaction on, kept with what the
    /// request asked of it (only a request that asked anything).
    fn note_asks(&mut self) {
        use crate::base::line::Asked;
        if self.chat.asked.is_none() && !self.chat.provider_compacts {
            return;
        }
        let headers = &self.parts.headers;
        let sent: Vec<(String, String)> = (Asked::HEADERS.iter())
            .flat_map(|name| {
                (headers.get_all(*name).iter())
                    .filter_map(move |v| Some(((*name).to_owned(), v.to_str().ok()?.to_owned())))
            })
            .collect();
        if !sent.is_empty() {
            self.chat.asked.get_or_insert_with(Box::default).headers = sent;
        }
    }

    /// Phase 6, **track**: logs the new originals; `None` when they could not be logged
    /// and the store is not required.
    async fn track(
        &self,
        id: ConversationId,
        base: Option<PrefixDigest>,
        across: Option<Across>,
    ) -> Result<Option<Tracked>, Halt> {
        match self
            .state
            .tracker
            .track_after(
                id.clone(),
                &self.chat,
                base,
                across.as_ref(),
                self.notes.clone(),
            )
            .await
        {
            Ok(tracked) => Ok(Some(tracked)),
            // A quota is a limit, not a failure: the request is refused either way.
            Err(err @ crate::store::StoreError::QuotaExceeded { .. }) => {
                Err(crate::rescue::store(&err).into())
            }
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

    /// The request's path and query, as the upstream will get them.
    fn request_target(&self) -> &str {
        self.parts.uri.path_and_query().map_or("", |t| t.as_str())
    }

    fn tracked(&self) -> Result<&Tracked, ApiError> {
        self.tracked
            .as_ref()
            .ok_or_else(|| ApiError::internal("the request was not tracked"))
    }

    fn upstream(&self) -> &Upstream {
        self.snap.upstream_in(self.chat.dialect, &self.chat.model)
    }

    /// Phase 7, **fit**: the view to send, compacted when it passes the trigger.
    async fn fit(&self) -> Result<Fitted<'_>, Halt> {
        let tracked = self.tracked()?;
        let budget = self.budget.as_ref();
        match self
            .state
            .compactor
            .fit(
                &self.state.tracker,
                (&self.chat, tracked),
                budget,
                |budget, compact_id| {
                    self.job(
                        tracked,
                        budget,
                        budget.threshold,
                        Reason::Threshold,
                        compact_id,
                    )
                },
                |compact_id| {
                    let budget = budget?;
                    Some(self.detached(tracked, budget, compact_id, Reason::Threshold))
                },
            )
            .await
        {
            Ok(fitted) => Ok(fitted),
            Err(FitError { error, before }) => {
                let error = crate::rescue::compaction(error);
                self.note_refusal(&error, before).await;
                Err(Halt::Error(error))
            }
        }
    }

    /// Part of **fit**: past `compaction.prepare_at` of the trigger and under it (or
    /// over it,
    /// sent without a compaction of its own), the conversation's compaction is prepared
    /// in the background, for the request that crosses the trigger to adopt; this one
    /// goes on untouched. Only chains that call a model prepare: a deterministic handoff
    /// is instant when it is needed.
    fn prepare(&self, fitted: &Fitted<'_>) {
        // Judged on the view sent: after a wait for a running compaction it is that
        // handoff's view, not the one the request arrived with.
        let (Some(budget), Some(before), Ok(tracked)) =
            (self.budget.as_ref(), fitted.after, self.tracked())
        else {
            return;
        };
        let config = &self.snap.config.compaction;
        let calls_a_model = self
            .chain
            .first()
            .is_some_and(|first| !first.strategy.is_deterministic());
        // A request that asks the provider to compact is the provider's to compact.
        if config.prepare_at.is_off() || !calls_a_model || self.chat.provider_compacts {
            return;
        }
        let pace = &self.state.compactor.pace;
        let margin = budget.margin(&Scale::new(tracked.calibration.as_ref(), &self.chat.model));
        let mark = match config.prepare_at {
            PrepareAt::Share(share) => (budget.threshold as f64 * share) as u64,
            // Only "auto" reads the pace: a fixed share costs no record of it.
            PrepareAt::Auto => {
                pace.observe(&tracked.id, before);
                let model = &budget.info.summary_model;
                pace.mark(&tracked.id, budget.limits(&margin), model, config.max_wait)
            }
        };
        let now = crate::compaction::pace::Settled {
            tokens: before,
            messages: fitted.view.live_start + fitted.view.live.len(),
        };
        let settled = pace.settled(&tracked.id, fitted.view.compact_id(), now);
        let latest = pace.latest_start(
            &tracked.id,
            budget.limits(&margin),
            &budget.info.summary_model,
        );
        let mark = prepare::paced_mark(mark, settled.map(|s| s.tokens), budget.threshold, latest);
        // A view sent over the trigger without a compaction of its own (one was running)
        // has the next one prepared, so that the request after it need not wait.
        let due = (before >= mark && before <= budget.threshold) || fitted.sent_over_trigger;
        if !due || prepare::waiting_ahead(&self.chat, tracked) {
            return;
        }
        let metrics = &self.state.metrics;
        let ticket = match self.state.compactor.background.start(&tracked.id) {
            Ok(ticket) => ticket,
            Err(crate::compaction::background::NotStarted::Running) => return,
            Err(crate::compaction::background::NotStarted::Full) => {
                tracing::debug!(conversation = %tracked.id, "compaction.max_background preparations run; this one is dropped");
                metrics.add(prepare::PREPARED, &[("outcome", "dropped")], 1.0);
                return;
            }
        };
        tracing::info!(conversation = %tracked.id, estimate = before, mark, threshold = budget.threshold, "past compaction.prepare_at; preparing the compaction in the background");
        // A stand-in is never a basis: the summary is written over the committed one.
        let sent = fitted.view.compact_id().filter(|_| !fitted.stood_in);
        let basis = prepare::basis(&self.chat, tracked, sent);
        let mut preparation = self.detached(tracked, budget, basis.as_deref(), Reason::Prepared);
        // Adopted once the view reaches the trigger: what arrives until then stays
        // verbatim after the cut, so the cut keeps that much less now. And it cuts
        // after what the view held when first sent on the compaction in force: the
        // upstream cached that prefix at its end, so the summary call reads it from
        // the cache (a cut inside it finds no cached prefix to extend).
        preparation.keep_less = budget.threshold.saturating_sub(before);
        preparation.cut_from = settled.map_or(0, |s| s.messages);
        self.state.compactor.spawn(preparation, ticket);
    }

    /// This request's compaction, owned, to run on its own task: a preparation, or
    /// (`compaction.max_wait`) the run a request that crossed the trigger waits for.
    fn detached(
        &self,
        tracked: &Tracked,
        budget: &RequestBudget,
        compact_id: Option<&str>,
        reason: Reason,
    ) -> prepare::Preparation {
        prepare::Preparation {
            tracker: Arc::clone(&self.state.tracker),
            config: Arc::clone(&self.snap.config),
            request: self.chat.clone(),
            tracked: tracked.clone(),
            budget: budget.clone(),
            client: self.summary_client(budget),
            chain: Arc::clone(&self.chain),
            seen_compact_id: compact_id.map(str::to_owned),
            reason,
            keep_less: 0,
            continuer: self.continuer(budget),
            cut_from: 0,
        }
    }

    /// The summary client of this request: its upstream, path and the client's own
    /// credential and API headers.
    fn summary_client(&self, budget: &RequestBudget) -> Arc<dyn handoff_plugin_api::ModelClient> {
        let client = crate::compaction::model_client::summary_client(
            &self.snap.config,
            &budget.info.summary_model,
            self.chat.dialect,
            self.upstream().clone(),
            self.parts.uri.path_and_query().cloned(),
            self.parts.headers.clone(),
        );
        let client = hooks::summary_client(
            self.state,
            &self.snap,
            &self.caller,
            &self.chat.model,
            self.chat.dialect,
            client,
        );
        self.charged(client)
    }

    /// `client`, its calls charged to the request's proxy key when it has one.
    fn charged(
        &self,
        client: Arc<dyn handoff_plugin_api::ModelClient>,
    ) -> Arc<dyn handoff_plugin_api::ModelClient> {
        match &self.key {
            Some(key) => Arc::new(charged::ChargedClient::new(
                client,
                Arc::clone(key),
                Arc::clone(&self.state.limiter),
                Arc::clone(&self.state.metrics),
            )),
            None => client,
        }
    }

    /// How this request's summary calls continue its conversation over the upstream's
    /// prompt cache: when they go to the request's own model through its own API, and
    /// no view-stage hook must see them first (those read the rendered form).
    fn continuer(&self, budget: &RequestBudget) -> Option<Arc<Continuer>> {
        let call = Continuer::eligible(&self.snap.config, &self.chat, &budget.info.summary_model)?;
        if self.caller.has(&self.snap, &self.chat.model, Stage::View) {
            return None;
        }
        let path = Continuer::path(&self.chat, self.request_target())?;
        let client: Arc<dyn handoff_plugin_api::ModelClient> = Arc::new(
            crate::compaction::model_client::UpstreamModelClient::new(
                self.upstream().clone(),
                path,
                self.parts.headers.clone(),
            )
            .speaking(self.chat.dialect),
        );
        Some(Arc::new(Continuer {
            body: self.body.clone(),
            client: self.charged(client),
            call,
            extra: self.snap.config.compaction.summary_request_extra.clone(),
        }))
    }

    /// The compaction job of this request: the one place a chat request builds one.
    fn job<'e>(
        &'e self,
        tracked: &'e Tracked,
        budget: &RequestBudget,
        threshold: u64,
        reason: Reason,
        seen_compact_id: Option<&str>,
    ) -> Job<'e> {
        let mut job = self.job_over(&self.chat, tracked, budget, threshold, reason);
        job.seen_compact_id = seen_compact_id.map(str::to_owned);
        job.continuer = self.continuer(budget);
        job
    }

    /// A compaction job over `request`, this request's or one made from it (what a
    /// served compaction compacts), with this request's client, chain and prices.
    fn job_over<'e>(
        &'e self,
        request: &'e ChatRequest,
        tracked: &'e Tracked,
        budget: &RequestBudget,
        threshold: u64,
        reason: Reason,
    ) -> Job<'e> {
        let client = self.summary_client(budget);
        let mut job = Job::new(
            &self.state.tracker,
            request,
            tracked,
            &self.snap.config.compaction,
            budget,
            client,
            Arc::clone(&self.chain),
        );
        job.threshold = threshold;
        job.reason = reason;
        job.prices = Some(&self.snap.config.prices);
        job
    }
}

#[cfg(test)]
mod tests;
