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
                Entry::CompactBoundary(_) => {}
            }
        }
        tree
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
    pub fn latest_tip(&self) -> Option<PrefixDigest> {
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
    pub fn pinned_for(&self, branch: &[&MessageLine]) -> Vec<&'a RawValue> {
        let on_branch: HashSet<PrefixDigest> = branch.iter().map(|m| m.digest).collect();
        self.requests
            .iter()
            .rev()
            .find(|request| request.head.is_none_or(|head| on_branch.contains(&head)))
            .and_then(|request| request.pinned)
            .and_then(|digest| self.pinned.get(&digest))
            .map(|pinned| pinned.messages.iter().map(AsRef::as_ref).collect())
            .unwrap_or_default()
    }

    /// A chat-completions body for the latest branch as its next request would carry
    /// it: the latest request's model and pinned messages, then every original.
    pub fn latest_request_body(&self) -> Option<String> {
        let tip = self.latest_tip()?;
        let dialect = self.dialect();
        let branch = self.branch(&tip)?;
        let mut messages: Vec<&RawValue> = branch.iter().map(|m| m.message.as_ref()).collect();
        // A reply that calls tools waits for the client's results: not yet a request.
        let pending_calls = messages.last().is_some_and(|last| {
            serde_json::from_str::<serde_json::Value>(last.get()).is_ok_and(|m| {
                m["tool_calls"].as_array().is_some_and(|c| !c.is_empty())
                    || m["content"]
                        .as_array()
                        .is_some_and(|blocks| blocks.iter().any(|b| b["type"] == "tool_use"))
            })
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
        let pinned = self.pinned_for(&branch);
        let list = |messages: &[&RawValue]| {
            messages
                .iter()
                .map(|m| m.get())
                .collect::<Vec<_>>()
                .join(",")
        };
        Some(match dialect {
            DialectKind::OpenAiChat => {
                let mut all = pinned;
                all.extend(messages);
                format!("{{\"model\":{model},\"messages\":[{}]}}", list(&all))
            }
            DialectKind::Anthropic => {
                // The pinned message stands for the top-level `system`.
                let system = pinned
                    .first()
                    .and_then(|m| serde_json::from_str::<serde_json::Value>(m.get()).ok())
                    .map(|m| m["content"].clone())
                    .unwrap_or(serde_json::Value::Null);
                format!(
                    "{{\"model\":{model},\"system\":{system},\"messages\":[{}]}}",
                    list(&messages)
                )
            }
        })
    }

    /// The client's wire format, from its latest request.
    pub fn dialect(&self) -> DialectKind {
        DialectKind::from_name(self.requests.last().and_then(|r| r.dialect.as_deref()))
    }

    /// The client's own message list ending at `tip`, as it would send it: pinned
    /// messages first where the dialect keeps them in the list (OpenAI), then every
    /// original of the branch.
    pub fn client_messages(&self, tip: &PrefixDigest) -> Option<Vec<&'a RawValue>> {
        if self.dialect().get().pins_in_messages() {
            return self.replay(tip);
        }
        let branch = self.branch(tip)?;
        Some(branch.iter().map(|m| m.message.as_ref()).collect())
    }

    /// The replayable history ending at `tip`: pinned, then every original of the branch.
    pub fn replay(&self, tip: &PrefixDigest) -> Option<Vec<&'a RawValue>> {
        let branch = self.branch(tip)?;
        let mut out = self.pinned_for(&branch);
        out.extend(branch.iter().map(|m| m.message.as_ref()));
        Some(out)
    }
}
