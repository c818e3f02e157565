//! The model view: pinned + continuation + handoff + the originals after the covered
//! prefix. System and developer messages inside the covered prefix (Claude Code sends
//! its environment as one) are never summarised: they are lifted, verbatim and in their
//! order, to right after the user message that opens the handoff pair, the position
//! such a message has in the client's own request (after a user turn, before the
//! model's). It is validated before it is sent, and rendered by splicing the new message
//! list into the client's body, so every other byte of the request is unchanged and,
//! between compactions, each request extends the previous one (prompt caches hit).

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::adoption::Adopted;
use crate::base::chunks::Chunks;
use crate::base::digest::{MessageDigest, PrefixDigest};
use crate::base::line::ShortenedBody;
use crate::config::Tokenizer;
use crate::conversation::Tracked;
use crate::dialect::{ChatRequest, DialectError, DialectKind, Expanded, Message, RawMessage};
use crate::tokens::{Tokens, REPLY_PRIMING};
use handoff_plugin_api::shorten_tool_body;

/// Why a view may not be sent.
#[derive(Debug, thiserror::Error)]
pub enum ProjectionError {
    /// Tool calls and results do not pair up.
    #[error("the compacted view breaks a tool pair: {0}")]
    ToolPairs(#[from] DialectError),
    /// The pair is not a user continuation followed by a plain assistant handoff.
    #[error("the compacted view is malformed: {0}")]
    Shape(String),
    /// The client's body could not be re-read to splice the view in.
    #[error("cannot rebuild the request body: {0}")]
    Body(serde_json::Error),
}

/// One message of the view.
#[derive(Debug, Clone, Copy)]
pub struct ViewMessage<'a> {
    /// The bytes sent upstream.
    pub raw: &'a RawMessage,
    /// The message.
    pub message: &'a Message,
    /// Its digest, the token-count cache key.
    pub digest: MessageDigest,
}

/// The message list actually sent upstream.
#[derive(Debug)]
pub struct ModelView<'a> {
    /// The request's wire format.
    pub dialect: DialectKind,
    /// How many leading pinned messages stand for top-level fields: not in the list.
    pub top_level: usize,
    /// Pinned messages of this request.
    pub pinned: Vec<ViewMessage<'a>>,
    /// The compaction in force, if any.
    pub compaction: Option<Arc<Adopted>>,
    /// Instruction messages of the covered prefix, kept verbatim after the pair's user
    /// message.
    pub lifted: Vec<&'a Message>,
    /// The originals after the covered prefix: verbatim, unless rescued.
    pub live: Cow<'a, [Message]>,
    /// Digests of `live`.
    pub live_digests: Cow<'a, [MessageDigest]>,
    /// Index in the non-pinned originals where `live` starts.
    pub live_start: usize,
    /// The pair as one message, when the dialect cannot send it as two before `live`.
    pub joined: Option<Box<RawValue>>,
    /// The pair's last message with a prompt-cache breakpoint after it
    /// ([`ModelView::mark_cache`]), sent in its place.
    pub pair_end: Option<Arc<str>>,
    /// The messages whose tool bodies [`ModelView::rescue`] shortened.
    pub rescued: Vec<ShortenedBody>,
    /// Where the list lies in the request body, if the reading found it.
    pub list: Option<std::ops::Range<usize>>,
    /// The request carries history a provider's compaction minted, which the
    /// provider reads the list from ([`ChatRequest::compacted_history`]).
    pub compacted_history: bool,
    /// The latest compaction handle handoff minted, opened: sent as the messages it
    /// stands for, with nothing before it but the top-level fields.
    pub expanded: Option<Arc<Expanded>>,
}

impl ModelView<'_> {
    /// The compaction id this view is built on.
    pub fn compact_id(&self) -> Option<&str> {
        self.compaction.as_deref().map(|a| a.record.id.as_str())
    }

    /// Estimated input tokens: every message (cached counts), `tools`, reply priming.
    pub fn estimate(&self, tokens: &Tokens, tokenizer: Tokenizer, tools_tokens: u64) -> u64 {
        let mut messages = 0;
        self.each_counted(|m| messages += m.token_count(tokens, tokenizer));
        tools_tokens + REPLY_PRIMING + messages + self.compaction_tokens(tokens, tokenizer)
    }

    /// [`ModelView::estimate`] in one pass when everything it counts was counted
    /// before, so nothing is tokenised; else the bytes of the messages not counted yet
    /// (an upper bound on the tokenising work `estimate` will do).
    pub(crate) fn cached_estimate(
        &self,
        tokens: &Tokens,
        tokenizer: Tokenizer,
        tools_tokens: u64,
    ) -> Result<u64, usize> {
        let mut total = tools_tokens + REPLY_PRIMING;
        let mut uncounted = 0;
        self.each_counted(|message| match message.cached_count(tokens, tokenizer) {
            Some(count) => total += count,
            None => uncounted += message.raw.as_bytes().len(),
        });
        let pair = match &self.compaction {
            None => Some(0),
            Some(adopted) => tokens
                .cached(tokenizer, &adopted.continuation_digest)
                .zip(tokens.cached(tokenizer, &adopted.handoff_digest))
                .map(|(continuation, handoff)| continuation + handoff),
        };
        match pair {
            Some(pair) if uncounted == 0 => Ok(total + pair),
            _ => Err(uncounted),
        }
    }

    /// The adopted compaction's continuation and handoff, when there is one.
    fn compaction_tokens(&self, tokens: &Tokens, tokenizer: Tokenizer) -> u64 {
        // A handle in the live part stands for everything before it, the pair too.
        if self.handle_position().is_some_and(|(_, live)| live) {
            return 0;
        }
        self.compaction.as_ref().map_or(0, |adopted| {
            tokens.count_message(
                tokenizer,
                &adopted.continuation_digest,
                &adopted.record.continuation,
            ) + tokens.count_message(tokenizer, &adopted.handoff_digest, &adopted.record.handoff)
        })
    }

    /// Visits every message the view sends but the adopted compaction's pair, in the
    /// order `estimate` counts them, as the provider counts them: a list it reads from
    /// its latest compaction artefact on (what precedes it in the list is dropped), the
    /// top-level fields always. A view without compacted history visits them all, in
    /// the loop it always had.
    fn each_counted<'s>(&'s self, mut visit: impl FnMut(&'s Message)) {
        let all = (self.pinned.iter().map(|m| m.message))
            .chain(self.lifted.iter().copied())
            .chain(self.live.iter());
        if !self.compacted_history && self.expanded.is_none() {
            return all.for_each(visit);
        }
        // A handle of handoff's is counted as what it stands for.
        let handle = self.handle_position().map(|(at, _)| at);
        let from = handle.map_or(0, |at| at).max(self.provider_reads_from());
        let top = self.top_level.min(from);
        for (at, message) in all.enumerate() {
            if at < top || at > from || (at == from && handle != Some(at)) {
                visit(message);
            } else if at == from {
                if let Some(expanded) = self.expanded.as_deref() {
                    expanded.messages.iter().for_each(&mut visit);
                    expanded.remainder.iter().for_each(&mut visit);
                }
            }
        }
    }

    /// Where the opened handle lies among the view's messages: its index in the order
    /// [`ModelView::each_counted`] visits them (pinned, lifted, live), and whether it
    /// is in the live part. `None` without one, or for one the view does not send.
    fn handle_position(&self) -> Option<(usize, bool)> {
        let at = self.expanded.as_ref()?.at;
        if at < self.pinned.len() {
            return Some((at, false));
        }
        let live = at.checked_sub(self.pinned.len() + self.live_start)?;
        (live < self.live.len()).then_some((self.pinned.len() + self.lifted.len() + live, true))
    }

    /// Where the provider starts reading the view's messages (pinned, lifted, live):
    /// at its latest compaction artefact, or at the start. Only the live part and the
    /// pinned set can hold one (a request continued after one pins what precedes it).
    fn provider_reads_from(&self) -> usize {
        let before_live = self.pinned.len() + self.lifted.len();
        if let Some(at) = self.live.iter().rposition(Message::is_compacted_history) {
            return before_live + at;
        }
        (self.pinned.iter())
            .rposition(|m| m.message.is_compacted_history())
            .unwrap_or(0)
    }

    /// The messages whose token count is not cached yet, shared, for counting them
    /// off the async path.
    pub(crate) fn uncounted(&self, tokens: &Tokens, tokenizer: Tokenizer) -> Vec<Message> {
        let mut uncounted = Vec::new();
        self.each_counted(|m| {
            if m.cached_count(tokens, tokenizer).is_none() {
                uncounted.push(m.clone());
            }
        });
        uncounted
    }

    /// Checks the view: tool pairs complete, the continuation a user message, the
    /// handoff an assistant message with string content and no tool calls.
    pub fn validate(&self) -> Result<(), ProjectionError> {
        self.dialect.get().check_pairs(&self.live)?;
        if let Some(adopted) = &self.compaction {
            adopted.record.check().map_err(ProjectionError::Shape)?;
            if !self.dialect.get().handoff_ok(&adopted.record.handoff) {
                return Err(ProjectionError::Shape(
                    "handoff content is not a string".into(),
                ));
            }
            if self.live.is_empty() {
                return Err(ProjectionError::Shape("nothing follows the handoff".into()));
            }
        }
        Ok(())
    }

    /// `compaction.rescue`: shortens over-long tool bodies in the verbatim part to their
    /// first and last 2,000 characters, marked. Only the view changes; the originals on
    /// disk stay whole. Returns whether anything was shortened.
    pub fn rescue(&mut self) -> bool {
        let mut changed = false;
        let mut live = self.live.to_vec();
        let mut digests = self.live_digests.to_vec();
        let mut rescued = Vec::new();
        let dialect = self.dialect.get();
        for (index, (message, digest)) in live.iter_mut().zip(digests.iter_mut()).enumerate() {
            if !message.is_tool_answer() {
                continue;
            }
            let mut value = message.value().clone();
            if !dialect.shorten_tool_results(&mut value, &mut shorten_slot) {
                continue;
            }
            let Ok(raw) = serde_json::to_string(&value) else {
                continue;
            };
            rescued.push(ShortenedBody {
                index: self.live_start + index,
                message_digest: *digest,
                bytes_before: message.raw.get().len(),
                bytes_after: raw.len(),
            });
            let shortened = Message::parsed(message.role, RawMessage::from(raw), value);
            *digest = shortened.digest();
            *message = shortened;
            changed = true;
        }
        if changed {
            self.live = Cow::Owned(live);
            self.live_digests = Cow::Owned(digests);
            self.rescued = rescued;
        }
        changed
    }

    /// The raw messages of the body's `messages`, in order: pinned ones only where the
    /// dialect keeps them there.
    pub fn raw_messages(&self) -> Vec<&str> {
        let mut out: Vec<&str> =
            Vec::with_capacity(self.pinned.len() + self.lifted.len() + self.live.len() + 2);
        out.extend(self.pinned.iter().skip(self.top_level).map(|m| m.raw.get()));
        let lifted = self.lifted.iter().map(|m| m.raw.get());
        let marked = self.pair_end.as_deref();
        match (&self.compaction, &self.joined) {
            (Some(_), Some(joined)) => {
                out.push(marked.unwrap_or(joined.get()));
                out.extend(lifted);
            }
            (Some(adopted), None) => {
                out.push(adopted.continuation.get());
                out.extend(lifted);
                out.push(marked.unwrap_or(adopted.handoff.get()));
            }
            (None, _) => {}
        }
        out.extend(self.live.iter().map(|m| m.raw.get()));
        self.expand_handle(out)
    }

    /// `list` (the body's list, as [`ModelView::raw_messages`] makes it) with the
    /// opened handle replaced by what it stands for, and what precedes it dropped: the
    /// handle carries it.
    fn expand_handle<'s>(&'s self, list: Vec<&'s str>) -> Vec<&'s str> {
        let (Some(expanded), Some((at, in_live))) = (&self.expanded, self.handle_position()) else {
            return list;
        };
        let at = match in_live {
            // Counted from the end: the pair and the lifted messages sit before live.
            true => list.len() - (self.pinned.len() + self.lifted.len() + self.live.len() - at),
            false => at - self.top_level.min(at),
        };
        let mut out: Vec<&str> = (expanded.messages.iter()).map(|m| m.raw.get()).collect();
        out.extend(expanded.remainder.iter().map(|m| m.raw.get()));
        out.extend(list.into_iter().skip(at + 1));
        out
    }

    /// Where the client marks the provider's prompt cache and leaves room for one more
    /// mark (Anthropic: four at most), puts a breakpoint after the handoff pair: the
    /// pinned messages and the pair, byte-stable until the next compaction, are then
    /// read from the cache by every request until then, whatever the client's own marks
    /// do (a recent part edited, or grown past the provider's lookback). `tools` are
    /// the request's. A per-request annotation, as the client's own marks: the record
    /// keeps the pair unmarked.
    pub fn mark_cache(&mut self, tools: Option<&[u8]>) {
        self.pair_end = None;
        let Some(adopted) = &self.compaction else {
            return;
        };
        let dialect = self.dialect.get();
        let tools = tools.and_then(|t| std::str::from_utf8(t).ok());
        let messages = self.pinned.iter().map(|m| m.raw.get());
        let lifted = self.lifted.iter().map(|m| m.raw.get());
        let rest = lifted.chain(self.live.iter().map(|m| m.raw.get()));
        let mut raw = tools.into_iter().chain(messages).chain(rest);
        if !dialect.room_for_cache_mark(&mut raw) {
            return;
        }
        self.pair_end = match &self.joined {
            // Joined with what follows it, for this request: marked here.
            Some(joined) => serde_json::from_str::<Value>(joined.get())
                .ok()
                .and_then(|pair| dialect.with_cache_mark(&pair))
                .and_then(|marked| serde_json::to_string(&marked).ok())
                .map(Arc::from),
            None => adopted.marked_handoff(|handoff| dialect.with_cache_mark(handoff)),
        };
    }

    /// The request body with this view as its list (`messages`, `input`); the client's
    /// bytes when the view is the request itself.
    pub fn render_body<'b>(&self, body: &'b Chunks) -> Result<Cow<'b, Chunks>, ProjectionError> {
        if self.compaction.is_none()
            && self.expanded.is_none()
            && matches!(self.live, Cow::Borrowed(_))
        {
            return Ok(Cow::Borrowed(body));
        }
        let messages = self.raw_messages();
        Ok(Cow::Owned(self.with_list(body, &messages)?))
    }

    /// The request body with the messages this view sends before its live message
    /// `cut`: the conversation as the upstream last saw it, cut after the history a
    /// compaction at `cut` covers.
    pub fn render_prefix(&self, body: &Chunks, cut: usize) -> Result<Chunks, ProjectionError> {
        let mut messages = self.raw_messages();
        let before = messages.len().saturating_sub(self.live.len());
        messages.truncate(before + cut.min(self.live.len()));
        self.with_list(body, &messages)
    }

    /// `body` with `list` (of [`ModelView::raw_messages`], perhaps shortened) as its
    /// list: a request of the same fields over other messages.
    pub fn render_list(&self, body: &Chunks, list: &[&str]) -> Result<Chunks, ProjectionError> {
        self.with_list(body, list)
    }

    /// `body` with `messages` as its list.
    fn with_list(&self, body: &Chunks, messages: &[&str]) -> Result<Chunks, ProjectionError> {
        let known = self.list.clone().filter(|list| {
            body.byte(list.start) == Some(b'[')
                && list.end > 0
                && body.byte(list.end - 1) == Some(b']')
        });
        let (start, end) = match known {
            Some(list) => (list.start, list.end),
            None => list_in(body.contiguous(), self.dialect.get().list_field())?,
        };
        let size: usize = messages.iter().map(|m| m.len() + 1).sum();
        let mut out = Vec::with_capacity(body.len() - (end - start) + size + 2);
        body.copy_into(0..start, &mut out);
        out.push(b'[');
        for (index, message) in messages.iter().enumerate() {
            if index > 0 {
                out.push(b',');
            }
            out.extend_from_slice(message.as_bytes());
        }
        out.push(b']');
        body.copy_into(end..body.len(), &mut out);
        Ok(Chunks::from(out))
    }
}

/// Where the list `field` lies in `body`, read whole.
fn list_in(body: &Bytes, field: &str) -> Result<(usize, usize), ProjectionError> {
    let fields: HashMap<String, &RawValue> =
        serde_json::from_slice(body).map_err(ProjectionError::Body)?;
    let list = fields
        .get(field)
        .ok_or_else(|| ProjectionError::Shape(format!("the request body has no {field:?}")))?;
    // The borrowed RawValue points into `body`; its offset is where the list starts.
    let start = list.get().as_ptr() as usize - body.as_ptr() as usize;
    Ok((start, start + list.get().len()))
}

/// Shortens one tool-result slot: a string, or each text part of a list.
fn shorten_slot(slot: &mut Value) -> bool {
    match slot {
        Value::String(text) => {
            let short = shorten_tool_body(text);
            let changed = short.len() != text.len();
            *text = short;
            changed
        }
        Value::Array(parts) => parts
            .iter_mut()
            .filter_map(|part| part.get_mut("text"))
            .fold(false, |changed, text| shorten_slot(text) | changed),
        _ => false,
    }
}

/// Builds the view: the longest adopted compaction whose covered prefix this request
/// carries, or the request as it is.
pub fn project_view<'a>(
    request: &'a ChatRequest,
    tracked: &'a Tracked,
    adopted: &HashMap<PrefixDigest, Arc<Adopted>>,
) -> ModelView<'a> {
    let (pinned, rest) = request.messages.split_at(tracked.pinned_len);
    let pinned = pinned
        .iter()
        .zip(&tracked.pinned_digests)
        .map(|(m, digest)| ViewMessage {
            raw: &m.raw,
            message: m,
            digest: *digest,
        })
        .collect();
    // Newest first: the longest covered prefix wins. The last message is never covered,
    // so a handoff is always followed by something.
    let found = (0..rest.len().saturating_sub(1)).rev().find_map(|i| {
        adopted
            .get(&tracked.prefix[i])
            .filter(|a| a.covered() == i + 1)
            .cloned()
    });
    let live_start = found.as_ref().map_or(0, |a| a.covered());
    let dialect = request.dialect;
    let joined = found.as_ref().and_then(|adopted| {
        let next = rest.get(live_start)?;
        let value = dialect.get().joined_pair(
            &adopted.record.continuation,
            &adopted.record.handoff,
            next,
        )?;
        serde_json::value::to_raw_value(&value).ok()
    });
    let lifted = rest[..live_start]
        .iter()
        .filter(|m| m.role.is_instruction())
        .collect();
    ModelView {
        dialect,
        top_level: request.top_level,
        joined,
        pair_end: None,
        pinned,
        lifted,
        rescued: Vec::new(),
        compaction: found,
        live: Cow::Borrowed(&rest[live_start..]),
        live_digests: Cow::Borrowed(&tracked.message_digests[live_start..]),
        live_start,
        list: request.list.clone(),
        compacted_history: request.compacted_history,
        expanded: request.expanded.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_results_are_shortened_in_every_dialects_shape() {
        let long = "x".repeat(20_000);
        let mut openai = json!({"role": "tool", "tool_call_id": "c", "content": long});
        let mut anthropic = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": long}]},
            {"type": "text", "text": long}]});
        let mut responses = json!({"type": "function_call_output", "call_id": "c", "output": long});
        let shorten = |kind: DialectKind, message: &mut Value| {
            kind.get().shorten_tool_results(message, &mut shorten_slot)
        };
        for (kind, message) in [
            (DialectKind::OpenAiChat, &mut openai),
            (DialectKind::Anthropic, &mut anthropic),
            (DialectKind::Responses, &mut responses),
        ] {
            assert!(shorten(kind, message), "{message}");
            assert!(message.to_string().len() < 20_000 + 8_000);
        }
        // The user's own text next to a tool result is not a tool body.
        assert_eq!(
            anthropic["content"][1]["text"].as_str().map(str::len),
            Some(20_000)
        );
        let mut short = json!({"type": "function_call_output", "call_id": "c", "output": "ok"});
        assert!(!shorten(DialectKind::Responses, &mut short));
    }

    #[test]
    fn the_provider_is_counted_from_its_latest_compaction_and_its_sealed_content_is_no_text() {
        let tokens = Tokens::new(crate::dialect::text::message_text);
        let estimate = |input: Value| {
            let body = json!({"model": "m", "instructions": "Be brief.", "input": input});
            let request = DialectKind::Responses
                .get()
                .parse(body.to_string().as_bytes())
                .unwrap();
            let tenant = crate::base::tenant::TenantId::parse("team").unwrap();
            let id = crate::base::id::ConversationId::parse(tenant, "counted").unwrap();
            let tracked = Tracked::compute(id, &request);
            project_view(&request, &tracked, &HashMap::new()).estimate(
                &tokens,
                Tokenizer::Estimate,
                0,
            )
        };
        let old = json!({"role": "user", "content": "an old turn ".repeat(500)});
        let item = |sealed: &str| json!({"type": "compaction", "encrypted_content": sealed});
        let next = json!({"role": "user", "content": "go on"});
        let kept = estimate(json!([item("gAAAAAB"), next]));
        assert_eq!(estimate(json!([old, item("gAAAAAB"), next])), kept);
        assert_eq!(estimate(json!([item(&"Qz9".repeat(4000)), next])), kept);
        // A trigger is a control, not compacted history: all before it is counted.
        let asking = estimate(json!([old, next, {"type": "compaction_trigger"}]));
        assert!(asking > estimate(json!([next, {"type": "compaction_trigger"}])) + 500);
    }

    #[test]
    fn the_cached_estimate_is_the_estimate_once_each_message_was_counted() {
        let tokens = Tokens::new(crate::dialect::text::message_text);
        let body = json!({"model": "m", "messages": [
            {"role": "system", "content": "You are terse, and you answer in one word."},
            {"role": "user", "content": "What is the capital of France, in one word?"},
            {"role": "assistant", "content": "Paris."},
            {"role": "user", "content": "And the capital of Spain, in one word?"}]});
        let request = ChatRequest::parse(body.to_string().as_bytes()).unwrap();
        let tenant = crate::base::tenant::TenantId::parse("team").unwrap();
        let id = crate::base::id::ConversationId::parse(tenant, "estimate").unwrap();
        let tracked = Tracked::compute(id, &request);
        let view = project_view(&request, &tracked, &HashMap::new());
        let tokenizer = Tokenizer::Estimate;
        let bytes: usize = request
            .messages
            .iter()
            .map(|m| m.raw.as_bytes().len())
            .sum();
        assert_eq!(view.cached_estimate(&tokens, tokenizer, 7), Err(bytes));
        // Counting one message leaves the others' bytes.
        request.messages[2].token_count(&tokens, tokenizer);
        let rest = bytes - request.messages[2].raw.as_bytes().len();
        assert_eq!(view.cached_estimate(&tokens, tokenizer, 7), Err(rest));
        let estimate = view.estimate(&tokens, tokenizer, 7);
        assert!(estimate > 7 + REPLY_PRIMING);
        assert_eq!(view.cached_estimate(&tokens, tokenizer, 7), Ok(estimate));
        // The same messages read afresh find their counts in the cache.
        let again = ChatRequest::parse(body.to_string().as_bytes()).unwrap();
        let view = project_view(&again, &tracked, &HashMap::new());
        assert_eq!(view.cached_estimate(&tokens, tokenizer, 7), Ok(estimate));
    }
}
