//! Conversation tracking: which conversation a request belongs to, which of its
//! messages are new, and appending those (and the replies) to the log of originals.
//!
//! The log is a tree: a request whose history diverges from what was logged (an edited
//! message, a regenerated reply) starts a branch at the common parent. Nothing is ever
//! overwritten. The known prefix digests of each conversation are cached in a bounded
//! moka cache and rebuilt from disk on a miss; start-up reads nothing.

mod flight;
mod forms;
mod state;
mod tracked;

use state::keeps_text;
pub use state::{Across, ConversationEntry, ConversationState};
pub use tracked::{counts_upstream_edits, CapturedReplies, Tracked};

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;
use tokio::sync::Mutex;

pub use crate::base::id::{ConversationId, IdError, CONVERSATION_HEADER};
pub use crate::base::reply::CapturedReply;

use crate::adoption::Adopted;
use crate::base::calibration::Calibration;
use crate::base::digest::{
    message_digest, next_prefix, prefix_digests_after, MessageDigest, PrefixDigest,
};
use crate::base::line::{DecisionLine, Entry, Line, MessageLine, PinnedLine, RequestLine, Source};
use crate::base::record::CompactionRecord;
use crate::dialect::echo::{echo_digest, reference_digest, turn_forms};
use crate::dialect::{ChatRequest, DialectKind, Message, RawMessage};
use crate::store::{Committed, Lease, Store, StoreError};
use crate::tenant::TenantId;

/// Tracks conversations in a bounded cache over a [`Store`].
pub struct Tracker {
    store: Arc<dyn Store>,
    cache: moka::future::Cache<ConversationId, Arc<ConversationEntry>, ahash::RandomState>,
    /// Responses' response ids to the conversation that logged them, so a stateful
    /// request (`previous_response_id`) joins its conversation. A shared store keeps
    /// them too, for the other replicas; this is its cache.
    responses: moka::sync::Cache<
        (TenantId, String),
        (ConversationId, Option<PrefixDigest>),
        ahash::RandomState,
    >,
    /// Opening turns by the shorter form of their first cut ([`turn_forms`]), so the
    /// second request of a client that appended a reminder to its first turn joins the
    /// first's conversation. In memory only: losing one splits off a one-turn
    /// conversation, nothing more.
    openings: moka::sync::Cache<(TenantId, MessageDigest), ConversationId, ahash::RandomState>,
    /// How long a compaction lease lasts without renewal.
    lease_ttl: std::time::Duration,
    /// The locks that make compactions single flight in this process, by conversation.
    /// Apart from the cache: an eviction mid-run must not let a second run start.
    flights: std::sync::Mutex<HashMap<ConversationId, std::sync::Weak<Mutex<()>>>>,
}

/// The conversation id within `tenant`: the header if given (and valid), else derived.
pub fn identify(
    tenant: TenantId,
    header: Option<&str>,
    request: &ChatRequest,
) -> Result<ConversationId, IdError> {
    if let Some(text) = header {
        return ConversationId::parse(tenant, text);
    }
    let pinned = request.pinned_len();
    let first = request
        .messages
        .get(pinned)
        .or_else(|| request.messages.first())
        .map(Message::identity_digest)
        .unwrap_or_else(|| message_digest(&Value::Null));
    // Another dialect with the same opening is another conversation: its handoffs
    // have another shape. The log's own format keeps the ids it always had.
    let first = if request.dialect == DialectKind::default() {
        first
    } else {
        message_digest(&serde_json::json!([request.dialect.name(), first.to_hex()]))
    };
    Ok(ConversationId::derived(tenant, &first))
}

impl Tracker {
    /// A tracker over `store` that keeps at most `capacity` conversations in memory.
    pub fn new(store: Arc<dyn Store>, capacity: u64) -> Self {
        Self::weighed(store, capacity, u64::MAX)
    }

    /// A tracker over `store` that keeps at most `capacity` conversations and about
    /// `bytes` of their state in memory; the least used go first, and reload from the
    /// store when they come back.
    pub fn weighed(store: Arc<dyn Store>, capacity: u64, bytes: u64) -> Self {
        // Each entry weighs at least its share of `bytes`: never more than `capacity`.
        let floor = u32::try_from(bytes / capacity.max(1))
            .unwrap_or(u32::MAX)
            .max(1);
        let cache = moka::future::Cache::builder()
            .max_capacity(bytes.min(u64::from(floor).saturating_mul(capacity)))
            .weigher(move |_, entry: &Arc<ConversationEntry>| {
                entry
                    .weight
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .max(floor)
            })
            // Keyed per process as std's SipHash is, at a fraction of its cost on the
            // ids every request looks up twice.
            .build_with_hasher(ahash::RandomState::new());
        Self {
            store,
            cache,
            responses: moka::sync::Cache::builder()
                .max_capacity(capacity.saturating_mul(4))
                .build_with_hasher(ahash::RandomState::new()),
            openings: moka::sync::Cache::builder()
                .max_capacity(capacity)
                .build_with_hasher(ahash::RandomState::new()),
            lease_ttl: std::time::Duration::from_secs(30),
            flights: std::sync::Mutex::default(),
        }
    }

    /// The same tracker with compaction leases of `ttl`.
    pub fn with_lease_ttl(mut self, ttl: std::time::Duration) -> Self {
        self.lease_ttl = ttl;
        self
    }

    /// The conversation that logged the response `response_id`, and the prefix that
    /// ends with it, if this process or (with a shared store) any replica saw it.
    pub async fn conversation_of_response(
        &self,
        tenant: &TenantId,
        response_id: &str,
    ) -> Result<Option<(ConversationId, Option<PrefixDigest>)>, StoreError> {
        let key = (tenant.clone(), response_id.to_owned());
        if let Some(found) = self.responses.get(&key) {
            return Ok(Some(found));
        }
        let found = self.store.response(tenant, response_id).await?;
        if let Some(found) = &found {
            self.responses.insert(key, found.clone());
        }
        Ok(found)
    }

    /// The conversation a derived `id` stands for: when `id` is new and `request` opens
    /// with a shorter form of another conversation's opening turn (a client that dropped
    /// the reminder it appended to its first turn), that conversation.
    pub async fn opening(
        &self,
        id: ConversationId,
        request: &ChatRequest,
    ) -> Result<ConversationId, StoreError> {
        let rest = &request.messages[request.pinned_len().min(request.messages.len())..];
        let Some(echo) = rest
            .first()
            .filter(|_| rest.len() > 1)
            .and_then(Message::echo_digest)
        else {
            return Ok(id);
        };
        let Some(found) = self.openings.get(&(id.tenant().clone(), echo)) else {
            return Ok(id);
        };
        if found == id {
            return Ok(id);
        }
        let entry = self.entry(&id).await?;
        let new = entry.lock().await.known.is_empty();
        Ok(if new { found } else { id })
    }

    /// Where `request` continues after a provider compaction: the last artefact it
    /// carries (after the pinned messages) that a reply of this tenant minted, and the
    /// conversation and place that reply was logged at. Kept in the response index, so
    /// a restart or another replica finds it too.
    pub async fn across_compaction(
        &self,
        tenant: &TenantId,
        request: &ChatRequest,
    ) -> Result<Option<Across>, StoreError> {
        // Nothing to look up for a request without artefacts: the common case is free.
        if !request.compacted_history {
            return Ok(None);
        }
        let pinned = request.pinned_len().min(request.messages.len());
        let carried = (request.messages[pinned..].iter().enumerate().rev())
            .filter(|(_, m)| m.is_compacted_history())
            .filter_map(|(at, m)| Some((pinned + at, m.echo_digest()?)));
        for (at, echo) in carried {
            let key = artefact_key(&echo);
            if let Some((id, base)) = self.conversation_of_response(tenant, &key).await? {
                return Ok(Some(Across { id, base, at }));
            }
        }
        Ok(None)
    }

    /// The store behind this tracker.
    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// The conversation's entry, loaded from the store on a cache miss.
    pub async fn entry(&self, id: &ConversationId) -> Result<Arc<ConversationEntry>, StoreError> {
        Ok(self.entry_loaded(id).await?.0)
    }

    /// The conversation's entry, and whether it was read from the store just now (so
    /// it is as fresh as a catch-up would make it).
    async fn entry_loaded(
        &self,
        id: &ConversationId,
    ) -> Result<(Arc<ConversationEntry>, bool), StoreError> {
        // Nearly every request finds its conversation cached. The load's future (the
        // cache's insert-once machinery and the store's read) is kilobytes, and boxed it
        // stays off the future of every request that does not need it.
        if let Some(entry) = self.cache.get(id).await {
            return Ok((entry, false));
        }
        Box::pin(self.load_entry(id)).await
    }

    /// Reads the conversation's entry from the store into the cache, once however many
    /// requests miss it together; true when this call read it.
    async fn load_entry(
        &self,
        id: &ConversationId,
    ) -> Result<(Arc<ConversationEntry>, bool), StoreError> {
        let store = Arc::clone(&self.store);
        let key = id.clone();
        let entry = self
            .cache
            .entry(id.clone())
            .or_try_insert_with(async move {
                let log = store.read_index(&key, keeps_text).await?;
                if !log.problems.is_empty() {
                    tracing::warn!(conversation = %key, problems = log.problems.len(), "skipped unreadable log lines; run `handoff audit verify`");
                }
                Ok::<_, StoreError>(Arc::new(ConversationEntry::new(ConversationState::from_log(&log))))
            })
            .await
            .map_err(|shared: Arc<StoreError>| match Arc::try_unwrap(shared) {
                Ok(err) => err,
                Err(shared) => StoreError::Read {
                    id: id.to_string(),
                    source: std::io::Error::other(shared.to_string()),
                },
            })?;
        let fresh = entry.is_fresh();
        Ok((entry.into_value(), fresh))
    }

    /// Runs `remove` (the store's removal of `id`) under the conversation's lock, then
    /// empties and evicts its cached state: a request that waited for the lock finds no
    /// history and starts the conversation anew, and none of its text stays here.
    pub async fn forget_with<T>(
        &self,
        id: &ConversationId,
        remove: impl std::future::Future<Output = T>,
    ) -> T {
        let out = match self.cache.get(id).await {
            Some(entry) => {
                let mut state = entry.lock().await;
                let out = remove.await;
                *state = ConversationState::default();
                out
            }
            None => remove.await,
        };
        // A load that raced the removal may have cached what it read meanwhile.
        if let Some(entry) = self.cache.remove(id).await {
            *entry.lock().await = ConversationState::default();
        }
        out
    }

    /// Drops what the in-memory indexes say of the conversations `gone`: the response
    /// ids and opening turns that lead to them.
    pub fn forget_links(&self, gone: &std::collections::HashSet<ConversationId>) {
        for (key, (id, _)) in self.responses.iter() {
            if gone.contains(&id) {
                self.responses.invalidate(&*key);
            }
        }
        for (key, id) in self.openings.iter() {
            if gone.contains(&id) {
                self.openings.invalidate(&*key);
            }
        }
    }

    /// Logs the request's new originals before it goes upstream.
    pub async fn track(
        &self,
        id: ConversationId,
        request: &ChatRequest,
    ) -> Result<Tracked, StoreError> {
        self.track_after(id, request, None, None, None).await
    }

    /// Logs the request's new originals as continuing the prefix `base` (a server-held
    /// request's items follow the response they continue), or after the provider
    /// compaction `across` names, or from the root, with what the middleware hooks did
    /// to it.
    pub async fn track_after(
        &self,
        id: ConversationId,
        request: &ChatRequest,
        base: Option<PrefixDigest>,
        across: Option<&Across>,
        hooks: Option<crate::base::line::HookNotes>,
    ) -> Result<Tracked, StoreError> {
        let mut base = base;
        let mut pinned_len = request.pinned_len();
        // Each message's facts are read once: its digest, and its bytes key for forms.
        let (mut message_digests, mut keys): (Vec<MessageDigest>, Vec<u128>) = request.messages
            [pinned_len..]
            .iter()
            .map(|m| (m.digest(), m.bytes_key()))
            .unzip();
        let (entry, fresh) = self.entry_loaded(&id).await?;
        let mut state = entry.lock().await;
        let across = across.filter(|a| {
            base.is_none() && a.id == id && a.at >= pinned_len && request.floated.is_empty()
        });
        if let Some(across) = across {
            if self.store.shared() && !fresh {
                self.catch_up(&id, &mut state).await?;
            }
            // A client that re-sent the whole history up to the artefact continues its
            // chain as any other; one that dropped what the provider compacted away
            // continues after the artefact, what it kept before it pinned.
            let skipped = across.at - pinned_len;
            let (mut prefix, _) = state.prefixes_of(&message_digests);
            let mut digests = message_digests.clone();
            let rest = &request.messages[pinned_len..];
            if state.known_prefix(rest, &mut digests, &mut prefix, None) <= skipped {
                let (at, after) = state.after_artefact(&request.messages, across);
                base = after;
                message_digests.drain(..at - pinned_len);
                keys.drain(..at - pinned_len);
                pinned_len = at;
            }
        }
        let (pinned, rest) = request.messages.split_at(pinned_len);
        let pinned_digests: Vec<MessageDigest> = pinned.iter().map(Message::digest).collect();
        let pinned_set = state.pinned_set(pinned);
        let (mut prefix, same) = match base {
            None => state.prefixes_of(&message_digests),
            Some(_) => (prefix_digests_after(base, &message_digests), 0),
        };
        // The digests as sent: known_prefix may map echoed forms onto logged ones.
        let sent = (base.is_none()).then(|| message_digests[same..].to_vec());
        // Prefix-closed: if d[i] is logged, so is every d[j < i].
        let mut known = state.known_prefix(rest, &mut message_digests, &mut prefix, base);
        if self.store.shared() && !fresh {
            // New to this replica; perhaps not to the others (a reply another replica
            // logged, echoed back): read what they wrote before logging anything. A
            // request of known messages too: another replica may have logged other
            // forms of them since, and this one's forms are named against the log's.
            self.catch_up(&id, &mut state).await?;
            known = state.known_prefix(rest, &mut message_digests, &mut prefix, base);
        }
        let pinned_known = pinned_set.filter(|d| state.pinned.contains_key(d));
        let forms = state.form_changes(
            pinned,
            pinned_known,
            rest,
            (&prefix, &keys),
            known,
            same,
            sent.is_some(),
        );
        if let Some(sent) = &sent {
            state.keep_chain(same, sent, &prefix, &keys);
        }
        let mut lines = Vec::with_capacity(rest.len() - known + 2 + forms.lines.len());
        if let Some(digest) = pinned_set.filter(|d| !state.pinned.contains_key(d)) {
            lines.push(Line::now(Entry::Pinned(PinnedLine {
                digest,
                messages: pinned.iter().map(|m| m.raw.to_raw_value()).collect(),
                block: None,
            })));
        }
        for index in known..rest.len() {
            let parent = index.checked_sub(1).map(|p| prefix[p]).or(base);
            // The model is on the request line, once: a long model name per message
            // multiplied what a body of tiny messages wrote.
            lines.push(Line::now(Entry::Message(MessageLine::client(
                prefix[index],
                parent,
                message_digests[index],
                rest[index].raw.to_raw_value(),
            ))));
            for echo in [rest[index].echo_digest(), rest[index].reference_digest()] {
                state.remember_echo(parent, echo, message_digests[index], prefix[index]);
            }
            if index + 1 == rest.len() {
                state.remember_turn(
                    parent,
                    rest[index].value(),
                    message_digests[index],
                    prefix[index],
                );
            }
        }
        let this_request = state::LastRequest {
            head: prefix.last().copied(),
            pinned: pinned_set,
            floated: request.floated.clone(),
            form_changes: state.form_changes,
        };
        let repeat = state.last_request.as_ref() == Some(&this_request);
        // A repeat's hooks did to it what they did to the request it repeats, whose
        // line notes it.
        if known == rest.len() && lines.is_empty() && forms.is_empty() && repeat {
            // A retry or a repeat of the latest request adds nothing to the log: no
            // write, and the lock is brief. (A request of known messages that is not
            // one, a regenerate from an earlier turn, gets its own request line.)
            if sent.is_some() {
                state.chain_changes = state.form_changes;
            }
            return Ok(Tracked {
                id,
                pinned_len,
                pinned_digests,
                message_digests,
                new_messages: 0,
                prefix,
                compactions: state.compactions.clone(),
                calibration: state.calibration.clone(),
                held: state.held,
                logged: false,
            });
        }
        let form_entries = forms.entries.clone();
        lines.extend(forms.lines.iter().cloned());
        lines.push(Line::now(Entry::Request(RequestLine {
            dialect: (request.dialect != DialectKind::OpenAiChat)
                .then(|| request.dialect.name().to_owned()),
            top_level: (request.top_level > 0).then_some(request.top_level),
            server_held: request.server_held.then_some(true),
            model: request.model.clone(),
            head: prefix.last().copied(),
            pinned: pinned_set,
            floated: request.floated.clone(),
            stream: request.stream,
            new_messages: rest.len() - known,
            forms: form_entries,
            inline_forms: forms.inline.clone(),
            carried: base.map(|_| rest.len()),
            hooks,
            asked: request.asked.clone(),
        })));
        self.store.append(&id, lines).await?;
        if state.known.is_empty() && base.is_none() {
            if let [turn] = rest {
                if let Some(&form) = turn_forms(turn.value()).first() {
                    self.openings
                        .insert((id.tenant().clone(), form), id.clone());
                }
            }
        }
        for index in known..rest.len() {
            state.known.insert(prefix[index], keys[index]);
            state.keep_recent(prefix[index], rest[index].raw.get(), index == known);
        }
        if let Some(digest) = pinned_set {
            state
                .pinned
                .entry(digest)
                .or_insert_with(|| pinned.iter().map(Message::bytes_key).collect());
        }
        state.apply_forms(forms);
        if sent.is_some() {
            state.chain_changes = state.form_changes;
        }
        state.last_request = Some(state::LastRequest {
            form_changes: state.form_changes,
            ..this_request
        });
        self.reweigh(&id, &entry, &state).await;
        Ok(Tracked {
            id,
            pinned_len,
            pinned_digests,
            message_digests,
            new_messages: prefix.len() - known,
            prefix,
            compactions: state.compactions.clone(),
            calibration: state.calibration.clone(),
            held: state.held,
            logged: true,
        })
    }

    /// Logs `decision` on its own, for a request that ends without replies to log it
    /// with (an upstream error, a refusal, an unreadable reply). A failed write loses
    /// only the note, and is warned about.
    pub async fn record_decision(&self, id: &ConversationId, decision: DecisionLine) {
        let line = Line::now(Entry::Decision(decision));
        if let Err(err) = self.store.append(id, vec![line]).await {
            tracing::warn!(conversation = %id, error = %err, "cannot log the request's decision");
        }
    }

    /// Logs the upstream's reply choices as the next originals after their parent.
    pub async fn record_replies(
        &self,
        id: &ConversationId,
        batch: CapturedReplies,
    ) -> Result<(), StoreError> {
        // Each reply is read and digested before the conversation is locked: none of it
        // depends on the state, and a request of the same conversation on another worker
        // would otherwise wait for it (and be woken across threads).
        let mut parent = batch.parent;
        let mut read = Vec::with_capacity(batch.replies.len());
        for reply in batch.replies {
            let facts = reply_digests(batch.dialect, &reply)?;
            let digest = next_prefix(parent.as_ref(), &facts.digest);
            read.push((reply, facts, digest, parent));
            if batch.sequence {
                parent = Some(digest);
            }
        }
        let entry = self.entry(id).await?;
        let mut state = entry.lock().await;
        let mut lines = Vec::with_capacity(read.len() + 1);
        // Before the replies: the view the request was sent, then what it got.
        lines.extend(batch.decision.map(|d| Line::now(Entry::Decision(d))));
        let mut added = Vec::with_capacity(read.len());
        let mut item_ids = Vec::new();
        for (reply, facts, digest, this_parent) in read {
            if state.known.contains_key(&digest) || added.iter().any(|(d, _, _)| *d == digest) {
                // The same reply twice (a cached answer, n > 1 with equal choices).
                continue;
            }
            let message_digest = facts.digest;
            added.push((digest, facts, this_parent));
            if batch.sequence {
                item_ids.push(item_id(&reply.message));
            }
            lines.push(Line::now(Entry::Message(MessageLine {
                digest,
                parent: this_parent,
                message_digest,
                source: Source::Upstream,
                model: batch.model.clone(),
                message: reply.message,
                usage: batch.usage.clone(),
                finish_reason: reply.finish_reason,
                choice: Some(reply.choice),
                complete: Some(batch.incomplete.is_none()),
                incomplete: batch.incomplete.map(|o| o.as_str().to_owned()),
            })));
        }
        let texts: Vec<String> = lines
            .iter()
            .filter_map(|line| match &line.entry {
                Entry::Message(message) => Some(message.message.get().to_owned()),
                _ => None,
            })
            .collect();
        if !lines.is_empty() {
            self.store.append(id, lines).await?;
        }
        let mut items = Vec::new();
        let mut artefacts = Vec::new();
        for ((digest, facts, parent), text) in added.into_iter().zip(texts) {
            state.known.insert(digest, facts.key);
            if let Some(echo) = facts.echo.filter(|_| facts.artefact) {
                artefacts.push((artefact_key(&echo), parent));
            }
            state.keep_recent(digest, &text, false);
            for echo in [facts.echo, facts.reference] {
                state.remember_echo(parent, echo, facts.digest, digest);
            }
            if batch.sequence {
                items.push(digest);
            }
        }
        // `parent` is now the last item of the response: what a follow-up continues. A
        // server-side conversation moves on to it too; a response id stays where it is.
        let head = if batch.sequence { parent } else { batch.parent };
        // Each output item ends its own prefix: an `item_reference` to it is the
        // tenant's, and continues the conversation there.
        let items = item_ids
            .into_iter()
            .zip(items)
            .filter_map(|(item, digest)| Some((item?, Some(digest))));
        let ends = batch
            .response_id
            .into_iter()
            .chain(batch.conversation)
            .map(|key| (key, head))
            .chain(items)
            .chain(artefacts);
        for (key, head) in ends {
            let cached = (id.tenant().clone(), key);
            // The same id at the same place again (a retried request): stored already.
            if self
                .responses
                .get(&cached)
                .is_some_and(|(known, at)| known == *id && at == head)
            {
                continue;
            }
            if let Err(err) = self.store.remember_response(id, &cached.1, head).await {
                // The reply is logged; only another replica's lookup of it is lost.
                tracing::warn!(conversation = %id, error = %err, "cannot store a response id");
            }
            self.responses.insert(cached, (id.clone(), head));
        }
        // Only once the reply is logged: calibration describes a request that happened.
        if let Some(calibration) = batch.calibration {
            state.calibration = Some(calibration.after(state.calibration.as_ref()));
        }
        if let Some(held) =
            (batch.usage.as_ref()).and_then(|usage| held_tokens(batch.dialect, usage))
        {
            state.held = Some(held);
        }
        self.reweigh(id, &entry, &state).await;
        Ok(())
    }

    /// Weighs `entry` again in the cache when its state grew by a quarter (or 4 KiB)
    /// since it was last weighed: a conversation that grows is weighed as it is.
    async fn reweigh(
        &self,
        id: &ConversationId,
        entry: &Arc<ConversationEntry>,
        state: &ConversationState,
    ) {
        use std::sync::atomic::Ordering;
        let now = state.weight();
        let then = entry.weight.load(Ordering::Relaxed);
        if now > then.saturating_add((then / 4).max(4096)) {
            entry.weight.store(now, Ordering::Relaxed);
            self.cache.insert(id.clone(), Arc::clone(entry)).await;
        }
    }

    /// The conversation's adopted compactions, fresh from its state.
    pub async fn compactions(
        &self,
        id: &ConversationId,
    ) -> Result<HashMap<PrefixDigest, Arc<Adopted>>, StoreError> {
        let entry = self.entry(id).await?;
        let state = entry.lock().await;
        Ok(state.compactions.clone())
    }

    /// The conversation's last calibration, if a reply reported usage.
    pub async fn calibration(
        &self,
        id: &ConversationId,
    ) -> Result<Option<Calibration>, StoreError> {
        let entry = self.entry(id).await?;
        let state = entry.lock().await;
        Ok(state.calibration.clone())
    }

    /// Commits `record` (record, then boundary) under `lease` and adopts it; when
    /// another replica's record already covers the prefix, adopts that one instead.
    pub async fn commit_compaction(
        &self,
        id: &ConversationId,
        record: CompactionRecord,
        lease: &Lease,
    ) -> Result<Arc<Adopted>, StoreError> {
        let adopted = Arc::new(Adopted::new(record.clone())?);
        let prefix = adopted.record.source.prefix_digest;
        let entry = self.entry(id).await?;
        let mut state = entry.lock().await;
        match self.store.commit_compaction(id, record, lease).await? {
            Committed::Written => {
                state.compactions.insert(prefix, Arc::clone(&adopted));
                Ok(adopted)
            }
            Committed::Superseded => {
                self.catch_up(id, &mut state).await?;
                state.compactions.get(&prefix).cloned().ok_or_else(|| {
                    StoreError::Database(format!(
                        "the compaction covering {} in conversation {id} is not readable",
                        prefix.short(12)
                    ))
                })
            }
        }
    }
}

/// The response index's key for a provider compaction artefact with echo digest
/// `echo`. No response id has this form, and a stateful request naming one is not
/// looked up ([`is_artefact_key`]).
fn artefact_key(echo: &MessageDigest) -> String {
    format!("{ARTEFACT_KEY}{}", echo.to_hex())
}

const ARTEFACT_KEY: &str = "provider-compaction:";

/// True for a response index key that names a provider compaction artefact.
pub fn is_artefact_key(key: &str) -> bool {
    key.starts_with(ARTEFACT_KEY)
}

/// What tracking keeps of a reply: its digest, the digests it is echoed by, and the
/// keyed hash of its bytes.
struct ReplyFacts {
    digest: MessageDigest,
    echo: Option<MessageDigest>,
    reference: Option<MessageDigest>,
    key: u128,
    /// A provider compaction artefact: a later request carrying it continues here.
    artefact: bool,
}

/// A reply's digests. Read through the dialect's facts cache, so a reply is parsed
/// once and a client that echoes it byte for byte finds it parsed; a reply no request
/// could carry as it is (no role) is parsed here and not cached.
fn reply_digests(dialect: DialectKind, reply: &CapturedReply) -> Result<ReplyFacts, StoreError> {
    let raw = RawMessage::from(reply.message.get().to_owned());
    if let Ok(message) = dialect.get().read_reply(raw) {
        return Ok(ReplyFacts {
            digest: message.digest(),
            echo: message.echo_digest(),
            reference: message.reference_digest(),
            key: message.bytes_key(),
            artefact: message.is_provider_compaction(),
        });
    }
    let value: Value = serde_json::from_str(reply.message.get())?;
    Ok(ReplyFacts {
        digest: message_digest(&value),
        echo: echo_digest(&value),
        reference: reference_digest(&value),
        key: crate::base::chunks::keyed_hash(reply.message.get().as_bytes()),
        artefact: false,
    })
}

/// The `id` of a reply item (a Responses output item), when it has one.
fn item_id(message: &serde_json::value::RawValue) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Item {
        id: Option<String>,
    }
    serde_json::from_str::<Item>(message.get())
        .ok()?
        .id
        .filter(|id| !id.is_empty() && id.len() <= 256)
}

/// What the upstream counted for a reply (`usage`): its request's input and its own
/// output, the tokens a request that continues it on the server starts from.
fn held_tokens(dialect: DialectKind, usage: &Value) -> Option<u64> {
    let dialect = dialect.get();
    let input = dialect.input_tokens(usage)?;
    Some(input + dialect.billed(usage).map_or(0, |billed| billed.output))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::base::digest::prefix_digests;

    #[tokio::test]
    async fn a_compaction_lock_outlives_the_cache_entry() {
        let tracker = Tracker::new(Arc::new(crate::store::MemoryStore::default()), 1);
        let id = ConversationId::parse(TenantId::legacy(), "a").unwrap();
        let held = tracker.single_flight(&id).await;
        tracker.entry(&id).await.unwrap();
        tracker.cache.invalidate_all();
        tracker.cache.run_pending_tasks().await;
        let second = std::time::Duration::from_millis(100);
        assert!(
            tokio::time::timeout(second, tracker.single_flight(&id))
                .await
                .is_err(),
            "an evicted entry must not let a second run start"
        );
        drop(held);
        assert!(tokio::time::timeout(second, tracker.single_flight(&id))
            .await
            .is_ok());
    }

    #[tokio::test]
    async fn the_cache_is_weighed_in_bytes_as_conversations_grow() {
        let budget = 64 * 1024;
        let tracker = Tracker::weighed(Arc::new(crate::store::MemoryStore::default()), 100, budget);
        for c in 0..10 {
            let messages: Vec<serde_json::Value> = (0..400)
                .map(|i| serde_json::json!({"role": "user", "content": format!("c{c} m{i}")}))
                .collect();
            let body = serde_json::json!({"model": "m", "messages": messages}).to_string();
            let request = ChatRequest::parse(body.as_bytes()).unwrap();
            let id = ConversationId::parse(TenantId::legacy(), &format!("c{c}")).unwrap();
            tracker.track(id, &request).await.unwrap();
        }
        tracker.cache.run_pending_tasks().await;
        assert!(
            tracker.cache.weighted_size() <= budget,
            "{}",
            tracker.cache.weighted_size()
        );
        assert!(
            tracker.cache.entry_count() < 10,
            "{}",
            tracker.cache.entry_count()
        );
    }

    #[test]
    fn a_reused_chain_equals_a_fresh_one() {
        let digests: Vec<MessageDigest> = (0..6)
            .map(|i| message_digest(&serde_json::json!({"role": "user", "content": i})))
            .collect();
        let keys = |n: usize| -> Vec<u128> { (0..n as u128).collect() };
        let chain = |digests: &[MessageDigest]| -> Vec<(MessageDigest, PrefixDigest, u128)> {
            digests
                .iter()
                .copied()
                .zip(prefix_digests(digests))
                .zip(keys(digests.len()))
                .map(|((d, p), k)| (d, p, k))
                .collect()
        };
        let mut state = ConversationState::default();
        let (prefix, same) = state.prefixes_of(&digests);
        assert_eq!((&prefix, same), (&prefix_digests(&digests), 0));
        state.keep_chain(same, &digests, &prefix, &keys(6));
        assert_eq!(state.last_chain, chain(&digests));
        // The next request repeats four messages and then differs.
        let mut next = digests[..4].to_vec();
        next.push(message_digest(
            &serde_json::json!({"role": "user", "content": "new"}),
        ));
        let (prefix, same) = state.prefixes_of(&next);
        assert_eq!((&prefix, same), (&prefix_digests(&next), 4));
        state.keep_chain(same, &next[same..], &prefix, &keys(5));
        assert_eq!(state.last_chain, chain(&next));
        // A chain digest mapped onto a logged form among the repeated ones is kept too.
        let mut mapped = prefix.clone();
        mapped[1] = prefix[3];
        state.keep_chain(same, &next[same..], &mapped, &keys(5));
        assert_eq!(state.last_chain[1], (next[1], prefix[3], 1));
        assert_eq!(state.last_chain[4], (next[4], prefix[4], 4));
    }

    fn reply(message: &str) -> CapturedReply {
        CapturedReply {
            message: serde_json::value::RawValue::from_string(message.to_owned()).unwrap(),
            finish_reason: None,
            choice: 0,
        }
    }

    /// Reads `raw` as a request message whose role no one may ask for: it succeeds
    /// only when the facts of these bytes are already cached.
    fn cached(dialect: DialectKind, raw: &str) -> Option<MessageDigest> {
        let refuse = |_: &Value| Err(crate::dialect::DialectError::MissingRole { index: 0 });
        Message::read(RawMessage::from(raw.to_owned()), dialect, refuse)
            .ok()
            .map(|m| m.digest())
    }

    #[test]
    fn a_reply_is_parsed_once_and_its_byte_for_byte_echo_finds_it() {
        let chat = r#"{"role":"assistant","content":"reply digests, chat 7f3a"}"#;
        let item = r#"{"type":"function_call","call_id":"c-7f3a","name":"ls","arguments":"{}"}"#;
        for (dialect, raw) in [
            (DialectKind::OpenAiChat, chat),
            (DialectKind::Responses, item),
        ] {
            assert_eq!(cached(dialect, raw), None, "{raw} must not be cached yet");
            let facts = reply_digests(dialect, &reply(raw)).unwrap();
            let value: Value = serde_json::from_str(raw).unwrap();
            assert_eq!(facts.digest, message_digest(&value));
            assert_eq!(facts.echo, echo_digest(&value));
            assert_eq!(cached(dialect, raw), Some(facts.digest), "{raw}");
        }
    }

    #[test]
    fn a_reply_no_request_could_carry_is_digested_but_not_cached() {
        // No role: a request carrying it is refused, so the cache must not vouch for it.
        let raw = r#"{"content":"a reply without a role, 7f3a"}"#;
        let facts = reply_digests(DialectKind::OpenAiChat, &reply(raw)).unwrap();
        assert_eq!(
            facts.digest,
            message_digest(&serde_json::from_str(raw).unwrap())
        );
        assert!(
            Message::from_raw(0, RawMessage::from(raw.to_owned()), DialectKind::OpenAiChat)
                .is_err()
        );
    }
}
