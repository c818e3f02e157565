//! The log as a tree: branches, their tips, and the replayable history of a branch.

use std::collections::{HashMap, HashSet};

use serde_json::value::RawValue;

use crate::base::digest::{Digest, PrefixDigest};
use crate::base::line::{Entry, MessageLine, PinnedLine, RequestLine};
use crate::dialect::DialectKind;
use crate::store::ConversationLog;

/// Message lines by digest, plus the order they were written in.
pub struct Tree<'a> {
    by_digest: HashMap<PrefixDigest, &'a MessageLine>,
    order: Vec<&'a MessageLine>,
    pinned: HashMap<Digest, &'a PinnedLine>,
    requests: Vec<&'a RequestLine>,
}

impl<'a> Tree<'a> {
    /// Indexes a log.
    pub fn new(log: &'a ConversationLog) -> Self {
        let mut tree = Tree {
            by_digest: HashMap::new(),
            order: Vec::new(),
            pinned: HashMap::new(),
            requests: Vec::new(),
        };
        for line in &log.lines {
            match &line.entry {
                Entry::Message(message) => {
                    tree.by_digest.entry(message.digest).or_insert(message);
                    tree.order.push(message);
                }
                Entry::Pinned(pinned) => {
                    tree.pinned.entry(pinned.digest).or_insert(pinned);
                }
                Entry::Request(request) => tree.requests.push(request),
                Entry::CompactBoundary(_)
                | Entry::Rescue(_)
                | Entry::Adopt(_)
                | Entry::Form(_)
                | Entry::Decision(_)
                | Entry::StandIn(_) => {}
            }
        }
        tree
    }

    /// The logged original with chain digest `digest`.
    pub fn message(&self, digest: &PrefixDigest) -> Option<&'a RawValue> {
        self.by_digest.get(digest).map(|m| m.message.as_ref())
    }

    /// Message lines in file order.
    pub fn messages(&self) -> &[&'a MessageLine] {
        &self.order
    }

    /// Requests in file order.
    pub fn requests(&self) -> &[&'a RequestLine] {
        &self.requests
    }

    /// Digests that no other message continues, in the order they were written.
    pub fn tips(&self) -> Vec<PrefixDigest> {
        let parents: HashSet<PrefixDigest> = self.order.iter().filter_map(|m| m.parent).collect();
        let mut seen = HashSet::new();
        self.order
            .iter()
            .map(|m| m.digest)
            .filter(|d| !parents.contains(d) && seen.insert(*d))
            .collect()
    }

    /// The tip of the latest branch: the last message written that nothing continues.
    pub(crate) fn latest_tip(&self) -> Option<PrefixDigest> {
        self.tips().last().copied()
    }

    /// The messages from the root to `tip`; `None` if `tip` is unknown or its chain is broken.
    pub fn branch(&self, tip: &PrefixDigest) -> Option<Vec<&'a MessageLine>> {
        let mut path = Vec::new();
        let mut cursor = Some(*tip);
        while let Some(digest) = cursor {
            let line = self.by_digest.get(&digest)?;
            path.push(*line);
            cursor = line.parent;
            if path.len() > self.order.len() {
                return None;
            }
        }
        path.reverse();
        Some(path)
    }

    /// The pinned messages of the set with `digest`.
    pub fn pinned(&self, digest: &Digest) -> Option<Vec<&'a RawValue>> {
        self.pinned
            .get(digest)
            .map(|pinned| pinned.messages.iter().map(AsRef::as_ref).collect())
    }

    /// The pinned messages of the latest request whose history lies on the branch.
    pub(crate) fn pinned_for(&self, branch: &[&MessageLine]) -> Vec<&'a RawValue> {
        self.pinned_placed(branch).0
    }

    /// The pinned messages of the latest request whose history lies on the branch, and
    /// where its last ones sat in that request when they were floated.
    fn pinned_placed(&self, branch: &[&MessageLine]) -> (Vec<&'a RawValue>, &'a [usize]) {
        let on_branch: HashSet<PrefixDigest> = branch.iter().map(|m| m.digest).collect();
        let Some(request) = self
            .requests
            .iter()
            .rev()
            .find(|request| request.head.is_none_or(|head| on_branch.contains(&head)))
        else {
            return (Vec::new(), &[]);
        };
        let pinned: Vec<&'a RawValue> = request
            .pinned
            .and_then(|digest| self.pinned.get(&digest))
            .map(|pinned| pinned.messages.iter().map(AsRef::as_ref).collect())
            .unwrap_or_default();
        let floated = if request.floated.len() <= pinned.len() {
            request.floated.as_slice()
        } else {
            &[]
        };
        (pinned, floated)
    }

    /// A body in the conversation's dialect for the latest branch, as its next request
    /// would carry it: the latest request's model and pinned messages, then every
    /// original.
    pub fn latest_request_body(&self) -> Option<String> {
        let tip = self.latest_tip()?;
        let dialect = self.dialect();
        let branch = self.branch(&tip)?;
        let mut messages: Vec<&RawValue> = branch.iter().map(|m| m.message.as_ref()).collect();
        // A reply that calls tools waits for the client's results: not yet a request.
        let pending_calls = messages.last().is_some_and(|last| {
            serde_json::from_str::<serde_json::Value>(last.get())
                .is_ok_and(|m| dialect.get().calls_tools(&m))
        });
        if pending_calls {
            messages.pop();
        }
        let model = serde_json::Value::String(
            self.requests
                .last()
                .map_or("", |r| r.model.as_str())
                .to_owned(),
        );
        let (pinned, floated) = self.pinned_placed(&branch);
        let top_level = self.top_level().min(pinned.len());
        let (top, listed) = pinned.split_at(top_level);
        let mut list: Vec<&RawValue> = listed.iter().copied().chain(messages).collect();
        let places: Vec<usize> = floated
            .iter()
            .map(|p| p.saturating_sub(top_level))
            .collect();
        put_back(&mut list, listed.len(), &places);
        let list: Vec<&str> = list.iter().map(|m| m.get()).collect();
        let field = dialect.get().list_field();
        let mut body = format!("{{\"model\":{model},\"{field}\":[{}]", list.join(","));
        // A pinned message that stands for a top-level field goes back into it.
        let top_field = dialect.get().top_level_field();
        if let (Some(name), Some(first)) = (top_field, top.first()) {
            if let Ok(message) = serde_json::from_str::<serde_json::Value>(first.get()) {
                body.push_str(&format!(",\"{name}\":{}", message["content"]));
            }
        }
        body.push('}');
        Some(body)
    }

    /// The client's wire format, from its latest request.
    pub fn dialect(&self) -> DialectKind {
        DialectKind::from_name(self.requests.last().and_then(|r| r.dialect.as_deref()))
    }

    /// The client's own message list ending at `tip`, as it would send it: pinned
    /// messages first where the dialect keeps them in the list (OpenAI), then every
    /// original of the branch.
    pub(crate) fn client_messages(&self, tip: &PrefixDigest) -> Option<Vec<&'a RawValue>> {
        let top_level = self.top_level();
        let mut out = self.replay(tip)?;
        let pinned = self.pinned_for(&self.branch(tip)?).len();
        out.drain(..top_level.min(pinned));
        Some(out)
    }

    /// How many leading pinned messages stand for top-level fields in the latest request.
    fn top_level(&self) -> usize {
        self.requests
            .last()
            .and_then(|r| r.top_level)
            .unwrap_or_default()
    }

    /// Every tip with the length of its branch, as the admin API shows them.
    pub fn tips_json(&self) -> Vec<serde_json::Value> {
        self.tips()
            .iter()
            .map(|tip| {
                serde_json::json!({"tip": tip.to_hex(), "messages": self.branch(tip).map_or(0, |b| b.len())})
            })
            .collect()
    }

    /// The replayable history ending at `tip`: pinned, then every original of the branch.
    pub fn replay(&self, tip: &PrefixDigest) -> Option<Vec<&'a RawValue>> {
        let branch = self.branch(tip)?;
        let (mut out, floated) = self.pinned_placed(&branch);
        let pinned = out.len();
        out.extend(branch.iter().map(|m| m.message.as_ref()));
        put_back(&mut out, pinned, floated);
        Some(out)
    }
}

/// Moves the last `places.len()` of the first `pinned` messages of `list` back to the
/// places they had in the client's request.
pub(super) fn put_back<T>(list: &mut Vec<T>, pinned: usize, places: &[usize]) {
    let Some(start) = pinned.checked_sub(places.len()) else {
        return;
    };
    let moved: Vec<T> = list.drain(start..pinned).collect();
    for (place, message) in places.iter().zip(moved) {
        let at = (*place).min(list.len());
        list.insert(at, message);
    }
}
