//! The asks a create carries that handoff serves where the upstream lacks them
//! (`upstream.native_compaction`): the Responses API's `context_management`
//! compaction, and the Messages API's context edits and on-demand `compaction`. They
//! are taken off the upstream request; a compaction past its trigger is made by the
//! strategy chain and answered first in the reply (or alone, when the client pauses
//! after it); the clearing edits are applied to the list sent.

use std::sync::Arc;

use http::Response;
use serde_json::Value;

use super::{Exchange, Halt, Serving};
use crate::base::chunks::Chunks;
use crate::body::ProxyBody;
use crate::dialect::{DialectKind, Expanded};
use crate::error::ApiError;
use crate::native::asks::Asks;
use crate::native::prepend::Served;
use crate::native::{reply as native_reply, strip, SERVED};
use crate::projection::{project_view, ModelView};

impl Exchange<'_> {
    /// True when the request asks the API's context management on create: the
    /// Responses `context_management`, the Messages edits or on-demand `compaction`.
    /// A trailing trigger and the compaction endpoint are [`Self::serve`]'s.
    pub(super) fn asks_on_create(&self) -> bool {
        let Some(asked) = self.chat.asked.as_deref() else {
            return false;
        };
        let trigger = (self.chat.messages.last()).is_some_and(|m| m.is_compaction_trigger());
        match self.chat.dialect {
            DialectKind::Responses => {
                asked.path.is_none() && !trigger && asked.context_management.is_some()
            }
            DialectKind::Anthropic => {
                asked.context_management.is_some() || asked.compaction.is_some()
            }
            _ => false,
        }
    }

    /// True when handoff serves this request's asks on create: configured to, or
    /// `auto` and the upstream refused such asks before.
    fn serves_asks(&self) -> bool {
        self.asks_on_create() && self.serves_here()
    }

    /// Serves the request's asks on create, when handoff serves them: reads and checks
    /// them (a refusal in the API's shape), takes them off the upstream request, and
    /// compacts past the trigger. `Some` when that answers the request (the client
    /// pauses after the compaction).
    pub(super) async fn serve_asks(&mut self) -> Result<Option<Response<ProxyBody>>, Halt> {
        if !self.serves_asks() || self.serving.is_some() {
            return Ok(None);
        }
        let asks = self.read_asks()?;
        self.take_asks_off()?;
        let mut reply = Served::default();
        let compact = asks.compact.clone();
        // A chain the upstream holds is not compacted on create: its history is the
        // upstream's to send, and the field is only taken off.
        let compact = compact.filter(|_| !self.chat.server_held);
        if let Some(compact) = compact.filter(|c| self.view_tokens() > c.trigger) {
            let minted = self.mint(true).await?;
            let summary = native_reply::summary_tokens(&minted.usage);
            let artefact = match self.chat.dialect {
                DialectKind::Anthropic => {
                    native_reply::compaction_block(&minted.summary, &minted.handle)
                }
                _ => native_reply::compaction_item(&minted.handle),
            };
            let tracked = self.tracked()?;
            tracing::info!(conversation = %tracked.id, record = ?minted.record, pause = compact.pause, "served the API's compaction on create");
            self.state.metrics.add(SERVED, &[("how", "create")], 1.0);
            if compact.pause {
                let answer = native_reply::paused(&self.chat.model, artefact, summary);
                return self.answer_served(answer).await.map(Some);
            }
            // The handle stands for all the request sends: the upstream gets what it
            // stands for, as the next request (carrying the handle) will send it.
            let at = self.chat.messages.len().saturating_sub(1);
            self.chat.expanded = Some(Arc::new(Expanded {
                at,
                messages: minted.messages,
                remainder: None,
            }));
            reply = Served {
                artefact: Some(artefact),
                summary,
                applied: Vec::new(),
            };
        }
        self.serving = Some(Box::new(Serving { asks, reply }));
        Ok(None)
    }

    /// The request's asks, read and checked as the API checks them.
    fn read_asks(&self) -> Result<Asks, ApiError> {
        let asked = self.chat.asked.as_deref();
        let value = |raw: Option<&serde_json::value::RawValue>| {
            raw.and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
        };
        let context_management = value(asked.and_then(|a| a.context_management.as_deref()));
        let compaction = value(asked.and_then(|a| a.compaction.as_deref()));
        let read = match self.chat.dialect {
            DialectKind::Anthropic => {
                Asks::of_messages(context_management.as_ref(), compaction.as_ref())
            }
            _ => {
                let threshold = self.budget.as_ref().map_or(u64::MAX, |b| b.threshold);
                Asks::of_responses(context_management.as_ref(), threshold)
            }
        };
        read.map_err(|refusal| ApiError::invalid_request("invalid_context_management", refusal))
    }

    /// Takes the asks off the body and the headers the upstream gets; the request is
    /// read again from what is left, the handles it carried still opened.
    fn take_asks_off(&mut self) -> Result<(), ApiError> {
        strip::strip_betas(&mut self.parts.headers);
        let Some(body) = strip::without_members(
            self.body.contiguous(),
            &["context_management", "compaction"],
        ) else {
            return Ok(());
        };
        let body = Chunks::from(bytes::Bytes::from(body));
        let mut chat = (self.chat.dialect.get())
            .parse_at(self.request_target(), &body)
            .map_err(crate::rescue::dialect)?;
        self.snap.pins.apply(&mut chat);
        chat.expanded = self.chat.expanded.take();
        chat.pinned = self.chat.pinned;
        chat.asked = self.chat.asked.take();
        chat.provider_compacts = false;
        self.chat = chat;
        self.body = body;
        Ok(())
    }

    /// The tokens of the view the request would send as it is: what a trigger is
    /// judged on.
    fn view_tokens(&self) -> u64 {
        let (Ok(tracked), Some(budget)) = (self.tracked(), self.budget.as_ref()) else {
            return u64::MAX;
        };
        let view = project_view(&self.chat, tracked, &tracked.compactions);
        view.estimate(&self.state.tokens, budget.tokenizer(), budget.tools_tokens)
    }

    /// `body` (rendered from `view`, `estimate` tokens) with the clearing edits the
    /// request asked applied to its list, and the edits applied.
    pub(super) fn cleared<'b>(
        &self,
        view: &ModelView<'_>,
        body: std::borrow::Cow<'b, Chunks>,
        estimate: Option<u64>,
    ) -> Result<(std::borrow::Cow<'b, Chunks>, Vec<Value>), ApiError> {
        let Some(serving) = self.serving.as_deref().filter(|s| !s.asks.only_removed()) else {
            return Ok((body, Vec::new()));
        };
        let tokenizer = self
            .budget
            .as_ref()
            .map(|b| b.tokenizer())
            .unwrap_or_default();
        let count = |text: &str| self.state.tokens.count_text(tokenizer, text);
        let mut list: Vec<Value> = (view.raw_messages().into_iter())
            .filter_map(|raw| serde_json::from_str(raw).ok())
            .collect();
        let applied = serving.asks.clear(&mut list, estimate.unwrap_or(0), &count);
        if applied.is_empty() {
            return Ok((body, applied));
        }
        let raw: Vec<String> = list.iter().map(Value::to_string).collect();
        let raw: Vec<&str> = raw.iter().map(String::as_str).collect();
        let rendered = view
            .render_list(&self.body, &raw)
            .map_err(|err| ApiError::internal(err.to_string()))?;
        Ok((std::borrow::Cow::Owned(rendered), applied))
    }
}
