//! The plugin API of handoff: the compaction [`Strategy`] trait, what a strategy is
//! given ([`StrategyInput`]) and what it returns ([`Summary`] or [`AttemptError`]); and
//! the middleware [`Hook`] trait, what a hook sees ([`HookRequest`]) and decides
//! ([`HookDecision`]).
//!
//! A strategy turns the history being compacted into the text of a handoff. It never
//! sees the proxy's internals: it calls a model only through the [`ModelClient`] the
//! host hands it, and counts tokens with the host's [`TokenCounter`]. It must never
//! copy `retained_recent_messages` into its summary: the host keeps those verbatim.

#![forbid(unsafe_code)]

mod attempt;
mod facts;
mod hook;
mod rule;
mod shorten;
pub mod testing;
mod usage;

use std::sync::Arc;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use attempt::{AttemptError, FailureReason};
pub use facts::identifiers;
pub use hook::{
    each_string, Denial, Hook, HookDecision, HookError, HookReply, HookRequest, Redaction, Stage,
};
pub use rule::RuleSettings;
pub use shorten::{cap_head_tail, shorten_tool_body, TOOL_BODY_HEAD, TOOL_BODY_TAIL};
pub use tokio_util::sync::CancellationToken;
pub use usage::sum_usage;

/// The text a model reads in a message's `content`: the string, or the text parts of
/// an array joined by newlines (other parts are skipped).
pub fn content_text(message: &Value) -> String {
    match message.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A message's tool calls as `(id, name, arguments)`, missing parts as empty strings.
pub fn tool_calls(message: &Value) -> impl Iterator<Item = (&str, &str, &str)> {
    message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|call| {
            let text = |pointer: &str| call.pointer(pointer).and_then(Value::as_str).unwrap_or("");
            (
                text("/id"),
                text("/function/name"),
                text("/function/arguments"),
            )
        })
}

/// True when `text` matches `pattern`, where `*` matches any run of characters and
/// everything else itself: `gpt-4o*`, `*-instruct`, `meta-llama/*-70B-*`. Routes, key
/// rules and plugins all match model and path names this one way.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let Some(first) = parts.next() else {
        return text.is_empty();
    };
    let Some(mut rest) = text.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = parts.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty();
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

/// One unit of conversation: a user message, or an assistant message with every tool
/// result that answers its calls. A cut never falls inside a unit.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Unit {
    /// The unit's messages, in order, as the client sent them.
    pub messages: Vec<Value>,
}

/// The model a handoff is made for, and the one that writes summaries.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelInfo {
    /// The request's model.
    pub model: String,
    /// Its context window in tokens.
    pub context_window: u64,
    /// The model that writes summaries.
    pub summary_model: String,
    /// The summary model's context window in tokens.
    pub summary_context_window: u64,
}

/// Token budgets for one compaction.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
pub struct Budgets {
    /// Tokens the request's input may use: window minus reserved output.
    pub input_budget: u64,
    /// Largest handoff, in tokens, that leaves room for the recent part.
    pub handoff_tokens: u64,
    /// Most model calls one attempt may make (`compaction.max_summary_calls`): a
    /// strategy that folds a long history in several calls stops short of more.
    #[serde(default = "one_call")]
    pub max_calls: u32,
    /// The most a handoff may grow to, past `handoff_tokens`, to keep every compacted
    /// user message whole: what the view leaves under the trigger after the recent
    /// part. 0 (an older host) means no more than `handoff_tokens`.
    #[serde(default)]
    pub room_tokens: u64,
    /// Model calls one attempt may have in flight at once (`compaction.fold_concurrency`):
    /// a strategy that folds a long history may summarise its parts concurrently and
    /// merge them. 1 (an older host) means one call at a time.
    #[serde(default = "one_call")]
    pub parallel_calls: u32,
}

impl Budgets {
    /// The most tokens a handoff may take to keep the user's messages whole.
    pub fn user_room(&self) -> u64 {
        self.room_tokens.max(self.handoff_tokens)
    }
}

fn one_call() -> u32 {
    1
}

/// Everything a strategy is given.
#[derive(Clone)]
pub struct StrategyInput {
    /// The conversation.
    pub conversation_id: String,
    /// The client's wire format (`openai`, `anthropic`). Messages are always in the
    /// neutral (chat-completions) form; this says where they came from.
    pub dialect: String,
    /// The history being compacted, oldest first; a previous handoff is not in it.
    pub history: Vec<Unit>,
    /// The newest messages, kept verbatim by the host: reference only.
    pub retained_recent_messages: Vec<Value>,
    /// The handoff text of the previous compaction, if there was one.
    pub previous_handoff: Option<String>,
    /// Models and windows.
    pub model: ModelInfo,
    /// Budgets.
    pub budgets: Budgets,
    /// Fired when the compaction must stop (shutdown); checked by the host as well.
    pub cancel: CancellationToken,
    /// Calls to the upstream, with the client's credentials.
    pub client: Arc<dyn ModelClient>,
    /// The host's token counter for the summary model.
    pub tokens: Arc<dyn TokenCounter>,
    /// The conversation itself, continued: present when the summary model is the
    /// conversation's own, so a summary call can reuse the provider's prompt cache.
    pub conversation: Option<Arc<dyn ConversationClient>>,
}

/// A strategy's product: the handoff text and what the model charged for it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// The handoff text; never empty.
    pub text: String,
    /// The provider's `usage`, if a model was called; summed over every call.
    pub usage: Option<Value>,
    /// How many model calls it took, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calls: Option<u32>,
}

/// A compaction strategy.
pub trait Strategy: Send + Sync {
    /// The strategy's kind, e.g. `summarize`.
    fn kind(&self) -> &'static str;

    /// True when the strategy never calls a model and always produces a handoff; only
    /// such a strategy may end a chain.
    fn is_deterministic(&self) -> bool {
        false
    }

    /// The most model calls one attempt on `input` may make. The host bounds an attempt
    /// by this many times its time limit, so a strategy that folds a long history is
    /// not cut off for the length of the history alone.
    fn max_model_calls(&self, _input: &StrategyInput) -> u32 {
        1
    }

    /// Writes the handoff for `input`.
    fn summarize<'a>(
        &'a self,
        input: &'a StrategyInput,
    ) -> BoxFuture<'a, Result<Summary, AttemptError>>;
}

/// The upstream's answer to a model call.
#[derive(Debug, Clone)]
pub struct ModelReply {
    /// HTTP status.
    pub status: u16,
    /// The JSON body (`Null` if it was not JSON).
    pub body: Value,
}

/// Why a model call failed before an answer came back.
#[derive(Debug, Clone, thiserror::Error)]
#[error("model call failed: {0}")]
pub struct ModelCallError(pub String);

/// Chat-completion calls on the client's behalf.
pub trait ModelClient: Send + Sync {
    /// Sends a chat-completions request body and returns the answer.
    fn complete(&self, body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>>;
}

/// Calls that continue the conversation being compacted, as its upstream last saw it:
/// the request the client sent (its tools, system prompt, settings), its messages up
/// to the end of the history, then one user turn. The upstream reads that prefix from
/// its prompt cache, so such a call costs a fraction of one that renders the history
/// as text. The recent messages are never in it.
pub trait ConversationClient: Send + Sync {
    /// Tokens the continued prefix takes, as the conversation's model counts them.
    fn prefix_tokens(&self) -> u64;

    /// The reply, in the chat-completions shape, to `instruction` sent as a user turn
    /// after the history, with at most `max_tokens` of output.
    fn ask(
        &self,
        instruction: String,
        max_tokens: u64,
    ) -> BoxFuture<'_, Result<ModelReply, ModelCallError>>;
}

/// Token counting with the host's tokenizer for a model.
pub trait TokenCounter: Send + Sync {
    /// Tokens of `text`.
    fn count_text(&self, text: &str) -> u64;

    /// Tokens of a chat message, overhead included.
    fn count_message(&self, message: &Value) -> u64;
}
