//! Reply capture: the upstream's answer becomes the next original in the log before
//! the client sees its end.
//!
//! A non-streamed reply is read whole, logged, then answered. A streamed reply is
//! watched frame by frame ([`ReplyCapture`]) and parsed on the side; its last frame is
//! held by the relay until the reply is logged. A reply cut short (the client left,
//! the upstream broke or went silent) is still logged with what arrived, marked
//! incomplete. A reply that cannot be logged is warned about and counted; with
//! `store.required` the client then gets no clean end.

mod final_event;
mod stream;

use std::sync::Arc;
use std::time::Duration;

pub(crate) use stream::ReplyCapture;

use crate::base::digest::{message_digest, PrefixDigest};
use crate::base::line::DecisionLine;
use crate::base::outcome::Outcome;
use crate::base::reply::{Assembled, CapturedReply};
use crate::compaction::budget::Calibration;
use crate::config::{Billed, Price, Tokenizer};
use crate::conversation::{CapturedReplies, ConversationId, Tracker};
use crate::dialect::objects::REFERENCE_TYPE;
use crate::dialect::DialectKind;
use crate::metrics::{Metrics, COST_USD, REPLIES_UNLOGGED, UNPRICED_REPLIES};
use crate::relay::RelayError;
use crate::tokens::Tokens;

/// How long the end of a response may wait for its reply to be logged.
const LOG_DEADLINE: Duration = Duration::from_secs(5);

/// Where a captured reply belongs, and what to do when it cannot be logged.
pub(crate) struct ReplyTarget {
    /// The tracker that logs it.
    pub tracker: Arc<Tracker>,
    /// The conversation.
    pub id: ConversationId,
    /// Chain digest of the request's last message.
    pub parent: Option<PrefixDigest>,
    /// The request's model.
    pub model: String,
    /// The wire format of the reply.
    pub dialect: DialectKind,
    /// The local estimate of the view sent, and the compaction it was built on, to calibrate against usage.
    pub estimate: Option<(u64, Option<String>)>,
    /// `store.required`: a reply that cannot be logged must not end cleanly.
    pub required: bool,
    /// The server-side conversation the request continued, which this reply moves on.
    pub conversation: Option<String>,
    /// Where failures are counted, and what the reply cost.
    pub metrics: Arc<Metrics>,
    /// The model's price and its `[prices]` key; `None`: the reply is unpriced.
    pub price: Option<(String, Price)>,
    /// For a Responses reply, the token counter and the model's tokenizer: each output
    /// item with an `id` is counted under the digest of an `item_reference` to it, as
    /// the API expands a reference to the item it names, so a later request carrying
    /// the reference is estimated at the item's size.
    pub references: Option<(Arc<Tokens>, Tokenizer)>,
    /// What the proxy decided for the request: logged before the replies.
    pub decision: Option<DecisionLine>,
    /// Given the reply's messages once they are logged (the reply-stage hooks); it
    /// must not block, for a stream's end waits for the log.
    pub after: Option<AfterReply>,
    /// A compaction handoff served in front of a streamed reply (a Responses item, a
    /// Messages block): logged first, as the client got it.
    pub prepend: Option<serde_json::Value>,
    /// The request's trace context: its span learns the reply's usage and finish
    /// reasons (a stream ends on the connection's task, outside the request's).
    pub trace: opentelemetry::Context,
}

/// What sees a reply after it was logged.
pub(crate) type AfterReply = Box<dyn FnOnce(Vec<Box<serde_json::value::RawValue>>) + Send + Sync>;

/// Counts each item of `items` that has an `id` under the digest of a reference to it,
/// off the async threads.
fn count_references(items: Vec<String>, tokens: Arc<Tokens>, tokenizer: Tokenizer) {
    if items.is_empty() {
        return;
    }
    tokio::task::spawn_blocking(move || {
        for item in items {
            let Ok(value) = serde_json::from_str::<serde_json::Value>(&item) else {
                continue;
            };
            let Some(id) = value.get("id").and_then(serde_json::Value::as_str) else {
                continue;
            };
            let reference = serde_json::json!({"type": REFERENCE_TYPE, "id": id});
            tokens.count_message(tokenizer, &message_digest(&reference), &value);
        }
    });
}

/// Puts a served compaction `artefact` first in `replies`: an item of its own
/// (Responses; true, for the replies then follow one another), or the first block of
/// the message (Messages).
fn put_first(
    dialect: DialectKind,
    replies: &mut Vec<CapturedReply>,
    artefact: serde_json::Value,
) -> bool {
    let raw = |value: &serde_json::Value| {
        serde_json::value::RawValue::from_string(value.to_string()).ok()
    };
    if dialect == DialectKind::Anthropic {
        if let Some(first) = replies.first_mut() {
            let mut message: serde_json::Value =
                serde_json::from_str(first.message.get()).unwrap_or_default();
            if let Some(content) = message["content"].as_array_mut() {
                content.insert(0, artefact);
                if let Some(message) = raw(&message) {
                    first.message = message;
                }
            }
        }
        return false;
    }
    if let Some(message) = raw(&artefact) {
        replies.insert(
            0,
            CapturedReply {
                message,
                finish_reason: None,
                choice: 0,
            },
        );
    }
    true
}

impl ReplyTarget {
    /// Logs `replies`. `Err` only when they could not be logged and the store is
    /// required; otherwise a failure is warned about, counted, and the reply relayed.
    pub(crate) async fn log(
        mut self,
        assembled: Assembled,
        ended: Outcome,
    ) -> Result<(), RelayError> {
        crate::otel::reply(&self.trace, self.dialect, &assembled);
        let Assembled {
            mut replies,
            usage,
            mut sequence,
            response_id,
            mut edited_upstream,
        } = assembled;
        if let Some(artefact) = self.prepend.take() {
            sequence |= put_first(self.dialect, &mut replies, artefact);
            edited_upstream = true;
        }
        if let Some(billed) = usage.as_ref().and_then(|u| self.dialect.get().billed(u)) {
            self.count_cost(&billed);
        }
        if replies.is_empty() {
            self.note_decision().await;
            return Ok(());
        }
        let complete = ended == Outcome::Complete;
        let edited = edited_upstream
            || replies.iter().any(|reply| {
                serde_json::from_str::<serde_json::Value>(reply.message.get()).is_ok_and(|value| {
                    crate::conversation::counts_upstream_edits(&value, usage.as_ref())
                })
            });
        let calibration = self
            .estimate
            .as_ref()
            .filter(|_| complete && !edited)
            .and_then(|(local, compact_id)| {
                let server = self.dialect.get().input_tokens(usage.as_ref()?)?;
                Some(Calibration::new(
                    self.model.clone(),
                    compact_id.clone(),
                    *local,
                    server,
                ))
            });
        let after = self.after.take().map(|after| {
            let messages = replies.iter().map(|r| r.message.clone()).collect();
            (after, messages)
        });
        let items = match &self.references {
            Some(_) if sequence => replies.iter().map(|r| r.message.get().to_owned()).collect(),
            _ => Vec::new(),
        };
        let batch = CapturedReplies {
            dialect: self.dialect,
            parent: self.parent,
            model: self.model.clone(),
            usage,
            calibration,
            replies,
            sequence,
            response_id,
            conversation: self.conversation.clone(),
            incomplete: (!complete).then_some(ended),
            decision: self.decision.clone(),
        };
        let written =
            tokio::time::timeout(LOG_DEADLINE, self.tracker.record_replies(&self.id, batch)).await;
        if let Some((tokens, tokenizer)) = &self.references {
            count_references(items, Arc::clone(tokens), *tokenizer);
        }
        if let Some((after, messages)) = after {
            after(messages);
        }
        let reason = match written {
            Ok(Ok(())) => return Ok(()),
            Ok(Err(err)) => err.to_string(),
            Err(_) => format!("logging took longer than {LOG_DEADLINE:?}"),
        };
        self.unlogged("storage", &reason)
    }

    /// Counts what a reply billed as `billed` cost, or that it is unpriced.
    fn count_cost(&self, billed: &Billed) {
        match &self.price {
            Some((key, price)) => {
                let labels = [
                    ("price", key.as_str()),
                    ("tenant", self.id.tenant().as_str()),
                ];
                self.metrics.add(COST_USD, &labels, price.cost(billed));
            }
            None => self.metrics.add(UNPRICED_REPLIES, &[], 1.0),
        }
    }

    /// Logs the decision alone, for an answer with no reply to log it with.
    async fn note_decision(&self) {
        if let Some(decision) = self.decision.clone() {
            self.tracker.record_decision(&self.id, decision).await;
        }
    }

    /// Counts and reports a reply that did not reach the log.
    fn unlogged(&self, cause: &str, reason: &str) -> Result<(), RelayError> {
        self.metrics.add(REPLIES_UNLOGGED, &[("cause", cause)], 1.0);
        tracing::warn!(
            conversation = %self.id,
            cause,
            reason,
            required = self.required,
            "the reply could not be logged"
        );
        if self.required {
            Err(RelayError::Unlogged(reason.to_owned()))
        } else {
            Ok(())
        }
    }

    /// Logs a non-streamed reply, read whole.
    pub(crate) async fn log_json(self, body: &[u8]) -> Result<(), RelayError> {
        crate::otel::response_model(&self.trace, body);
        match self.dialect.get().replies_from_json(body) {
            Ok(assembled) => self.log(assembled, Outcome::Complete).await,
            Err(err) => {
                // Not a reply of the dialect (a proxy's own answer, a new API shape): there is no
                // reply to log, which is not a storage failure.
                tracing::warn!(conversation = %self.id, error = %err, "reply is not readable in its dialect; not logged");
                self.metrics
                    .add(REPLIES_UNLOGGED, &[("cause", "unreadable")], 1.0);
                self.note_decision().await;
                Ok(())
            }
        }
    }
}
