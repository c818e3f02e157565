//! Wire formats. Each [`Dialect`] reads its API's requests into dialect-neutral
//! [`Message`]s (keeping every message's raw bytes), and owns everything else that
//! depends on the format: tool pairing, the handoff pair's shape, errors, overflow
//! detection, reply assembly, usage, and summary calls. The pipeline, tracking and
//! compaction only ever see the neutral form.

pub mod anthropic;
mod concerns;
mod continued;
pub mod echo;
pub mod gemini;
mod message;
pub mod objects;
pub mod openai;
pub mod overflow;
pub mod pair;
mod pinned;
mod prefix;
mod repeated;
pub mod responses;
#[cfg(feature = "stub")]
mod stub;
pub mod text;
mod translate;

use bytes::Bytes;
use serde_json::value::RawValue;
use serde_json::Value;

pub use concerns::{Api, Credentials, Dialect, Failures, Neutral, Pair, Parsing, Replies};
pub use continued::ContinuedCall;
pub use message::{
    is_provider_compaction, size_facts_cache, DialectError, Message, RawMessage, Role,
};
pub use openai::check_tool_pairs;
pub use prefix::size_prefix_cache;

/// Empties every cache of parsed messages (facts, built prompts, memos of recent
/// bodies): after an erasure, none of its text or ids stays in memory. They refill
/// from the next requests.
pub fn clear_message_caches() {
    message::clear_facts();
    pinned::clear();
    prefix::clear();
    repeated::clear();
}
use prefix::Reading;

use crate::base::reply::Assembled;
use crate::error::ApiError;

/// Registers the dialects: one line each, with the variant, its implementation and
/// its doc. This is the only place that lists them.
macro_rules! registry {
    ($($(#[cfg($cfg:meta)])? $variant:ident => $imp:path, $doc:literal;)*) => {
        /// The wire formats handoff understands. Non-exhaustive: a build may register
        /// more (the tests' stub), so a match outside this crate needs a default arm.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum DialectKind {
            $($(#[cfg($cfg)])? #[doc = $doc] $variant,)*
        }

        impl DialectKind {
            /// Every registered dialect, in registration order.
            pub const ALL: &'static [DialectKind] = &[$($(#[cfg($cfg)])? DialectKind::$variant,)*];

            /// The implementation.
            pub fn get(self) -> &'static dyn Dialect {
                match self {
                    $($(#[cfg($cfg)])? DialectKind::$variant => &$imp,)*
                }
            }
        }
    };
}

registry! {
    OpenAiChat => openai::OpenAiChat, "OpenAI chat completions, `POST …/chat/completions`.";
    Anthropic => anthropic::AnthropicMessages, "Anthropic Messages, `POST …/v1/messages`.";
    Responses => responses::OpenAiResponses, "OpenAI Responses, `POST …/v1/responses`.";
    Gemini => gemini::Gemini, "Google's Gemini API, `POST …/models/{model}:generateContent` and `:streamGenerateContent`.";
    #[cfg(feature = "stub")] Stub => stub::StubDialect, "A fourth format, built for tests only: what a new dialect touches.";
}

impl Default for DialectKind {
    /// OpenAI chat: the log's own format, and what a line without `dialect` was.
    fn default() -> Self {
        DialectKind::OpenAiChat
    }
}

impl DialectKind {
    /// The name used in logs, records and the exec protocol.
    pub fn name(self) -> &'static str {
        self.get().name()
    }

    /// The API's name in error messages.
    pub fn api(self) -> &'static str {
        self.get().api()
    }

    /// The dialect named `name` in a log line; unknown names read as OpenAI chat.
    pub fn from_name(name: Option<&str>) -> Self {
        name.and_then(|name| Self::ALL.iter().copied().find(|d| d.name() == name))
            .unwrap_or_default()
    }

    /// The dialect whose error shape answers a request for `path` (every path, so a
    /// 401 on `/v1/messages` is already in Anthropic's shape).
    pub fn for_path(path: &str) -> Self {
        Self::ALL
            .iter()
            .copied()
            .find(|d| d.get().answers_path(path))
            .unwrap_or_default()
    }

    /// The dialect that tracks `POST path`, if one does.
    pub fn tracking(path: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|d| d.get().tracks(path))
    }
}

/// The fields of a request that the proxy acts on, in any dialect.
#[derive(Debug, Clone)]
pub struct ChatRequest {
    /// The wire format it came in.
    pub dialect: DialectKind,
    /// The requested model; empty when the client sent none.
    pub model: String,
    /// Pinned messages first (OpenAI's leading system messages, Anthropic's top-level
    /// `system` as one system message), then the conversation in order.
    pub messages: Vec<Message>,
    /// How many leading pinned messages stand for top-level fields (`system`,
    /// `instructions`): tracked and counted, never rendered into the list.
    pub top_level: usize,
    /// True when the request asks the provider to compact the conversation itself:
    /// Responses `context_management` with a `compaction` entry or a trailing
    /// `compaction_trigger` item, Anthropic `context_management.edits` with a
    /// `compact_*` edit or an on-demand `compaction`. handoff then compacts only a view
    /// that would not fit the window.
    pub provider_compacts: bool,
    /// True when a message is, or carries, history a provider's compaction minted:
    /// only then is the list read from the latest one on, and looked up across it.
    pub compacted_history: bool,
    /// The latest compaction handle handoff minted that the request carries, opened:
    /// the view sends what it stands for in its place, and nothing before it but the
    /// top-level fields. Set once the handle's seal was verified.
    pub expanded: Option<std::sync::Arc<Expanded>>,
    /// What it asked of the provider's own context management (`context_management`,
    /// `compaction`, the compaction endpoint), kept for its request line.
    pub asked: Option<Box<crate::base::line::Asked>>,
    /// True when the upstream holds the conversation (`previous_response_id`,
    /// `conversation`): tracked and logged, never rewritten.
    pub server_held: bool,
    /// What a server-held request continues: its `previous_response_id`, else its
    /// `conversation` id.
    pub continues: Option<String>,
    /// True when `continues` names a server-side conversation, which moves on with
    /// every response (a response id names one fixed point).
    pub continues_conversation: bool,
    /// How many leading messages are pinned, when `compaction.pin` widened it; the
    /// leading system/developer messages otherwise.
    pub pinned: Option<usize>,
    /// Where the last pinned messages sat in the client's list, in order, when
    /// `compaction.pin` found them after the history and floated them into the pinned
    /// part: the log keeps the places, so a replay puts them back.
    pub floated: Vec<usize>,
    /// The `tools` schemas, raw JSON (UTF-8), shared with the body where they lie in
    /// one of its frames.
    pub tools: Option<Bytes>,
    /// The [`keyed_hash`](crate::base::chunks::keyed_hash) of `tools`, when the reading
    /// took it already (a tool list held out as a repeat).
    pub tools_digest: Option<u128>,
    /// True when the client asked for SSE.
    pub stream: bool,
    /// True when the client streams without asking for usage (OpenAI's
    /// `stream_options`), so handoff may ask for it ([`crate::dialect::Replies::ask_usage`]).
    pub usage_unasked: bool,
    /// The reserved output: `max_completion_tokens`, `max_tokens`.
    pub max_output: Option<u64>,
    /// True when extended thinking is on (Anthropic), which constrains the cut.
    pub thinking: bool,
    /// Where the list (`messages`, `input`) lies in the body, `[` to `]`, when the
    /// reading found it: a rewritten body replaces those bytes without reading the
    /// body again.
    pub list: Option<std::ops::Range<usize>>,
}

/// A compaction handle handoff minted, opened: the messages it stands for. The
/// provider reads a list from its latest compaction on: what precedes the handle is
/// dropped, and the handle's message is these messages, then its remainder.
#[derive(Debug)]
pub struct Expanded {
    /// The index in the request's `messages` of the message holding the handle (for a
    /// compaction served on this very request, its last message: the handle stands
    /// for all of it).
    pub at: usize,
    /// The messages it stands for, in the request's dialect.
    pub messages: Vec<Message>,
    /// What the handle's message holds after it (a Messages reply's blocks that
    /// followed its `compaction` block), as a message of its own.
    pub remainder: Option<Message>,
}

/// How the text of every compaction handle handoff mints starts: what tells its own
/// from a provider's sealed compaction.
pub const HANDLE_PREFIX: &str = "handoff-compaction.v1.";

/// The asks of the provider's context management a body made, when it made any:
/// `context_management` and `compaction` as sent (a `null` is none), read as values.
pub(crate) fn asked(
    context_management: Option<Box<RawValue>>,
    compaction: Option<Box<RawValue>>,
) -> (
    Option<Box<crate::base::line::Asked>>,
    Option<Value>,
    Option<Value>,
) {
    let present = |raw: Option<Box<RawValue>>| raw.filter(|r| r.get().trim() != "null");
    let (context_management, compaction) = (present(context_management), present(compaction));
    if context_management.is_none() && compaction.is_none() {
        return (None, None, None);
    }
    let value = |raw: &Option<Box<RawValue>>| {
        raw.as_ref()
            .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
    };
    let values = (value(&context_management), value(&compaction));
    let asked = crate::base::line::Asked {
        context_management,
        compaction,
        ..Default::default()
    };
    (Some(Box::new(asked)), values.0, values.1)
}

impl ChatRequest {
    /// A request of `dialect` for `model` with `messages`, every other field at its
    /// plain value (nothing pinned or floated, no tools, not streamed, nothing asked of
    /// the provider, not held upstream): what each dialect's reading starts from, and
    /// sets what its body says on.
    pub fn new(dialect: DialectKind, model: String, messages: Vec<Message>) -> Self {
        Self {
            dialect,
            model,
            messages,
            top_level: 0,
            provider_compacts: false,
            compacted_history: false,
            expanded: None,
            asked: None,
            server_held: false,
            continues: None,
            continues_conversation: false,
            pinned: None,
            floated: Vec::new(),
            tools: None,
            tools_digest: None,
            stream: false,
            usage_unasked: false,
            max_output: None,
            thinking: false,
            list: None,
        }
    }

    /// How many leading messages are pinned: kept verbatim in every view, logged as the
    /// pinned set, outside the prefix chain.
    pub fn pinned_len(&self) -> usize {
        self.pinned.unwrap_or_else(|| {
            self.messages
                .iter()
                .take_while(|m| m.role.is_instruction())
                .count()
        })
    }

    /// Parses an OpenAI chat-completions body (the log's own format).
    pub fn parse(body: &[u8]) -> Result<Self, DialectError> {
        openai::OpenAiChat.parse(body)
    }

    /// The dialect implementation.
    pub fn dialect(&self) -> &'static dyn Dialect {
        self.dialect.get()
    }
}

/// One delta of a streamed reply event ([`crate::dialect::Replies::reply_deltas`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplyDelta {
    /// The channel it continues: a choice's text, a content block, a tool call.
    pub channel: String,
    /// The JSON pointer to its string in the event.
    pub pointer: String,
    /// True when the string is a piece of JSON text (a tool call's arguments).
    pub json: bool,
}

impl ReplyDelta {
    /// A delta of `channel` at `pointer`.
    pub fn new(channel: String, pointer: impl Into<String>, json: bool) -> Self {
        Self {
            channel,
            pointer: pointer.into(),
            json,
        }
    }
}

/// Where an API takes the upstream key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyHeader {
    /// `Authorization: Bearer <key>`.
    Bearer,
    /// The bare key in this header (Anthropic's `x-api-key`).
    Named(&'static str),
}

/// Byte strings a format's messages contain in their raw JSON, for the scans that
/// decide whether a message is worth parsing.
#[derive(Debug, Clone, Copy)]
pub struct Markers {
    /// The message belongs to a tool pair (a call or its result).
    pub paired: &'static [&'static str],
    /// The message may have echo forms ([`echo::echo_digest`]).
    pub echoed: &'static [&'static str],
    /// The message's echo forms are needed after a restart, so the tracking index
    /// keeps its text.
    pub indexed: &'static [&'static str],
}

/// The header names a bare key comes in: each dialect's (Anthropic's `x-api-key`…), in
/// registry order, then Azure OpenAI's `api-key`, which its clients send for the
/// OpenAI formats.
pub fn key_headers() -> &'static [&'static str] {
    static NAMES: std::sync::OnceLock<Vec<&'static str>> = std::sync::OnceLock::new();
    NAMES.get_or_init(|| {
        let named = DialectKind::ALL
            .iter()
            .filter_map(|d| match d.get().key_header() {
                KeyHeader::Named(name) => Some(name),
                KeyHeader::Bearer => None,
            });
        unique(named.chain(["api-key"]))
    })
}

/// The credential a request presents, as `Authorization` carries it: that header's
/// value, else a dialect's bare key read as the `Bearer` value it stands for, else
/// `anonymous`. One key is one tenant whichever header carries it (Anthropic's SDKs
/// send `x-api-key` or `Authorization: Bearer`).
pub fn credential(headers: &http::HeaderMap) -> std::borrow::Cow<'_, [u8]> {
    use std::borrow::Cow;
    if let Some(value) = headers.get(http::header::AUTHORIZATION) {
        return Cow::Borrowed(value.as_bytes());
    }
    match key_headers().iter().find_map(|name| headers.get(*name)) {
        Some(key) => Cow::Owned([b"Bearer ".as_slice(), key.as_bytes()].concat()),
        None => Cow::Borrowed(b"anonymous".as_slice()),
    }
}

/// The key a request presents: the `Authorization: Bearer` token, else a dialect's
/// bare key; trimmed, never empty.
pub fn presented_key(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Bearer ")
                .or_else(|| v.strip_prefix("bearer "))
        })
        .or_else(|| {
            key_headers()
                .iter()
                .find_map(|name| headers.get(*name).and_then(|v| v.to_str().ok()))
        })
        .map(str::trim)
        .filter(|k| !k.is_empty())
}

/// Moves a key sent in the query (`?key=`, on a path whose dialect takes one there,
/// [`crate::dialect::Credentials::query_key`]) into that dialect's key header, and out of the URI: from
/// here on it is a credential like any other, and the path that is logged, recorded
/// and forwarded holds no key. A key header already present wins; the query's key is
/// dropped either way. `Err` when the key cannot be a header value.
pub fn lift_query_key<B>(request: &mut http::Request<B>) -> Result<(), ApiError> {
    let uri = request.uri();
    let dialect = DialectKind::for_path(uri.path()).get();
    let (Some(name), Some(query)) = (dialect.query_key(), uri.query()) else {
        return Ok(());
    };
    let KeyHeader::Named(header) = dialect.key_header() else {
        return Ok(());
    };
    let mut key = None;
    let rest: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let (field, value) = pair.split_once('=').unwrap_or((pair, ""));
            // The API reads a name spelt with escapes (`%6Bey`) as the name it spells.
            if percent_encoding::percent_decode_str(field).decode_utf8_lossy() != name {
                return true;
            }
            key.get_or_insert(value);
            false
        })
        .collect();
    let Some(key) = key else {
        return Ok(());
    };
    let invalid =
        || ApiError::invalid_api_key(format!("the {name} query parameter is not a valid API key"));
    let decoded = percent_encoding::percent_decode_str(key)
        .decode_utf8()
        .map_err(|_| invalid())?;
    let value = http::HeaderValue::from_str(&decoded).map_err(|_| invalid())?;
    let target = match rest.is_empty() {
        true => uri.path().to_owned(),
        false => format!("{}?{}", uri.path(), rest.join("&")),
    };
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(target.parse().map_err(|_| invalid())?);
    *request.uri_mut() = http::Uri::from_parts(parts).map_err(|_| invalid())?;
    if !request.headers().contains_key(header) {
        request.headers_mut().insert(header, value);
    }
    Ok(())
}

/// Paths a proxy key may use when its `paths` is unset: every dialect's own path and
/// [`crate::dialect::Credentials::key_paths`].
pub fn key_paths() -> Vec<&'static str> {
    unique(
        DialectKind::ALL.iter().flat_map(|d| {
            std::iter::once(d.get().path()).chain(d.get().key_paths().iter().copied())
        }),
    )
}

/// The headers that carry a credential, in any dialect: `Authorization` and
/// [`key_headers`].
pub fn credential_headers() -> Vec<&'static str> {
    unique(std::iter::once("authorization").chain(key_headers().iter().copied()))
}

/// The client headers a summary call carries, in any dialect: the credentials, then
/// each API's version and account headers. Everything else stays the client's
/// (session ids such as `X-Claude-Code-Session-Id` and `session_id`, `x-codex-*` and
/// `x-stainless-*` telemetry, `User-Agent`, beta flags): a summary call is handoff's
/// own, and a provider must not count it as one of the client's turns.
pub fn summary_headers() -> Vec<&'static str> {
    let api = DialectKind::ALL
        .iter()
        .flat_map(|d| d.get().api_headers().iter().copied());
    unique(credential_headers().into_iter().chain(api))
}

/// `names` in order, each once.
pub(crate) fn unique(names: impl Iterator<Item = &'static str>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = Vec::new();
    for name in names {
        if !out.contains(&name) {
            out.push(name);
        }
    }
    out
}

/// Which raw-JSON markers a scan looks for ([`Markers`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkerKind {
    /// [`Markers::paired`].
    Paired,
    /// [`Markers::echoed`].
    Echoed,
    /// [`Markers::indexed`].
    Indexed,
}

/// True when `raw` contains one of the `kind` markers of any dialect. The union is
/// built once, each marker in it once (several formats mark typed blocks alike).
pub fn any_marker(raw: &str, kind: MarkerKind) -> bool {
    static UNIONS: std::sync::OnceLock<[Vec<&'static str>; 3]> = std::sync::OnceLock::new();
    let unions = UNIONS.get_or_init(|| {
        let union = |pick: fn(&Markers) -> &'static [&'static str]| {
            unique(
                DialectKind::ALL
                    .iter()
                    .flat_map(|d| pick(&d.get().markers()).iter().copied()),
            )
        };
        [
            union(|m| m.paired),
            union(|m| m.echoed),
            union(|m| m.indexed),
        ]
    });
    unions[kind as usize]
        .iter()
        .any(|marker| raw.contains(marker))
}

/// A streamed reply being reassembled from its SSE events.
pub trait StreamReply: Send {
    /// Feeds one event: its `event:` name (empty if none) and its `data`.
    fn push(&mut self, event: &str, data: &str);

    /// The assembled replies and the usage, in the non-streamed shape.
    fn finish(self: Box<Self>) -> Assembled;
}

/// The lines that end a stream: `field: value` at the start of a line, for any of
/// `values`, or a `field` line that holds `containing` (an API whose last event names
/// itself by a member, as Gemini's carries `finishReason`).
#[derive(Debug, Clone, Copy)]
pub struct StreamEnd {
    /// The SSE field, e.g. `data:`.
    pub field: &'static [u8],
    /// Its values, e.g. `[DONE]`.
    pub values: &'static [&'static [u8]],
    /// Bytes whose presence on a `field` line makes its event the last; empty for
    /// none. Its first byte must not recur in it but at its end (a `"name"`), which
    /// lets the scan match it byte by byte without backtracking.
    pub containing: &'static [u8],
}

/// Reads a JSON body whose values borrow from it. The body is checked as UTF-8 once,
/// so serde_json does not check each borrowed message again.
pub(crate) fn json_body<'a, T: serde::Deserialize<'a>>(
    body: &'a [u8],
) -> Result<T, serde_json::Error> {
    match simdutf8::basic::from_utf8(body) {
        Ok(text) => serde_json::from_str(text),
        // Not UTF-8: serde_json's own reading reports where.
        Err(_) => serde_json::from_slice(body),
    }
}

/// What the opening bytes of a streamed answer say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opening {
    /// An error event says the input exceeded the window; nothing else was sent.
    Overflow,
    /// Output (or another error) began: relay it.
    Relay,
    /// Only preamble so far: read more.
    NeedMore,
}

/// Most bytes of a stream's opening read before it is relayed regardless.
const OPENING_LIMIT: usize = 64 * 1024;

/// Reads the complete SSE events in `head`: an overflow error before any output is an
/// [`Opening::Overflow`]; the first output event, or any other error, is
/// [`Opening::Relay`].
pub fn stream_opening(dialect: &dyn Dialect, head: &[u8]) -> Opening {
    let text = String::from_utf8_lossy(head);
    let normalized = text.replace("\r\n", "\n");
    let mut events: Vec<&str> = normalized.split("\n\n").collect();
    // The last piece is an event still arriving (empty when `head` ends an event).
    events.pop();
    for event in events {
        let data: Vec<&str> = event
            .lines()
            .filter_map(|line| line.strip_prefix("data:"))
            .map(|d| d.strip_prefix(' ').unwrap_or(d))
            .collect();
        if data.is_empty() {
            continue;
        }
        let Ok(json) = serde_json::from_str::<Value>(&data.join("\n")) else {
            return Opening::Relay;
        };
        match dialect.opening_event(&json) {
            Opening::NeedMore => {}
            decided => return decided,
        }
    }
    if head.len() > OPENING_LIMIT {
        Opening::Relay
    } else {
        Opening::NeedMore
    }
}

/// handoff's error answered in a dialect's error shape (the error is the core's, the
/// shape is the wire format's).
pub trait ErrorResponse {
    /// The error as a complete HTTP response, in `dialect`'s error shape.
    fn into_response_for(self, dialect: DialectKind) -> http::Response<crate::body::ProxyBody>;
}

impl ErrorResponse for ApiError {
    fn into_response_for(self, dialect: DialectKind) -> http::Response<crate::body::ProxyBody> {
        let body = dialect.get().error_json(&self);
        self.into_response_with(&body)
    }
}

#[cfg(test)]
#[path = "billed_tests.rs"]
mod billed_tests;
