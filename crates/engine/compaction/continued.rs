//! The summary call that continues the conversation ([`ConversationClient`]): the
//! request's own body, its list cut where the compaction cuts, one user turn appended.
//! The upstream has that prefix in its prompt cache from the requests that carried it,
//! so the call pays cache reads for it, not fresh input. Used when the summary model
//! is the request's own and the API has a [`ContinuedCall`].

use std::sync::Arc;

use bytes::Bytes;
use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{ConversationClient, ModelCallError, ModelClient, ModelReply};
use http::uri::PathAndQuery;
use serde_json::{Map, Value};

use crate::base::chunks::Chunks;
use crate::config::Config;
use crate::dialect::{ChatRequest, ContinuedCall};
use crate::projection::ModelView;

/// What continuing one request's conversation takes: its body, a client that posts
/// bodies of its API to its path, and how that API is continued.
pub struct Continuer {
    /// The request body as the client sent it (the view is spliced into it).
    pub body: Chunks,
    /// Posts a body of the request's API to its path and returns the raw reply.
    pub client: Arc<dyn ModelClient>,
    /// How the API is continued.
    pub call: ContinuedCall,
    /// `compaction.summary_request_extra`, merged into each call.
    pub extra: Map<String, Value>,
}

impl Continuer {
    /// How `chat`'s summary calls to `summary_model` continue its conversation: when
    /// they go to the request's own model through its own API (no `api` override), on
    /// an API that has a [`ContinuedCall`], and the request holds its conversation
    /// (not a server-held one). `None` renders the history as text.
    pub fn eligible(
        config: &Config,
        chat: &ChatRequest,
        summary_model: &str,
    ) -> Option<ContinuedCall> {
        let other_api = config.model(&chat.model).is_some_and(|m| m.api.is_some());
        if chat.server_held || summary_model != chat.model || other_api {
            return None;
        }
        chat.dialect().continued_call()
    }

    /// The path `chat`'s continued calls post to (its own), given its `target`.
    pub fn path(chat: &ChatRequest, target: &str) -> Option<PathAndQuery> {
        chat.dialect()
            .call_path(&chat.model, Some(target))
            .parse()
            .ok()
    }

    /// The conversation of `view` cut before its live message `cut`, taking
    /// `prefix_tokens`; `None` when the body cannot be rebuilt.
    pub(super) fn conversation(
        &self,
        view: &ModelView<'_>,
        cut: usize,
        prefix_tokens: u64,
        client: Arc<dyn ModelClient>,
    ) -> Option<Arc<dyn ConversationClient>> {
        let prefix = view
            .render_prefix(&self.body, cut)
            .inspect_err(|err| tracing::warn!(error = %err, "cannot rebuild the body to continue; the summary renders the history"))
            .ok()?;
        Some(Arc::new(Continued {
            prefix: prefix.contiguous().clone(),
            list_field: view.dialect.get().list_field(),
            call: self.call,
            extra: self.extra.clone(),
            prefix_tokens,
            client,
        }))
    }
}

/// One compaction's continued conversation.
struct Continued {
    prefix: Bytes,
    list_field: &'static str,
    call: ContinuedCall,
    extra: Map<String, Value>,
    prefix_tokens: u64,
    client: Arc<dyn ModelClient>,
}

impl Continued {
    /// The call's body: the prefix, the turn, the settings of one plain reply.
    fn body(&self, instruction: &str, max_tokens: u64) -> Result<Value, ModelCallError> {
        let mut body: Map<String, Value> = serde_json::from_slice(&self.prefix)
            .map_err(|err| ModelCallError(format!("rebuilding the conversation: {err}")))?;
        let Some(Value::Array(list)) = body.get_mut(self.list_field) else {
            return Err(ModelCallError(format!(
                "the conversation has no {:?} list",
                self.list_field
            )));
        };
        (self.call.append)(list, instruction);
        for (key, value) in &self.extra {
            body.insert(key.clone(), value.clone());
        }
        (self.call.settle)(&mut body, max_tokens);
        Ok(Value::Object(body))
    }
}

impl ConversationClient for Continued {
    fn prefix_tokens(&self) -> u64 {
        self.prefix_tokens
    }

    fn ask(
        &self,
        instruction: String,
        max_tokens: u64,
    ) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        async move {
            let body = self.body(&instruction, max_tokens)?;
            let reply = self.client.complete(body).await?;
            Ok(ModelReply {
                status: reply.status,
                body: (self.call.reply)(reply.status, reply.body),
            })
        }
        .boxed()
    }
}
