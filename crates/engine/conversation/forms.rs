//! Which form of each logged message a request carried: the bytes the client sent
//! when they differ from the form its message last had in the log.
//!
//! Tracking maps a re-sent message onto the logged one (an echo form, a turn without
//! its reminder, the same JSON in other bytes), so the chain and the branches stay
//! one. What the client sent is kept beside it, so `audit replay` rebuilds every
//! request byte for byte, in whichever way is shorter on disk: inside the request line
//! (its place in the list and its bytes), or as a `form` line (once per distinct form,
//! whole or as one edit of its original) that the request line names with two digests.
//! Either way a form costs little more than the bytes the client sent for it.

use super::state::ConversationState;
use crate::base::digest::{bytes_digest, Digest, PrefixDigest};
use crate::base::line::{edit_between, pinned_slot, Entry, FormLine, Line};
use crate::dialect::Message;

/// About what a `form` line costs over the bytes it holds: its kind, version, time,
/// two digests and an edit's offsets.
const FORM_LINE_OVERHEAD: usize = 220;

/// What naming a form in the request line's `forms` costs: two digests.
const NAMED_FORM: usize = 136;

/// What a form inside the request line costs over its bytes: its place and brackets.
const INLINE_OVERHEAD: usize = 10;

/// The forms a request carried that the log does not yet name for its messages.
#[derive(Default)]
pub(super) struct FormChanges {
    /// `form` lines for forms not yet in the log.
    pub lines: Vec<Line>,
    /// The request line's `forms`: each changed message's slot and its form.
    pub entries: Vec<(PrefixDigest, Digest)>,
    /// The request line's `inline_forms`: each changed message's place in the list and
    /// its bytes.
    pub inline: Vec<(usize, Box<serde_json::value::RawValue>)>,
    /// The keyed hash each changed slot's form has now, to apply once written.
    keys: Vec<(Slot, u128)>,
    /// The new forms and their keyed hashes, to remember once written.
    new_forms: Vec<(Digest, u128)>,
}

/// Where a message's current form is kept.
#[derive(Clone, Copy)]
enum Slot {
    /// A non-pinned message, by its chain digest.
    Chain(PrefixDigest),
    /// The `index`th message of a pinned set.
    Pinned(Digest, usize),
}

impl FormChanges {
    /// True when the request carried every message in its current form.
    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.inline.is_empty()
    }

    /// Notes that the message at `slot` (named `named` on disk), the `at`th of the list
    /// the request carried, was sent as `message`: named as a `form` line's when one
    /// is logged or costs less than the bytes, else written inline.
    fn change(
        &mut self,
        state: &ConversationState,
        (slot, at): (Slot, usize),
        named: PrefixDigest,
        message: &Message,
    ) {
        let key = message.bytes_key();
        self.keys.push((slot, key));
        let sent = message.raw.get();
        let inline = sent.len() + INLINE_OVERHEAD;
        let form = bytes_digest(sent.as_bytes());
        let logged = state.forms.contains_key(&form)
            || self.new_forms.iter().any(|(digest, _)| *digest == form);
        if logged && NAMED_FORM < inline {
            self.entries.push((named, form));
            return;
        }
        // Most forms differ from their original in one place (a moved breakpoint, a
        // reminder, a newline): a `form` line holds that edit when the original is at
        // hand and a long message makes the line worth its digests.
        let edit = match slot {
            Slot::Chain(digest) if !logged => state.recent_original(&digest),
            _ => None,
        }
        .map(|original| edit_between(original, sent))
        .filter(|(_, _, insert)| insert.len() + FORM_LINE_OVERHEAD + NAMED_FORM < inline);
        let Some(edit) = edit else {
            self.inline.push((at, message.raw.to_raw_value()));
            return;
        };
        self.lines.push(Line::now(Entry::Form(FormLine {
            digest: form,
            of: matches!(slot, Slot::Chain(_)).then_some(named),
            message: None,
            edit: Some(edit),
        })));
        self.new_forms.push((form, key));
        self.entries.push((named, form));
    }
}

impl ConversationState {
    /// The messages of a request that it carried in another form than the log holds
    /// for them: among the pinned messages of a set already logged, and among the
    /// first `known` of `rest` (logged before, at `prefix`; `keys` their bytes keys).
    /// `same` leading messages repeat the latest chain (its digests), whose keys
    /// describe their forms when `chain` (a request from the root).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn form_changes(
        &self,
        pinned: &[Message],
        pinned_set: Option<Digest>,
        rest: &[Message],
        (prefix, keys): (&[PrefixDigest], &[u128]),
        known: usize,
        same: usize,
        chain: bool,
    ) -> FormChanges {
        let mut changes = FormChanges::default();
        if let Some(keys) = pinned_set.and_then(|set| Some((set, self.pinned.get(&set)?))) {
            let (set, keys) = keys;
            for (index, message) in pinned.iter().enumerate() {
                if keys.get(index) != Some(&message.bytes_key()) {
                    let slot = pinned_slot(&set, index);
                    changes.change(self, (Slot::Pinned(set, index), index), slot, message);
                }
            }
        }
        // The latest chain's keys are the forms of its messages until a request
        // changes one: most of a request is the previous one's, compared without a
        // lookup. Its first `same` chain digests are this request's.
        let last = if chain && self.chain_changes == self.form_changes {
            self.last_chain.as_slice()
        } else {
            &[]
        };
        let repeated = same.min(last.len()).min(known);
        for index in 0..known {
            let (key, slot) = (keys[index], prefix[index]);
            let unchanged = if index < repeated {
                last[index].2 == key
            } else {
                last.get(index)
                    .is_some_and(|(_, at, last_key)| *at == slot && *last_key == key)
            };
            if !unchanged && self.known.get(&slot) != Some(&key) {
                let at = pinned.len() + index;
                changes.change(self, (Slot::Chain(slot), at), slot, &rest[index]);
            }
        }
        changes
    }

    /// Makes written `changes` the messages' current forms.
    pub(super) fn apply_forms(&mut self, changes: FormChanges) {
        self.forms.extend(changes.new_forms);
        for (slot, key) in changes.keys {
            match slot {
                Slot::Chain(digest) => {
                    self.known.insert(digest, key);
                }
                Slot::Pinned(set, index) => {
                    if let Some(current) = self.pinned.get_mut(&set).and_then(|k| k.get_mut(index))
                    {
                        *current = key;
                    }
                }
            }
            self.form_changes += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::audit::{sent_requests, Forms, Tree};
    use crate::base::line::Entry;
    use crate::base::reply::CapturedReply;
    use crate::conversation::{CapturedReplies, ConversationId, Tracker};
    use crate::dialect::{ChatRequest, DialectKind};
    use crate::store::{MemoryStore, Store};
    use crate::tenant::TenantId;

    fn id() -> ConversationId {
        ConversationId::parse(TenantId::legacy(), "forms").unwrap()
    }

    /// A body whose `messages` are exactly `messages`' bytes, joined.
    fn body(dialect: DialectKind, messages: &[&str]) -> Vec<u8> {
        let field = dialect.get().list_field();
        format!(r#"{{"model":"m","{field}":[{}]}}"#, messages.join(",")).into_bytes()
    }

    async fn send(tracker: &Tracker, dialect: DialectKind, messages: &[&str]) {
        let request = dialect.get().parse(&body(dialect, messages)).unwrap();
        tracker.track(id(), &request).await.unwrap();
    }

    async fn answer(tracker: &Tracker, dialect: DialectKind, sent: &[&str], replies: &[&str]) {
        let request: ChatRequest = dialect.get().parse(&body(dialect, sent)).unwrap();
        let tracked = tracker.track(id(), &request).await.unwrap();
        let batch = CapturedReplies {
            dialect,
            parent: tracked.prefix.last().copied(),
            model: "m".into(),
            usage: None,
            calibration: None,
            replies: replies
                .iter()
                .map(|r| CapturedReply {
                    message: serde_json::value::RawValue::from_string((*r).to_owned()).unwrap(),
                    finish_reason: None,
                    choice: 0,
                })
                .collect(),
            sequence: dialect == DialectKind::Responses,
            response_id: None,
            conversation: None,
            incomplete: None,
            decision: None,
        };
        tracker.record_replies(&id(), batch).await.unwrap();
    }

    /// Every request of the log rebuilt, each message's bytes as text.
    async fn rebuilt(store: &dyn Store) -> Vec<(Vec<String>, Vec<String>)> {
        let log = store.read(&id()).await.unwrap();
        let tree = Tree::new(&log);
        let forms = Forms::read(&log, &tree);
        assert!(forms.problems.is_empty(), "{:?}", forms.problems);
        sent_requests(&log, &tree, &forms)
            .into_iter()
            .map(|r| {
                let r = r.unwrap();
                let text = |m: &[&serde_json::value::RawValue]| {
                    m.iter().map(|m| m.get().to_owned()).collect()
                };
                (text(&r.messages), text(&r.reply))
            })
            .collect()
    }

    /// Forms written: `form` lines, and forms inside request lines.
    fn forms_written(log: &crate::store::ConversationLog) -> usize {
        log.lines
            .iter()
            .map(|l| match &l.entry {
                Entry::Form(_) => 1,
                Entry::Request(request) => request.inline_forms.len(),
                _ => 0,
            })
            .sum()
    }

    #[tokio::test]
    async fn every_request_is_rebuilt_byte_for_byte_and_each_form_written_once() {
        let store = Arc::new(MemoryStore::default());
        let tracker = Tracker::new(store.clone(), 10);
        let chat = DialectKind::OpenAiChat;
        let system = r#"{"role":"system","content":"Be brief."}"#;
        let ask = r#"{"role":"user","content":"List files.\n\nReply in English."}"#;
        let call = r#"{"role":"assistant","content":"","tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{\"path\": \".\"}"}}]}"#;
        answer(&tracker, chat, &[system, ask], &[call]).await;
        // The client re-sends the turn without its reminder, the call with compact
        // arguments and `content: null`, and the system prompt in other key order.
        let system2 = r#"{"content":"Be brief.","role":"system"}"#;
        let ask2 = r#"{"role":"user","content":"List files."}"#;
        let call2 = r#"{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"ls","arguments":"{\"path\":\".\"}"}}]}"#;
        let result = r#"{"role":"tool","tool_call_id":"c1","content":"a.rs"}"#;
        let done = r#"{"role":"assistant","content":"a.rs\n"}"#;
        answer(&tracker, chat, &[system2, ask2, call2, result], &[done]).await;
        // Then the reply stripped, and the same forms again.
        let done2 = r#"{"role":"assistant","content":"a.rs"}"#;
        let next = r#"{"role":"user","content":"Thanks."}"#;
        send(&tracker, chat, &[system2, ask2, call2, result, done2, next]).await;

        let requests = rebuilt(store.as_ref()).await;
        assert_eq!(requests.len(), 3);
        assert_eq!(requests[0].0, [system, ask]);
        assert_eq!(requests[0].1, [call]);
        assert_eq!(requests[1].0, [system2, ask2, call2, result]);
        assert_eq!(requests[1].1, [done]);
        assert_eq!(requests[2].0, [system2, ask2, call2, result, done2, next]);
        let log = store.read(&id()).await.unwrap();
        assert_eq!(
            forms_written(&log),
            4,
            "system2, ask2, call2 and done2, once each"
        );
        // One conversation, one branch: the forms merged onto the logged messages.
        assert_eq!(Tree::new(&log).tips().len(), 1);

        // A regenerate from an earlier turn adds no message, but is a request of its
        // own; the same again is a retry, and writes nothing.
        send(&tracker, chat, &[system2, ask2, call2, result]).await;
        send(&tracker, chat, &[system2, ask2, call2, result]).await;
        let requests = rebuilt(store.as_ref()).await;
        assert_eq!(requests.len(), 4);
        assert_eq!(requests[3].0, [system2, ask2, call2, result]);

        // A tracker that starts from the log knows the forms: the same request again
        // with one more message writes no form.
        let again = Tracker::new(store.clone(), 10);
        let more = r#"{"role":"user","content":"And tests?"}"#;
        send(
            &again,
            chat,
            &[system2, ask2, call2, result, done2, next, more],
        )
        .await;
        let log = store.read(&id()).await.unwrap();
        assert_eq!(forms_written(&log), 4);
        let requests = rebuilt(store.as_ref()).await;
        assert_eq!(
            requests[4].0,
            [system2, ask2, call2, result, done2, next, more]
        );
    }

    #[tokio::test]
    async fn a_client_that_goes_back_to_the_logged_form_is_rebuilt_as_it_sent() {
        let store = Arc::new(MemoryStore::default());
        let tracker = Tracker::new(store.clone(), 10);
        let chat = DialectKind::Anthropic;
        let marked = r#"{"role":"user","content":[{"type":"text","text":"hi","cache_control":{"type":"ephemeral"}}]}"#;
        let plain = r#"{"role":"user","content":[{"type":"text","text":"hi"}]}"#;
        let reply = r#"{"role":"assistant","content":[{"type":"text","text":"hello"}]}"#;
        answer(&tracker, chat, &[marked], &[reply]).await;
        let q = r#"{"role":"user","content":"q"}"#;
        send(&tracker, chat, &[plain, reply, q]).await;
        send(&tracker, chat, &[marked, reply, q]).await;
        let requests = rebuilt(store.as_ref()).await;
        assert_eq!(requests.len(), 3, "{requests:?}");
        assert_eq!(requests[1].0, [plain, reply, q]);
        assert_eq!(requests[2].0, [marked, reply, q]);
    }

    #[tokio::test]
    async fn a_responses_session_with_references_and_bare_calls_is_one_branch() {
        let store = Arc::new(MemoryStore::default());
        let tracker = Tracker::new(store.clone(), 10);
        let responses = DialectKind::Responses;
        let mut input: Vec<String> = vec![r#"{"role":"user","content":"go"}"#.into()];
        for turn in 0..5 {
            let reasoning = format!(
                r#"{{"type":"reasoning","id":"rs_{turn}","summary":[],"encrypted_content":"e{turn}"}}"#
            );
            let call = format!(
                r#"{{"type":"function_call","id":"fc_{turn}","call_id":"c{turn}","name":"ls","arguments":"{{}}","status":"completed"}}"#
            );
            let sent: Vec<&str> = input.iter().map(String::as_str).collect();
            answer(&tracker, responses, &sent, &[&reasoning, &call]).await;
            // As the AI SDK re-sends them: the reasoning as a reference, the call
            // without `status` and with `id` last.
            input.push(format!(r#"{{"type":"item_reference","id":"rs_{turn}"}}"#));
            input.push(format!(
                r#"{{"type":"function_call","call_id":"c{turn}","name":"ls","arguments":"{{}}","id":"fc_{turn}"}}"#
            ));
            input.push(format!(
                r#"{{"type":"function_call_output","call_id":"c{turn}","output":"ok"}}"#
            ));
        }
        let sent: Vec<&str> = input.iter().map(String::as_str).collect();
        send(&tracker, responses, &sent).await;
        let log = store.read(&id()).await.unwrap();
        assert_eq!(Tree::new(&log).tips().len(), 1, "one branch");
        let requests = rebuilt(store.as_ref()).await;
        let last = &requests.last().unwrap().0;
        assert_eq!(last, &input);
    }
}
