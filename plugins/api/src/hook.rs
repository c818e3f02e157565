//! Middleware hooks: code that sees a request at the stages of its life ([`Stage`]) and
//! may refuse it, redact it, send it to another model or tag it. A hook gets the
//! messages in the neutral (chat-completions) form whatever the client's API, and
//! answers with what it decided; the host applies that to the request in the client's
//! own format, so a hook never writes a wire format.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Where in a request's life a hook is called; a hook's config names its stages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    /// After admission, before tracking: what it takes out is never tracked, logged,
    /// summarised or sent; it may refuse, reroute and tag.
    Request,
    /// The view about to be sent, after compaction (and each summary call's input):
    /// what it takes out never reaches the provider, while the log keeps it.
    View,
    /// The reply, once logged and answered: it may tag, and never delays the client.
    Reply,
}

impl Stage {
    /// Its name in the config and the exec protocol.
    pub fn name(self) -> &'static str {
        match self {
            Stage::Request => "request",
            Stage::View => "view",
            Stage::Reply => "reply",
        }
    }
}

/// What a hook is given: a request, or the view made of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HookRequest {
    /// The client's wire format (`openai`, `anthropic`, `responses`).
    pub dialect: String,
    /// The request's path, canonical.
    pub path: String,
    /// The requested model.
    pub model: String,
    /// The tenant the request belongs to.
    pub tenant: String,
    /// Every message of the request, oldest first, in the neutral form; the system
    /// prompt is a message with role `system`. Shared: the host keeps each message's
    /// neutral form, so a long conversation is not rebuilt for every request.
    pub messages: Vec<Arc<Value>>,
    /// The request's text outside its messages, each top-level member that holds a
    /// string as `{"field": <its name>, "value": <its JSON>}`: tool definitions, a
    /// `prediction`, a response schema, metadata. On a path handoff does not track (a
    /// legacy completion, a batch, an embedding, `/responses/compact`) `messages` is
    /// empty and this is the whole body but its `model`.
    #[serde(default)]
    pub outside: Vec<Arc<Value>>,
    /// Tags the hooks before this one added.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
}

/// What an `on_reply` hook is given: the request, and the reply it got.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct HookReply {
    /// The request, as the request-stage hooks left it (its tags included).
    pub request: HookRequest,
    /// The reply's messages in the neutral form (one assistant message, with its tool
    /// calls), as logged.
    pub reply: Vec<Arc<Value>>,
}

/// One text to take out of the request: every occurrence of `find`, in any message or
/// field, becomes a marker the host makes from `label` and the text itself, the same
/// for the same text within a tenant, so a model can still tell two of them apart.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redaction {
    /// The exact text to remove.
    pub find: String,
    /// What it is (`email`, `api_key`, `card`…): it names the marker, never the text.
    pub label: String,
}

/// A refusal: the client gets `status` and `message` in its API's error shape.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Denial {
    /// An HTTP status, 400 to 499.
    pub status: u16,
    /// Why, for the client.
    pub message: String,
}

/// What an `on_request` hook decided. The default changes nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HookDecision {
    /// Refuse the request; no later hook runs and nothing is tracked or sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deny: Option<Denial>,
    /// Texts to take out before the request is tracked, compacted or sent.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact: Vec<Redaction>,
    /// Metadata to add to the request's record and metrics.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// Send the request to this model instead (request stage): the route that matches
    /// it picks the upstream, and the client's key must allow it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
}

/// Why a hook could not decide. The host then applies the hook's failure policy:
/// fail open (the request goes on as if the hook were not there) or closed (refused).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct HookError(pub String);

impl HookRequest {
    /// Calls `visit` on every string of the request's messages and of the text outside
    /// them, keys excluded: what a hook looking for a text must read.
    pub fn each_string(&self, visit: &mut impl FnMut(&str)) {
        for value in self.messages.iter().chain(&self.outside) {
            each_string(value, visit);
        }
    }
}

/// Calls `visit` on every string inside `value`, keys excluded.
pub fn each_string(value: &Value, visit: &mut impl FnMut(&str)) {
    match value {
        Value::String(text) => visit(text),
        Value::Array(items) => items.iter().for_each(|item| each_string(item, visit)),
        Value::Object(fields) => fields.values().for_each(|field| each_string(field, visit)),
        _ => {}
    }
}

/// A middleware hook.
pub trait Hook: Send + Sync {
    /// The hook's kind, e.g. `redact`.
    fn kind(&self) -> &'static str;

    /// Drops whatever it keeps of the texts it was shown (a cache of what it found in
    /// them): called after an erasure, which nothing kept may outlive.
    fn forget_texts(&self) {}

    /// How many calls it serves at once; `None` (the default) when any number. The host
    /// queues the calls beyond it, per tenant, outside the hook's time limit.
    fn concurrency(&self) -> Option<usize> {
        None
    }

    /// Looks at a request after its admission, before it is tracked.
    fn on_request<'a>(
        &'a self,
        request: &'a HookRequest,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>>;

    /// Looks at the view about to be sent (its messages in `view.messages`); only its
    /// redactions and denial count. By default it decides as [`Hook::on_request`].
    fn on_view<'a>(
        &'a self,
        view: &'a HookRequest,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        self.on_request(view)
    }

    /// Looks at a reply after the client got it; only its tags count. By default it
    /// adds none.
    fn on_reply<'a>(
        &'a self,
        reply: &'a HookReply,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        let _ = reply;
        Box::pin(async { Ok(HookDecision::default()) })
    }
}
