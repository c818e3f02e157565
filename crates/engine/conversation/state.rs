//! What the tracker remembers of one conversation: its known prefixes, pinned sets,
//! echo and turn forms, adopted compactions and calibration, and how it is rebuilt
//! from a log.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_lock::{Mutex, MutexGuard};
use serde_json::Value;

use crate::adoption::{adopt, Adopted};
use crate::base::calibration::Calibration;
use crate::base::chunks::keyed_hash;
use crate::base::digest::{next_prefix, pinned_digest, Digest, MessageDigest, PrefixDigest};
use crate::base::line::{pinned_slot, Entry, RequestLine};
use crate::dialect::echo::{echo_digest, reference_digest, turn_forms};
use crate::dialect::{DialectKind, Message};
use crate::store::ConversationLog;

/// Where a request continues after a provider compaction ([`super::Tracker::across_compaction`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Across {
    /// The conversation whose reply minted the artefact.
    pub id: crate::base::id::ConversationId,
    /// The logged artefact's parent: the request's items from the artefact on follow it.
    pub base: Option<PrefixDigest>,
    /// The artefact's index in the request's messages: what the client re-sent before
    /// it (its instructions, the user turns a compaction keeps), and a standalone item
    /// itself, are logged as its pinned set, the provider's to keep, never handoff's
    /// to compact.
    pub at: usize,
}

/// What the tracker remembers of one conversation.
#[derive(Debug, Default)]
pub struct ConversationState {
    /// Every prefix digest already in the log, with the keyed hash of the bytes its
    /// message was last sent in ([`Message::bytes_key`]): the logged original, or the
    /// form a later request carried. [`UNKNOWN_FORM`] when a shared store's other
    /// replica changed it in a way this one could not follow.
    pub(super) known: HashMap<PrefixDigest, u128>,
    /// Every pinned set already in the log, with the keyed hash of the bytes each of
    /// its messages was last sent in.
    pub(super) pinned: HashMap<Digest, Box<[u128]>>,
    /// The forms in the log (`form` lines), by the digest of their bytes, with their
    /// keyed hash: a form is written once.
    pub(super) forms: HashMap<Digest, u128>,
    /// How many times a request changed the form of a message logged before it: the
    /// latest chain's keys stand for the messages' forms while it is unchanged.
    pub(super) form_changes: u64,
    /// `form_changes` when the latest chain was kept.
    pub(super) chain_changes: u64,
    /// Logged messages that clients echo in other forms: `next_prefix(parent, echo digest)`
    /// to the logged message digest and prefix digest.
    pub(super) echoes: HashMap<PrefixDigest, (MessageDigest, PrefixDigest)>,
    /// Logged turns (a request's last user message) by the shorter forms a client
    /// re-sends once they are history (`next_prefix(parent, turn form)`), as `echoes`.
    pub(super) turns: HashMap<PrefixDigest, (MessageDigest, PrefixDigest)>,
    /// Adopted compactions by covered prefix.
    pub(super) compactions: HashMap<PrefixDigest, Arc<Adopted>>,
    /// The last upstream-reported input size and its local estimate.
    pub(super) calibration: Option<Calibration>,
    /// What the upstream counted for the latest reply: its request's input and its
    /// output (see [`crate::conversation::Tracked::held`]).
    pub(super) held: Option<u64>,
    /// The latest root request's message digests, their chain digests and the keyed
    /// hashes of their bytes: the next request repeats most of them, and reuses their
    /// chain instead of rehashing it.
    pub(super) last_chain: Vec<(MessageDigest, PrefixDigest, u128)>,
    /// The latest pinned messages' digests and the digest of their set.
    pub(super) last_pinned: Option<(Vec<MessageDigest>, Digest)>,
    /// A shared store's position of the last line folded in: what other replicas
    /// wrote after it is read on demand.
    pub(super) seen: u64,
    /// The originals the latest request logged and the replies to it, as the bases of
    /// the forms the next request is likely to re-send them in.
    pub(super) recent: Vec<(PrefixDigest, Box<str>)>,
    /// The latest request line's head, pinned set and floated places, with
    /// `form_changes` then: a request equal to it in all four repeats it byte for byte.
    pub(super) last_request: Option<LastRequest>,
}

/// What makes a request of known messages a repeat of the latest request line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LastRequest {
    pub head: Option<PrefixDigest>,
    pub pinned: Option<Digest>,
    pub floated: Vec<usize>,
    pub form_changes: u64,
}

/// The bytes of recent originals a conversation keeps; a larger one's forms are
/// written whole.
const RECENT_BYTES: usize = 1 << 20;

impl ConversationState {
    /// The logged original at `digest`, if it is a recent one.
    pub(super) fn recent_original(&self, digest: &PrefixDigest) -> Option<&str> {
        self.recent
            .iter()
            .find(|(d, _)| d == digest)
            .map(|(_, text)| &**text)
    }

    /// Keeps `text`, just logged at `digest`, as a recent original; `fresh` starts the
    /// set over (a request that logged new messages).
    pub(super) fn keep_recent(&mut self, digest: PrefixDigest, text: &str, fresh: bool) {
        if fresh {
            self.recent.clear();
        }
        let held: usize = self.recent.iter().map(|(_, t)| t.len()).sum();
        if held + text.len() <= RECENT_BYTES {
            self.recent.push((digest, text.into()));
        }
    }
}

impl ConversationState {
    /// The chain digests of `digests` from the root, reusing the latest request's
    /// where its messages are the same; and how many leading ones are.
    pub(super) fn prefixes_of(&self, digests: &[MessageDigest]) -> (Vec<PrefixDigest>, usize) {
        let same = digests
            .iter()
            .zip(&self.last_chain)
            .take_while(|(digest, (last, _, _))| *digest == last)
            .count();
        let mut prefix: Vec<PrefixDigest> = Vec::with_capacity(digests.len());
        prefix.extend(self.last_chain[..same].iter().map(|(_, p, _)| *p));
        for digest in &digests[same..] {
            let next = next_prefix(prefix.last(), digest);
            prefix.push(next);
        }
        (prefix, same)
    }

    /// Keeps a request's chain for the next one: its first `same` messages are the
    /// last chain's (their chain digests as `prefix` now has them), then `tail`; `keys`
    /// are every message's bytes keys. In place, so a long conversation's growing
    /// chain is not rebuilt every turn.
    pub(super) fn keep_chain(
        &mut self,
        same: usize,
        tail: &[MessageDigest],
        prefix: &[PrefixDigest],
        keys: &[u128],
    ) {
        self.last_chain.truncate(same);
        for ((entry, digest), key) in self.last_chain.iter_mut().zip(prefix).zip(keys) {
            entry.1 = *digest;
            entry.2 = *key;
        }
        let rest = prefix.get(same..).unwrap_or_default();
        let rest_keys = keys.get(same..).unwrap_or_default();
        self.last_chain.extend(
            tail.iter()
                .zip(rest)
                .zip(rest_keys)
                .map(|((d, p), k)| (*d, *p, *k)),
        );
        // Its keys describe the forms only once its request's forms are written.
        self.chain_changes = u64::MAX;
    }

    /// The digest of the pinned set with these message digests, computed only when
    /// the set changed.
    pub(super) fn pinned_set(&mut self, pinned: &[Message]) -> Option<Digest> {
        if pinned.is_empty() {
            return None;
        }
        let digests: Vec<MessageDigest> = pinned.iter().map(Message::digest).collect();
        if let Some((last, set)) = &self.last_pinned {
            if *last == digests {
                return Some(*set);
            }
        }
        let set = pinned_digest(&pinned.iter().map(Message::value).collect::<Vec<_>>());
        self.last_pinned = Some((digests, set));
        Some(set)
    }
}

/// Which logged messages keep their text when tracking reads a log back: those whose
/// echo forms a restarted tracker needs.
pub(super) fn keeps_text(raw: &str) -> bool {
    crate::dialect::any_marker(raw, crate::dialect::MarkerKind::Indexed)
}

/// True when a form line of `log` is an edit of its original.
fn has_edits(log: &ConversationLog) -> bool {
    log.lines
        .iter()
        .any(|line| matches!(&line.entry, Entry::Form(form) if form.edit.is_some()))
}

/// The form of a message whose bytes this process does not know: no request's
/// bytes have this keyed hash in practice, so the next one names its form.
pub(super) const UNKNOWN_FORM: u128 = 0;

/// What a logged turn must contain to have shorter forms ([`turn_forms`]): a blank
/// line, as escaped in its JSON.
const TURN_HINT: &str = "\\n\\n";

/// A conversation's cached state.
#[derive(Debug, Default)]
pub struct ConversationEntry {
    /// The state; held only for short, non-blocking work. `async-lock`'s mutex, not
    /// tokio's: tokio's hands a released lock to the first queued task, which holds it
    /// until its worker wakes up to run it, and meanwhile every request of the
    /// conversation on a running worker finds it taken and queues too. Requests of one
    /// conversation on two workers formed that convoy under load. This one lets a
    /// running task take a released lock (fair again after 0.5 ms of starvation).
    state: Mutex<ConversationState>,
    /// The state's size in bytes when it was last weighed, for the cache's weigher
    /// (which cannot take the lock).
    pub(super) weight: std::sync::atomic::AtomicU32,
}

/// How long a contended state is retried in place, with other threads serving, before
/// the task parks: a holder on another worker that only reads or checks the state lets
/// go well within it, and parking costs both workers a wake-up across threads.
const SPIN: Duration = Duration::from_micros(2);

impl ConversationEntry {
    pub(super) fn new(state: ConversationState) -> Self {
        let weight = state.weight();
        Self {
            state: Mutex::new(state),
            weight: weight.into(),
        }
    }

    /// Locks the state: at once when it is free, after a short spin when another
    /// worker holds it briefly, else in the lock's queue.
    pub async fn lock(&self) -> MutexGuard<'_, ConversationState> {
        // With one thread the holder is a task of this thread: spinning cannot help.
        self.lock_spinning(crate::worker::parallel()).await
    }

    async fn lock_spinning(&self, spin: bool) -> MutexGuard<'_, ConversationState> {
        if let Some(guard) = self.state.try_lock() {
            return guard;
        }
        if spin {
            let started = Instant::now();
            while started.elapsed() < SPIN {
                std::hint::spin_loop();
                if let Some(guard) = self.state.try_lock() {
                    return guard;
                }
            }
        }
        self.state.lock().await
    }
}

impl ConversationState {
    /// About how many bytes the state holds: what the tracking cache is weighed in.
    pub(super) fn weight(&self) -> u32 {
        // A digest is 32 bytes; a hash set slot about as much again.
        let recent: usize = self.recent.iter().map(|(_, t)| t.len() + 48).sum();
        let digests = recent
            + self.known.len() * 80
            + self.pinned.len() * 64
            + self.forms.len() * 80
            + (self.echoes.len() + self.turns.len()) * 128
            + self.last_chain.len() * 64;
        let records: usize = self
            .compactions
            .values()
            .map(|a| a.handoff.get().len() + a.continuation.get().len() + 512)
            .sum();
        u32::try_from(digests + records + 256).unwrap_or(u32::MAX)
    }
}

impl ConversationState {
    /// Remembers a logged message's echo forms, if it has any.
    pub(super) fn remember_echo(
        &mut self,
        parent: Option<PrefixDigest>,
        echo: Option<MessageDigest>,
        message_digest: MessageDigest,
        digest: PrefixDigest,
    ) {
        if let Some(echo) = echo {
            self.echoes
                .entry(next_prefix(parent.as_ref(), &echo))
                .or_insert((message_digest, digest));
        }
    }

    /// Remembers the shorter forms of a logged turn ([`turn_forms`]).
    pub(super) fn remember_turn(
        &mut self,
        parent: Option<PrefixDigest>,
        message: &Value,
        message_digest: MessageDigest,
        digest: PrefixDigest,
    ) {
        for form in turn_forms(message) {
            self.turns
                .entry(next_prefix(parent.as_ref(), &form))
                .or_insert((message_digest, digest));
        }
    }

    /// True when `next` (with digest `next_digest`) is logged after the prefix `at`, in
    /// its own form or an echoed one.
    pub(super) fn continues(
        &self,
        at: PrefixDigest,
        next: &Message,
        next_digest: &MessageDigest,
    ) -> bool {
        self.known
            .contains_key(&next_prefix(Some(&at), next_digest))
            || next
                .echo_digest()
                .and_then(|echo| self.echoes.get(&next_prefix(Some(&at), &echo)))
                .is_some()
    }

    /// Where a request that continues after the provider compaction `across` starts
    /// its chain: how many of its messages are its pinned set, and the prefix the rest
    /// follows. A standalone compaction item (Responses') is pinned with what the client
    /// kept before it, so the chain goes on after it and handoff may compact what
    /// follows, the item kept first; a message that carries a compaction block among
    /// others (Anthropic's) stays in the chain, after its parent, with its blocks.
    pub(super) fn after_artefact(
        &self,
        messages: &[Message],
        across: &Across,
    ) -> (usize, Option<PrefixDigest>) {
        let Some(artefact) = messages.get(across.at) else {
            return (across.at, across.base);
        };
        let standalone = artefact.item_type().is_some_and(|kind| kind != "message");
        if standalone && across.at + 1 < messages.len() {
            let mut digest = [artefact.digest()];
            let mut prefix = [next_prefix(across.base.as_ref(), &digest[0])];
            let artefact = std::slice::from_ref(artefact);
            if self.known_prefix(artefact, &mut digest, &mut prefix, across.base) == 1 {
                return (across.at + 1, Some(prefix[0]));
            }
        }
        (across.at, across.base)
    }

    /// How many leading messages of `messages` (the first after `base`) are logged,
    /// mapping echoed forms of logged messages onto them (which rewrites `digests` and `prefix` in place).
    /// A shorter form of a logged turn maps onto it only when what was logged after
    /// the turn follows it too: a turn edited and asked again is a new message.
    pub(super) fn known_prefix(
        &self,
        messages: &[Message],
        digests: &mut [MessageDigest],
        prefix: &mut [PrefixDigest],
        base: Option<PrefixDigest>,
    ) -> usize {
        let mut known = prefix.partition_point(|d| self.known.contains_key(d));
        while let Some(message) = messages.get(known) {
            let parent = known.checked_sub(1).map(|p| prefix[p]).or(base);
            // Echo digests are facts: computed once per distinct message.
            let echo = message.echo_digest();
            let logged = echo
                .and_then(|echo| self.echoes.get(&next_prefix(parent.as_ref(), &echo)))
                // Only onto a form already in the log, never one still being written.
                .filter(|(_, logged_prefix)| self.known.contains_key(logged_prefix))
                .or_else(|| {
                    let (next, next_digest) =
                        messages.get(known + 1).zip(digests.get(known + 1))?;
                    echo.and_then(|echo| self.turns.get(&next_prefix(parent.as_ref(), &echo)))
                        .filter(|(_, logged_prefix)| self.known.contains_key(logged_prefix))
                        .filter(|(_, logged_prefix)| {
                            self.continues(*logged_prefix, next, next_digest)
                        })
                });
            let Some(&(logged_digest, logged_prefix)) = logged else {
                break;
            };
            digests[known] = logged_digest;
            prefix[known] = logged_prefix;
            for i in known + 1..prefix.len() {
                prefix[i] = next_prefix(Some(&prefix[i - 1]), &digests[i]);
            }
            // The logged form may not be known yet (another request's append of it is
            // still in flight): no progress, so stop rather than spin.
            let advanced = prefix[known..].partition_point(|d| self.known.contains_key(d));
            if advanced == 0 {
                break;
            }
            known += advanced;
        }
        known
    }

    /// Moves each message a logged request carried in another form to that form;
    /// `parents` links the log's messages, for the places of its inline forms.
    fn follow_forms(
        &mut self,
        request: &RequestLine,
        parents: &HashMap<PrefixDigest, Option<PrefixDigest>>,
    ) {
        self.follow_inline_forms(request, parents);
        for (slot, form) in &request.forms {
            let key = self.forms.get(form).copied().unwrap_or(UNKNOWN_FORM);
            if let Some(current) = self.known.get_mut(slot) {
                *current = key;
            } else if let Some(keys) = request.pinned.and_then(|set| {
                let keys = self.pinned.get_mut(&set)?;
                let index = (0..keys.len()).find(|j| pinned_slot(&set, *j) == *slot)?;
                keys.get_mut(index)
            }) {
                *keys = key;
            }
            self.form_changes += 1;
        }
    }

    /// [`Self::follow_forms`] of the forms a request line holds inline, by their place
    /// in the list it carried: the pinned set's messages, then the branch's.
    fn follow_inline_forms(
        &mut self,
        request: &RequestLine,
        parents: &HashMap<PrefixDigest, Option<PrefixDigest>>,
    ) {
        if request.inline_forms.is_empty() {
            return;
        }
        // The messages it carried, from its head back: all of its branch, or its last
        // `carried`. A catch-up reads only what other replicas wrote since, so the
        // walk goes on along the chain this replica last saw.
        let want = request.carried;
        let mut back = Vec::new();
        let mut step = request.head;
        let complete = loop {
            let Some(digest) = step else {
                break true;
            };
            back.push(digest);
            if want.is_some_and(|carried| back.len() >= carried) {
                break true;
            }
            match parents.get(&digest) {
                Some(parent) => step = *parent,
                None => match self.last_chain.iter().position(|(_, p, _)| *p == digest) {
                    Some(i) => {
                        back.extend(self.last_chain[..i].iter().rev().map(|(_, p, _)| *p));
                        back.truncate(want.unwrap_or(back.len()));
                        break true;
                    }
                    None => break false,
                },
            }
        };
        // The pinned set's messages come first in the list, when it had one.
        let pinned = match request.pinned {
            Some(set) => self.pinned.get(&set).map(|keys| Some((set, keys.len()))),
            None => Some(None),
        };
        let (Some(pinned), true) = (pinned, complete) else {
            // Places it cannot resolve: the next request that sends these forms writes
            // them again, which costs bytes, never a wrong record.
            self.form_changes += request.inline_forms.len() as u64;
            return;
        };
        back.reverse();
        let pinned_len = pinned.map_or(0, |(_, len)| len);
        for (at, bytes) in &request.inline_forms {
            let key = keyed_hash(bytes.get().as_bytes());
            if let Some((set, _)) = pinned.filter(|_| *at < pinned_len) {
                if let Some(current) = self.pinned.get_mut(&set).and_then(|k| k.get_mut(*at)) {
                    *current = key;
                }
            } else if let Some(slot) = back.get(at - pinned_len) {
                self.known.insert(*slot, key);
            }
            self.form_changes += 1;
        }
    }

    /// Rebuilds the state from a log read from the store.
    pub(crate) fn from_log(log: &ConversationLog) -> Self {
        let mut state = Self::default();
        state.absorb(log);
        state
    }

    /// Folds in lines and records read from the store; reading a line twice is harmless.
    pub(super) fn absorb(&mut self, log: &ConversationLog) {
        let state = self;
        state.seen = state.seen.max(log.last_seq);
        let heads: HashSet<PrefixDigest> = log
            .lines
            .iter()
            .filter_map(|line| match &line.entry {
                Entry::Request(request) => request.head,
                _ => None,
            })
            .collect();
        let edits = has_edits(log);
        let originals: HashMap<PrefixDigest, &str> = log
            .lines
            .iter()
            .filter(|_| edits)
            .filter_map(|line| match &line.entry {
                Entry::Message(message) => Some((message.digest, message.message.get())),
                _ => None,
            })
            .collect();
        // The links of the branches, only for a log whose requests hold forms inline.
        let inline = log
            .lines
            .iter()
            .any(|line| matches!(&line.entry, Entry::Request(r) if !r.inline_forms.is_empty()));
        let parents: HashMap<PrefixDigest, Option<PrefixDigest>> = log
            .lines
            .iter()
            .filter(|_| inline)
            .filter_map(|line| match &line.entry {
                Entry::Message(message) => Some((message.digest, message.parent)),
                _ => None,
            })
            .collect();
        let mut calibrating = Calibrating::default();
        for line in &log.lines {
            calibrating.follow(&line.entry, state);
            match &line.entry {
                Entry::Message(message) => {
                    let raw = message.message.get();
                    let key = log
                        .text_keys
                        .get(&message.digest)
                        .copied()
                        .unwrap_or_else(|| keyed_hash(raw.as_bytes()));
                    // A line read again must not undo a form a later request set.
                    state.known.entry(message.digest).or_insert(key);
                    // Only a message that may have echo forms is parsed again.
                    let turn = heads.contains(&message.digest) && raw.contains(TURN_HINT);
                    if turn || crate::dialect::any_marker(raw, crate::dialect::MarkerKind::Echoed) {
                        if let Ok(value) = serde_json::from_str::<Value>(raw) {
                            for echo in [echo_digest(&value), reference_digest(&value)] {
                                state.remember_echo(
                                    message.parent,
                                    echo,
                                    message.message_digest,
                                    message.digest,
                                );
                            }
                            if turn {
                                state.remember_turn(
                                    message.parent,
                                    &value,
                                    message.message_digest,
                                    message.digest,
                                );
                            }
                        }
                    }
                }
                Entry::Pinned(pinned) => {
                    state.pinned.entry(pinned.digest).or_insert_with(|| {
                        pinned
                            .messages
                            .iter()
                            .map(|m| keyed_hash(m.get().as_bytes()))
                            .collect()
                    });
                }
                Entry::Form(form) => {
                    // An edit rebuilds from its original's text, which an index read
                    // may have dropped: then the next request names the form again.
                    let original = form
                        .of
                        .and_then(|of| originals.get(&of).copied())
                        .filter(|text| *text != "null");
                    let key = form
                        .bytes(original)
                        .map_or(UNKNOWN_FORM, |bytes| keyed_hash(bytes.as_bytes()));
                    state.forms.insert(form.digest, key);
                }
                Entry::Request(request) => {
                    state.follow_forms(request, &parents);
                    state.last_request = Some(LastRequest {
                        head: request.head,
                        pinned: request.pinned,
                        floated: request.floated.clone(),
                        form_changes: state.form_changes,
                    });
                }
                Entry::CompactBoundary(_)
                | Entry::Rescue(_)
                | Entry::Adopt(_)
                | Entry::Decision(_)
                | Entry::StandIn(_) => {}
            }
        }
        let adoption = adopt(log);
        for problem in &adoption.problems {
            tracing::warn!(problem = %problem, "compaction not adopted; run `handoff audit verify`");
        }
        for (prefix, record) in adoption.adopted {
            if state.compactions.contains_key(&prefix) {
                continue;
            }
            match Adopted::new(record) {
                Ok(adopted) => {
                    state.compactions.insert(prefix, Arc::new(adopted));
                }
                Err(err) => tracing::warn!(error = %err, "compaction record unusable"),
            }
        }
        // A prepared record a request adopted (here or on another replica) is taken.
        for line in &log.lines {
            if let Entry::Adopt(adopt) = &line.entry {
                let taken = state
                    .compactions
                    .values()
                    .find(|a| a.record.id == adopt.compact_id);
                if let Some(adopted) = taken {
                    adopted.take();
                }
            }
        }
    }
}

/// The calibration a log supports, read as it goes: the local count a decision
/// logged, and the usage the reply to that request reported. A restarted proxy counts
/// as the upstream does from its first request, not from its first reply.
#[derive(Default)]
struct Calibrating {
    /// The latest request's model and dialect.
    request: Option<(String, DialectKind)>,
    /// The latest decision's head, local count and compaction.
    decided: Option<(Option<PrefixDigest>, u64, Option<String>)>,
}

impl Calibrating {
    fn follow(&mut self, entry: &Entry, state: &mut ConversationState) {
        match entry {
            Entry::Request(request) => {
                let dialect = DialectKind::from_name(request.dialect.as_deref());
                self.request = Some((request.model.clone(), dialect));
            }
            Entry::Decision(decision) => {
                self.decided = decision
                    .local
                    .map(|local| (decision.head, local, decision.compaction.clone()));
            }
            Entry::Message(reply) if reply.source == crate::base::line::Source::Upstream => {
                let Some((head, local, compaction)) = self.decided.take() else {
                    return;
                };
                let edited = serde_json::from_str::<serde_json::Value>(reply.message.get())
                    .is_ok_and(|value| super::counts_upstream_edits(&value, reply.usage.as_ref()));
                let answered = head == reply.parent && reply.complete != Some(false) && !edited;
                let server = match (&self.request, &reply.usage) {
                    (Some((_, dialect)), Some(usage)) if answered => {
                        dialect.get().input_tokens(usage)
                    }
                    _ => None,
                };
                if let (Some(server), Some((model, _))) = (server, &self.request) {
                    let measured = Calibration::new(model.clone(), compaction, local, server);
                    state.calibration = Some(measured.after(state.calibration.as_ref()));
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;
    use crate::base::digest::bytes_digest;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_held_state_is_waited_for_past_the_spin_and_every_change_is_kept() {
        let entry = Arc::new(ConversationEntry::new(ConversationState::default()));
        // Free: taken at once, spinning or not.
        entry.lock_spinning(true).await.last_chain.clear();
        entry.lock_spinning(false).await.last_chain.clear();

        // Held far longer than the spin while a task on another thread wants it: the
        // waiter parks, then gets the state with the holder's change in it.
        let mut held = entry.lock_spinning(true).await;
        let waiter = {
            let entry = Arc::clone(&entry);
            tokio::spawn(async move { entry.lock_spinning(true).await.known.len() })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the waiter took a held state");
        held.known.insert(bytes_digest(b"a prefix"), 0);
        drop(held);
        assert_eq!(
            waiter.await.unwrap(),
            1,
            "the waiter saw the holder's change"
        );
    }
}
