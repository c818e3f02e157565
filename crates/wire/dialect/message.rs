//! Dialect-neutral messages: a role, the parsed value and the raw bytes exactly as the
//! client sent them, and the tool ids a message calls or answers, in either wire shape.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;
use twox_hash::XxHash3_128;

use super::objects::may_name_objects;
use super::DialectKind;
use crate::base::chunks::keyed_hash;
use crate::base::digest::{message_digest, MessageDigest};
use crate::config::Tokenizer;
use crate::dialect::echo::{echo_digest, identity_digest, reference_digest};
use crate::tokens::Tokens;

/// Why a request body was refused.
#[derive(Debug, thiserror::Error)]
pub enum DialectError {
    /// The body is not JSON, or not the expected shape; carries line and column.
    #[error("request body is not a valid {api} request: {source}")]
    Json {
        /// The API the body was read as.
        api: &'static str,
        /// Where it went wrong.
        source: serde_json::Error,
    },
    /// A message is not a JSON object.
    #[error("messages[{index}] is not an object")]
    NotAnObject {
        /// Position in `messages`.
        index: usize,
    },
    /// A message has no `role` string.
    #[error("messages[{index}].role: missing; every message needs a role")]
    MissingRole {
        /// Position in `messages`.
        index: usize,
    },
    /// A tool result answers no pending call.
    #[error("messages[{index}]: tool result for id {id:?} does not answer a tool call of the preceding assistant message")]
    OrphanToolResult {
        /// Position in `messages`.
        index: usize,
        /// The unmatched id.
        id: String,
    },
    /// An assistant's tool calls are not all answered before the next turn.
    #[error("messages[{index}]: assistant tool calls are not answered by the next message(s) for ids {ids:?}")]
    UnansweredToolCalls {
        /// Position of the assistant message.
        index: usize,
        /// The ids with no answer.
        ids: Vec<String>,
    },
    /// A structural rule of the API is broken (e.g. a tool result not first).
    #[error("messages[{index}]: {rule}")]
    Shape {
        /// Position in `messages`.
        index: usize,
        /// The rule.
        rule: String,
    },
}

impl DialectError {
    /// The error for a body that is not the expected JSON.
    pub fn json(api: &'static str, source: serde_json::Error) -> Self {
        Self::Json { api, source }
    }
}

/// A message's role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// `system`, or Anthropic's top-level `system` as a pinned message.
    System,
    /// `developer`, the newer name for system on OpenAI reasoning models.
    Developer,
    /// `user`.
    User,
    /// `assistant`.
    Assistant,
    /// `tool`, a tool result.
    Tool,
    /// `function`, the legacy tool result.
    Function,
    /// A role handoff does not know: kept and sent as it is, the provider decides.
    Other,
}

impl Role {
    /// The role named `text`; a name no dialect knows is [`Role::Other`].
    pub fn parse(text: &str) -> Self {
        match text {
            "system" => Role::System,
            "developer" => Role::Developer,
            "user" => Role::User,
            "assistant" => Role::Assistant,
            "tool" => Role::Tool,
            "function" => Role::Function,
            _ => Role::Other,
        }
    }

    /// The name it is sent under; none for [`Role::Other`], whose name is the message's.
    pub fn name(self) -> Option<&'static str> {
        Some(match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Function => "function",
            Role::Other => return None,
        })
    }

    /// True for the roles that may be pinned at the head of a request.
    pub fn is_instruction(self) -> bool {
        matches!(self, Role::System | Role::Developer)
    }
}

/// What the pipeline needs of a message without reading its content: its role and
/// digest, and the tool ids it calls and answers. Computed once per distinct message
/// (per dialect) and cached by a keyed hash of its raw bytes, so a message that comes
/// back in every request of a conversation is parsed and digested once.
#[derive(Debug)]
pub(super) struct Facts {
    role: Role,
    digest: MessageDigest,
    /// The digest of its echo forms ([`echo_digest`]), if it has any.
    echo: Option<MessageDigest>,
    /// The echo digest of an `item_reference` to it ([`reference_digest`]).
    reference: Option<MessageDigest>,
    /// A keyed hash of its bytes ([`keyed_hash`]): which form of a logged message a
    /// client sent, compared in memory.
    key: u128,
    /// The digest that names a conversation it opens ([`identity_digest`]).
    identity: MessageDigest,
    calls: Box<[Box<str>]>,
    answers: Box<[Box<str>]>,
    item_type: Option<Box<str>>,
    /// A `reasoning` item, or a reference to one: it travels with the item after it.
    glues: bool,
    tool_answer: bool,
    /// One of the provider's own compaction artefacts ([`PROVIDER_COMPACTION`]).
    provider_compaction: bool,
    /// False when an Anthropic `tool_result` block follows another kind of block.
    results_lead: bool,
    /// Token counts, by tokenizer, filled on first use.
    counts: [OnceLock<u32>; TOKENIZERS],
    /// Whether its bytes may name upstream objects ([`may_name_objects`]), read on
    /// first use: a shared key's ownership check then searches each message once.
    names_objects: OnceLock<bool>,
    /// One consumer's verdict on these bytes ([`Message::remembered`]): its key in the
    /// high half, the verdict in the low half, 0 when none is kept.
    memo: AtomicU64,
}

/// How many tokenizers there are (`Tokenizer as usize` indexes `Facts::counts`).
const TOKENIZERS: usize = 3;

/// Distinct messages whose facts are kept, and the bytes they may hold, unless
/// [`size_facts_cache`] said otherwise before the first message was parsed.
static FACTS_ENTRIES: AtomicUsize = AtomicUsize::new(500_000);
static FACTS_BYTES: AtomicUsize = AtomicUsize::new(32 << 20);

/// Sets how many messages' facts are kept (`store.facts_cache_entries`) and the bytes
/// they may hold in all (half of `store.message_cache_bytes`); only the first parse
/// reads them, so call it at start.
pub fn size_facts_cache(entries: usize, bytes: usize) {
    FACTS_ENTRIES.store(entries.max(1), Ordering::Relaxed);
    FACTS_BYTES.store(bytes.max(1), Ordering::Relaxed);
}

impl Facts {
    /// The bytes it holds: itself and the client's strings in it (tool call ids can
    /// be kilobytes each, thousands to a message).
    pub(super) fn bytes(&self) -> u64 {
        let strings = |list: &[Box<str>]| -> usize {
            list.iter()
                .map(|s| s.len() + std::mem::size_of::<Box<str>>())
                .sum()
        };
        let held = std::mem::size_of::<Self>()
            + strings(&self.calls)
            + strings(&self.answers)
            + self.item_type.as_ref().map_or(0, |t| t.len());
        held as u64
    }
}

/// Weighs facts by their bytes, and each at least a share of the budget, so the count
/// limit holds too.
#[derive(Clone)]
struct ByBytes {
    least: u64,
}

impl quick_cache::Weighter<(u128, u8), Arc<Facts>> for ByBytes {
    fn weight(&self, _key: &(u128, u8), facts: &Arc<Facts>) -> u64 {
        facts.bytes().max(self.least)
    }
}

/// The facts cache: keyed by a 128-bit xxh3 of the raw bytes, seeded per process so
/// no one can craft a message that collides with another's, and by dialect; weighed
/// in bytes.
struct FactsCache {
    seed: u64,
    entries: quick_cache::sync::Cache<(u128, u8), Arc<Facts>, ByBytes>,
}

fn facts_cache() -> &'static FactsCache {
    static CACHE: OnceLock<FactsCache> = OnceLock::new();
    CACHE.get_or_init(|| {
        let entries = FACTS_ENTRIES.load(Ordering::Relaxed);
        let bytes = FACTS_BYTES.load(Ordering::Relaxed) as u64;
        FactsCache {
            seed: RandomState::new().hash_one(0x68616e646f6666_u64),
            entries: quick_cache::sync::Cache::with_weighter(
                entries.min(1 << 16),
                bytes,
                ByBytes {
                    least: (bytes / entries as u64).max(1),
                },
            ),
        }
    })
}

/// Empties the facts cache: the messages of an erased conversation leave no trace here.
pub(crate) fn clear_facts() {
    facts_cache().entries.clear();
}

/// True for a `reasoning` item and for an `item_reference` to one: the API refuses
/// either without the item that follows it. A reference names its item by id only,
/// and the API gives reasoning items the `rs_` prefix.
fn glues_to_next(value: &Value) -> bool {
    match value.get("type").and_then(Value::as_str) {
        Some("reasoning") => true,
        Some(super::objects::REFERENCE_TYPE) => value
            .get("id")
            .and_then(Value::as_str)
            .is_some_and(|id| id.starts_with("rs_")),
        _ => false,
    }
}

/// A message's bytes exactly as received: a slice of the request body it came in
/// (shared, not copied), or its own buffer when handoff made it.
#[derive(Debug, Clone)]
pub struct RawMessage(Bytes);

impl RawMessage {
    /// The slice of `body` that `part` (borrowed from `body`'s bytes) spans; a copy if
    /// it does not lie inside `body`.
    pub fn within(body: &Bytes, part: &str) -> Self {
        let start = (part.as_ptr() as usize).wrapping_sub(body.as_ptr() as usize);
        if start <= body.len() && part.len() <= body.len() - start {
            Self(body.slice(start..start + part.len()))
        } else {
            Self(Bytes::copy_from_slice(part.as_bytes()))
        }
    }

    /// A message's bytes cut from a body, shared.
    pub(super) fn shared(bytes: Bytes) -> Self {
        Self(bytes)
    }

    /// Its bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// Its text; JSON read from a body is UTF-8, so this never falls back.
    pub fn get(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or("null")
    }

    /// As a `RawValue`, for a log line.
    pub fn to_raw_value(&self) -> Box<RawValue> {
        RawValue::from_string(self.get().to_owned()).unwrap_or_else(|_| RawValue::NULL.to_owned())
    }
}

impl From<String> for RawMessage {
    fn from(text: String) -> Self {
        Self(Bytes::from(text))
    }
}

/// One message: its role, its bytes exactly as received, its digest, and its parsed
/// value, read only when something needs the content.
#[derive(Debug)]
pub struct Message {
    /// The role.
    pub role: Role,
    /// The message exactly as the client sent it.
    pub raw: RawMessage,
    facts: Arc<Facts>,
    value: OnceLock<Value>,
}

impl Clone for Message {
    fn clone(&self) -> Self {
        let value = OnceLock::new();
        if let Some(parsed) = self.value.get() {
            let _ = value.set(parsed.clone());
        }
        Self {
            role: self.role,
            raw: self.raw.clone(),
            facts: Arc::clone(&self.facts),
            value,
        }
    }
}

fn strings<'v>(ids: impl Iterator<Item = &'v str>) -> Box<[Box<str>]> {
    ids.map(Box::from).collect()
}

impl Message {
    /// A message from its raw JSON, its role known to the caller; the facts come from
    /// the cache when these bytes were seen before in `dialect`, else from parsing.
    pub fn read(
        raw: RawMessage,
        dialect: DialectKind,
        role: impl FnOnce(&Value) -> Result<Role, DialectError>,
    ) -> Result<Self, DialectError> {
        let api = dialect.api();
        let cache = facts_cache();
        let key = (
            // Per tenant: no request finds (or times) another tenant's messages.
            XxHash3_128::oneshot_with_seed(
                cache.seed ^ crate::cache_scope::current(),
                raw.as_bytes(),
            ),
            dialect as u8,
        );
        if let Some(facts) = cache.entries.get(&key) {
            return Ok(Self {
                role: facts.role,
                raw,
                facts,
                value: OnceLock::new(),
            });
        }
        let value: Value =
            serde_json::from_str(raw.get()).map_err(|err| DialectError::json(api, err))?;
        let message = Self::parsed(role(&value)?, raw, value);
        cache.entries.insert(key, Arc::clone(&message.facts));
        Ok(message)
    }

    /// A message whose bytes were read before in this dialect, with the facts read then.
    pub(super) fn known(raw: RawMessage, facts: Arc<Facts>) -> Self {
        Self {
            role: facts.role,
            raw,
            facts,
            value: OnceLock::new(),
        }
    }

    /// Its facts, shared, for a later body that repeats its bytes.
    pub(super) fn shared_facts(&self) -> Arc<Facts> {
        Arc::clone(&self.facts)
    }

    /// A message from a value already parsed (or made), with `raw` its bytes.
    pub fn parsed(role: Role, raw: RawMessage, value: Value) -> Self {
        let digest = message_digest(&value);
        let facts = Facts {
            role,
            digest,
            echo: echo_digest(&value),
            reference: reference_digest(&value),
            key: keyed_hash(raw.as_bytes()),
            identity: identity_digest(&value, digest),
            calls: strings(calls_in(&value)),
            answers: strings(answers_in(&value)),
            item_type: value.get("type").and_then(Value::as_str).map(Box::from),
            glues: glues_to_next(&value),
            tool_answer: match role {
                Role::Tool | Role::Function => true,
                Role::User => {
                    blocks(&value, "tool_result").next().is_some()
                        || gemini_parts(&value, crate::dialect::gemini::names::FUNCTION_RESPONSE)
                            .next()
                            .is_some()
                }
                _ => false,
            },
            provider_compaction: is_provider_compaction(&value),
            results_lead: results_lead(&value),
            counts: Default::default(),
            names_objects: OnceLock::new(),
            memo: AtomicU64::new(0),
        };
        Self {
            role,
            raw,
            facts: Arc::new(facts),
            value: OnceLock::from(value),
        }
    }

    /// Reads one chat-style message (`role` field) from its raw JSON. Any role name is
    /// taken (the provider decides what it accepts); a message that is not an object,
    /// or has no role at all, is not the API's shape.
    pub fn from_raw(
        index: usize,
        raw: RawMessage,
        dialect: DialectKind,
    ) -> Result<Self, DialectError> {
        Self::read(raw, dialect, |value| {
            let Value::Object(map) = value else {
                return Err(DialectError::NotAnObject { index });
            };
            match map.get("role").and_then(Value::as_str) {
                Some(role) => Ok(Role::parse(role)),
                None => Err(DialectError::MissingRole { index }),
            }
        })
    }

    /// The parsed message (parsed now if it came from the cache); with serde_json's
    /// sorted maps it prints canonically.
    pub fn value(&self) -> &Value {
        self.value
            .get_or_init(|| serde_json::from_str(self.raw.get()).unwrap_or(Value::Null))
    }

    /// The digest of the message's canonical JSON.
    pub fn digest(&self) -> MessageDigest {
        self.facts.digest
    }

    /// The digest of the forms clients echo it in, if it has more than one.
    pub fn echo_digest(&self) -> Option<MessageDigest> {
        self.facts.echo
    }

    /// The echo digest of an `item_reference` to this item, if it has an `id`.
    pub fn reference_digest(&self) -> Option<MessageDigest> {
        self.facts.reference
    }

    /// A keyed hash of its bytes ([`keyed_hash`]), for in-memory comparison only.
    pub fn bytes_key(&self) -> u128 {
        self.facts.key
    }

    /// The digest naming a conversation this message opens.
    pub fn identity_digest(&self) -> MessageDigest {
        self.facts.identity
    }

    /// Its tokens with `tokenizer`, overhead included: counted once per distinct
    /// message, then read from its facts without a cache lookup.
    pub fn token_count(&self, tokens: &Tokens, tokenizer: Tokenizer) -> u64 {
        let slot = &self.facts.counts[tokenizer as usize % TOKENIZERS];
        let count = slot.get_or_init(|| {
            let count = tokens.count_lazy(tokenizer, &self.facts.digest, || self.value());
            u32::try_from(count).unwrap_or(u32::MAX)
        });
        u64::from(*count)
    }

    /// Its tokens with `tokenizer` when counted before (in its facts or the cache),
    /// without tokenising it.
    pub fn cached_count(&self, tokens: &Tokens, tokenizer: Tokenizer) -> Option<u64> {
        let slot = &self.facts.counts[tokenizer as usize % TOKENIZERS];
        if let Some(count) = slot.get() {
            return Some(u64::from(*count));
        }
        let count = tokens.cached(tokenizer, &self.facts.digest)?;
        Some(u64::from(
            *slot.get_or_init(|| u32::try_from(count).unwrap_or(u32::MAX)),
        ))
    }

    /// True when its bytes may name upstream objects ([`may_name_objects`]): searched
    /// once per distinct message, then read from its facts.
    pub fn may_name_objects(&self) -> bool {
        *self
            .facts
            .names_objects
            .get_or_init(|| may_name_objects(self.raw.as_bytes()))
    }

    /// The verdict `compute` gives on this message, kept with its facts under `key`, so
    /// every request that repeats these bytes reads it instead of parsing them. One
    /// verdict is kept: a consumer with another key (a rebuilt config) replaces it.
    pub fn remembered(&self, key: NonZeroU32, compute: impl FnOnce() -> u32) -> u32 {
        let key = u64::from(key.get()) << 32;
        let kept = self.facts.memo.load(Ordering::Relaxed);
        if kept & !u64::from(u32::MAX) == key {
            return kept as u32;
        }
        let verdict = compute();
        self.facts
            .memo
            .store(key | u64::from(verdict), Ordering::Relaxed);
        verdict
    }

    /// The Responses item type (`function_call`, `reasoning`, …), if it has one.
    pub fn item_type(&self) -> Option<&str> {
        self.facts.item_type.as_deref()
    }

    /// True for a Responses `reasoning` item, which must travel with the item after it.
    pub fn glues_to_next(&self) -> bool {
        self.facts.glues
    }

    /// True for a message of text (any dialect), as opposed to a call or a reasoning item.
    pub fn is_text_message(&self) -> bool {
        matches!(self.item_type(), None | Some("message"))
    }

    /// The ids of the tools this message calls: OpenAI `tool_calls`, Anthropic
    /// `tool_use` blocks, a Responses `function_call`/`custom_tool_call` item.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = &str> {
        self.facts.calls.iter().map(|id| &**id)
    }

    /// True for an assistant message that calls tools.
    pub fn has_tool_calls(&self) -> bool {
        !self.facts.calls.is_empty()
    }

    /// The `tool_call_id` an OpenAI tool message answers.
    pub fn tool_call_id(&self) -> Option<&str> {
        match self.role {
            Role::Tool | Role::Function => self.facts.answers.first().map(|id| &**id),
            _ => None,
        }
    }

    /// The ids this message answers: a tool message's `tool_call_id`, the
    /// `tool_use_id` of each Anthropic `tool_result` block, a Responses output's
    /// `call_id`.
    pub fn answered_ids(&self) -> Vec<&str> {
        self.facts.answers.iter().map(|id| &**id).collect()
    }

    /// True for a message that carries tool results (and so belongs to the unit of the
    /// assistant turn that called them).
    pub fn is_tool_answer(&self) -> bool {
        self.facts.tool_answer
    }

    /// True for a provider's own compaction artefact ([`PROVIDER_COMPACTION`]): a
    /// boundary handoff's compaction never crosses.
    pub fn is_provider_compaction(&self) -> bool {
        self.facts.provider_compaction
    }

    /// True for the history a provider's compaction minted (an item or a block that
    /// stands for what it compacted), not the control that asks it to compact: the
    /// provider reads the list from the latest one on.
    pub fn is_compacted_history(&self) -> bool {
        self.facts.provider_compaction && !self.is_compaction_trigger()
    }

    /// True for the Responses `compaction_trigger` item: the client's ask that the API
    /// compact what precedes it.
    pub fn is_compaction_trigger(&self) -> bool {
        self.item_type() == Some(COMPACTION_TRIGGER)
    }

    /// The compaction handle handoff minted that this message is (a Responses
    /// `compaction` item) or carries (an Anthropic `compaction` block): its sealed text,
    /// unverified.
    pub fn handle(&self) -> Option<&str> {
        if !self.is_compacted_history() {
            return None;
        }
        let value = self.value();
        sealed_handle(value).or_else(|| blocks(value, "compaction").find_map(sealed_handle))
    }

    /// True unless an Anthropic `tool_result` block comes after another kind of block
    /// (the Messages API wants them first).
    pub(crate) fn tool_results_lead(&self) -> bool {
        self.facts.results_lead
    }
}

/// The `encrypted_content` of an item or block, when it is a handle handoff minted.
fn sealed_handle(value: &Value) -> Option<&str> {
    (value.get("encrypted_content").and_then(Value::as_str))
        .filter(|text| text.starts_with(super::HANDLE_PREFIX))
}

/// The content blocks of an Anthropic-shaped message (empty for a string content).
fn blocks<'v>(value: &'v Value, kind: &'static str) -> impl Iterator<Item = &'v Value> {
    value
        .get("content")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(move |block| block.get("type").and_then(Value::as_str) == Some(kind))
}

/// The item and block types of the providers' own compaction: a Responses `compaction`
/// item (`compaction_summary` its earlier name) and the `compaction_trigger` control
/// item that asks for one, an Anthropic `compaction` content block. The provider owns
/// them: handoff never summarises, moves or rewrites one.
pub(super) const PROVIDER_COMPACTION: &[&str] =
    &["compaction", "compaction_summary", COMPACTION_TRIGGER];

/// The Responses input item that asks the provider to compact what precedes it.
pub(super) const COMPACTION_TRIGGER: &str = "compaction_trigger";

/// True for a message that is, or carries, a provider compaction artefact.
pub fn is_provider_compaction(value: &Value) -> bool {
    let kind = value.get("type").and_then(Value::as_str);
    kind.is_some_and(|kind| PROVIDER_COMPACTION.contains(&kind))
        || blocks(value, "compaction").next().is_some()
}

/// True unless a `tool_result` block follows a block of another kind.
fn results_lead(value: &Value) -> bool {
    let Some(blocks) = value.get("content").and_then(Value::as_array) else {
        return true;
    };
    let is_result = |b: &Value| b.get("type").and_then(Value::as_str) == Some("tool_result");
    let leading = blocks.iter().take_while(|b| is_result(b)).count();
    !blocks[leading..].iter().any(is_result)
}

/// The functions of a Gemini content's `kind` parts (`functionCall`,
/// `functionResponse`), by name: a call may carry no id, and Gemini CLI gives only the
/// response one, so the name is what pairs them for units.
fn gemini_parts(
    value: &Value,
    kind: crate::dialect::gemini::names::Name,
) -> impl Iterator<Item = &str> {
    value
        .get("parts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(move |part| crate::dialect::gemini::names::get(part, kind))
        .filter_map(|function| function.get("name").and_then(Value::as_str))
}

fn item_type(value: &Value) -> Option<&str> {
    value.get("type").and_then(Value::as_str)
}

/// The tool ids `value` calls, in any dialect's shape.
fn calls_in(value: &Value) -> impl Iterator<Item = &str> {
    let openai = value
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|call| call.get("id").and_then(Value::as_str));
    let anthropic =
        blocks(value, "tool_use").filter_map(|block| block.get("id").and_then(Value::as_str));
    let item = matches!(item_type(value), Some("function_call" | "custom_tool_call"))
        .then(|| value.get("call_id").and_then(Value::as_str))
        .flatten();
    openai.chain(anthropic).chain(item).chain(gemini_parts(
        value,
        crate::dialect::gemini::names::FUNCTION_CALL,
    ))
}

/// The tool ids `value` answers, in any dialect's shape.
fn answers_in(value: &Value) -> impl Iterator<Item = &str> {
    let openai = value.get("tool_call_id").and_then(Value::as_str);
    let anthropic = blocks(value, "tool_result")
        .filter_map(|block| block.get("tool_use_id").and_then(Value::as_str));
    let item = matches!(
        item_type(value),
        Some("function_call_output" | "custom_tool_call_output")
    )
    .then(|| value.get("call_id").and_then(Value::as_str))
    .flatten();
    openai
        .into_iter()
        .chain(anthropic)
        .chain(item)
        .chain(gemini_parts(
            value,
            crate::dialect::gemini::names::FUNCTION_RESPONSE,
        ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::cache_scope::{of, within};

    fn facts_found(bytes: &Bytes) -> bool {
        let cache = facts_cache();
        let seed = cache.seed ^ crate::cache_scope::current();
        let key = (
            XxHash3_128::oneshot_with_seed(seed, bytes),
            DialectKind::default() as u8,
        );
        cache.entries.get(&key).is_some()
    }

    #[tokio::test]
    async fn a_message_s_facts_are_found_only_in_its_tenant_s_scope() {
        let bytes = Bytes::from_static(br#"{"role":"user","content":"only team a sent this"}"#);
        let (a, b) = (of("facts-test-a"), of("facts-test-b"));
        within(a, async {
            Message::read(
                RawMessage::shared(bytes.clone()),
                DialectKind::default(),
                |_| Ok(Role::User),
            )
            .unwrap();
        })
        .await;
        assert!(within(a, async { facts_found(&bytes) }).await);
        assert!(!within(b, async { facts_found(&bytes) }).await);
        assert!(!facts_found(&bytes), "nor outside any tenant's work");
    }
}
