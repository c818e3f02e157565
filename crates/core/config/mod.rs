//! The typed configuration: every key documented in `config/handoff.toml`, with its default.
//!
//! The structs deny unknown fields, so a misspelt key fails the load and names the key.
//! Loading and layering live in `load.rs`; masking for display lives in `mask.rs`.

mod hook_turns;
pub use prepare_at::PrepareAt;
mod load;
mod mask;
mod middleware;
mod prepare_at;
mod prices;
mod tracing_config;
mod workers;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use hook_turns::{HookTurns, NoTurn, Turn};
pub use load::{check_serve, config_file, from_toml, load, strategy_kind, ConfigError, Overrides};
pub use mask::masked;
pub use middleware::{Failure, HookConfig, MiddlewareConfig};
pub use prices::{price_of, Billed, Price};
pub use tracing_config::{env as otel_env, TracingConfig};
pub use workers::{cores, Workers};

/// The whole effective configuration, as one validated snapshot.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Address the proxy listens on.
    pub listen: SocketAddr,
    /// Host names clients may address this listener by, beside IP addresses and
    /// `localhost` (and `*.localhost`): `"proxy.internal"`, `".example.com"` for a domain
    /// and its subdomains, `"*"` for any (behind a reverse proxy that checks names).
    /// Any other `Host` is refused, so a web page cannot reach the proxy by DNS rebinding.
    pub allowed_hosts: Vec<String>,
    /// Web origins (`"https://app.example.com"`) whose pages may call the proxy API;
    /// a request with any other `Origin` is refused before it is forwarded or logged.
    /// Empty by default: no web page may use the proxy, or its upstream key.
    pub allowed_origins: Vec<String>,
    /// Folder for conversation logs and compaction records.
    pub data_dir: PathBuf,
    /// How long in-flight requests may run after SIGINT/SIGTERM.
    #[serde(with = "humantime_serde")]
    pub shutdown_grace: Duration,
    /// `"auto"` (one worker per core), 0 (one work-stealing runtime over every core),
    /// or N workers: threads each with its own current-thread runtime, `SO_REUSEPORT`
    /// listener and upstream connections.
    pub workers: Workers,
    /// Where requests are forwarded.
    pub upstream: UpstreamConfig,
    /// Request size limits.
    pub limits: LimitsConfig,
    /// Optional TLS on the listening side.
    pub tls: TlsConfig,
    /// Log output.
    pub log: LogConfig,
    /// OpenTelemetry spans and metrics.
    pub tracing: TracingConfig,
    /// Access to the `/handoff/*` admin endpoints.
    pub admin: AdminConfig,
    /// Proxy keys: who may use the proxy, and as which tenant.
    pub auth: AuthConfig,
    /// Durability of the on-disk store.
    pub store: StoreConfig,
    /// Per-model facts, keyed by model name or name prefix.
    pub models: BTreeMap<String, ModelConfig>,
    /// What each model's tokens cost, keyed by model name or name prefix.
    pub prices: BTreeMap<String, Price>,
    /// When and how conversations are compacted.
    pub compaction: CompactionConfig,
    /// Per-model-pattern upstream and chain, first match wins.
    pub routes: Vec<RouteConfig>,
    /// Per-wire-format settings.
    pub dialects: DialectsConfig,
    /// Hooks a tracked request goes through before it is tracked.
    pub middleware: MiddlewareConfig,
}

/// Per-wire-format settings, by dialect name (`anthropic`, `responses`, `openai`):
/// which names exist is the dialects' business, checked when the config is built.
pub(crate) type DialectsConfig = std::collections::BTreeMap<String, DialectConfig>;

/// One wire format's settings.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DialectConfig {
    /// Its upstream base URL; `upstream.base_url` when unset.
    pub base_url: Option<String>,
    /// A variable holding this upstream's own key; `upstream.api_key_env`'s goes only
    /// to an upstream on the same scheme, host and port as `upstream.base_url`.
    pub api_key_env: Option<String>,
    /// `upstream.native_compaction` for this upstream; the global one when unset.
    pub native_compaction: Option<NativeCompaction>,
}

/// A route: requests whose model matches `match` use this upstream and chain.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    /// Model pattern; `*` matches any run of characters, e.g. `gpt-4o*`.
    #[serde(rename = "match")]
    pub pattern: String,
    /// Upstream base URL for these models; `upstream.base_url` when unset.
    #[serde(default)]
    pub upstream: Option<String>,
    /// A variable holding that upstream's own key; `upstream.api_key_env`'s goes only
    /// to an upstream on the same scheme, host and port as `upstream.base_url`.
    #[serde(default)]
    pub api_key_env: Option<String>,
    /// Strategy chain for these models; the model's or the global one when unset.
    #[serde(default)]
    pub chain: Option<Vec<String>>,
    /// Middleware hooks for these models; `middleware.chain` when unset.
    #[serde(default)]
    pub hooks: Option<Vec<String>>,
    /// `upstream.native_compaction` for these models; the dialect's or the global one
    /// when unset.
    #[serde(default)]
    pub native_compaction: Option<NativeCompaction>,
}

impl RouteConfig {
    /// True when `model` matches the pattern (`*` is the only wildcard).
    pub fn matches(&self, model: &str) -> bool {
        handoff_plugin_api::wildcard_match(&self.pattern, model)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            allowed_hosts: Vec::new(),
            allowed_origins: Vec::new(),
            data_dir: PathBuf::from("handoff-data"),
            shutdown_grace: Duration::from_secs(10),
            workers: Workers::Auto,
            upstream: UpstreamConfig::default(),
            limits: LimitsConfig::default(),
            tls: TlsConfig::default(),
            log: LogConfig::default(),
            tracing: TracingConfig::default(),
            admin: AdminConfig::default(),
            auth: AuthConfig::default(),
            store: StoreConfig::default(),
            models: BTreeMap::new(),
            prices: BTreeMap::new(),
            compaction: CompactionConfig::default(),
            routes: Vec::new(),
            dialects: DialectsConfig::default(),
            middleware: MiddlewareConfig::default(),
        }
    }
}

impl Config {
    /// The price of `model`'s tokens and the `[prices]` key that gave it; `None` when
    /// it has none (unpriced, never free).
    pub fn price(&self, model: &str) -> Option<(&str, &Price)> {
        price_of(&self.prices, model)
    }

    /// Who serves `model`'s native compaction in the dialect named `dialect`: the
    /// model's setting, else the first matching route's, the dialect's, the upstream's.
    pub fn native_compaction(&self, dialect: &str, model: &str) -> NativeCompaction {
        let route = || {
            (self.routes.iter().find(|route| route.matches(model)))
                .and_then(|route| route.native_compaction)
        };
        let dialect = || self.dialects.get(dialect).and_then(|d| d.native_compaction);
        (self.model(model).and_then(|m| m.native_compaction))
            .or_else(route)
            .or_else(dialect)
            .unwrap_or(self.upstream.native_compaction)
    }

    /// The model entry for `model`: an exact key, else the longest key that prefixes it.
    ///
    /// Providers answer with dated names (`gpt-4o-2024-08-06`), so a prefix must match too.
    pub fn model(&self, model: &str) -> Option<&ModelConfig> {
        if let Some(found) = self.models.get(model) {
            return Some(found);
        }
        self.models
            .iter()
            .filter(|(key, _)| model.starts_with(key.as_str()))
            .max_by_key(|(key, _)| key.len())
            .map(|(_, value)| value)
    }
}

/// The upstream provider.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamConfig {
    /// Base URL; the client's path and query are appended to it.
    pub base_url: String,
    /// Time allowed to open a connection (TCP and TLS).
    #[serde(with = "humantime_serde")]
    pub connect_timeout: Duration,
    /// Time allowed for the response head, and between two body frames.
    #[serde(with = "humantime_serde")]
    pub read_timeout: Duration,
    /// A variable holding the upstream API key: sent as `Authorization: Bearer …` in
    /// place of the client's credentials.
    pub api_key_env: Option<String>,
    /// Ask for usage in a stream whose client did not (OpenAI's `stream_options`), for
    /// the reply log and calibration, and take it out of the client's stream again.
    pub ask_usage: bool,
    /// Through a shared key (`api_key_env` with proxy keys), let through a body field
    /// named like an object id (`*_id`, `*Id`) that no API's object table lists, whose
    /// owner handoff cannot know; refused (403) by default.
    pub pass_unknown_ids: bool,
    /// Who serves the APIs' own compaction (`/responses/compact`, `compaction_trigger`,
    /// `context_management`, Anthropic's `compact_20260112` and context editing).
    pub native_compaction: NativeCompaction,
}

/// Who serves a request that asks the API itself to compact or edit its context.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NativeCompaction {
    /// Forward it as sent: the provider serves it, or refuses it.
    Pass,
    /// handoff serves it with its own strategies; the upstream never sees the ask.
    Serve,
    /// Forward it; when the upstream refuses the ask in its own error shape (the field,
    /// the item or the path), serve it, and remember that for the upstream and model.
    #[default]
    Auto,
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            base_url: "https://api.openai.com".to_owned(),
            connect_timeout: Duration::from_secs(10),
            read_timeout: Duration::from_secs(600),
            api_key_env: None,
            ask_usage: true,
            pass_unknown_ids: false,
            native_compaction: NativeCompaction::default(),
        }
    }
}

/// Limits that keep one client from degrading everyone.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// Largest chat-completions body that is read whole; larger ones get 413.
    pub max_body_bytes: usize,
    /// Open connections at most; further ones wait in the listen backlog.
    pub max_connections: usize,
    /// Time for a new connection's TLS handshake, protocol sniff and first request
    /// head, and for each later request head.
    #[serde(with = "humantime_serde")]
    pub header_timeout: Duration,
    /// Time a connection may stay open with no request in flight (HTTP/1.1 keep-alive
    /// and h2 alike); HTTP/1.1 is also closed when no next request head arrives within
    /// `header_timeout`. When every slot is taken, the oldest idle connection is
    /// closed at once for the new one.
    #[serde(with = "humantime_serde")]
    pub idle_timeout: Duration,
    /// Time to read a tracked request's whole body.
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// Tracked (chat) requests handled at once; more wait in a short queue.
    pub max_concurrent_chat: usize,
    /// Chat requests that may wait for a slot (up to one second) before 503.
    pub chat_queue: usize,
    /// Messages (or input items) one tracked request may carry; more get a 400. Each is
    /// a line on disk, so a body of tiny messages would write many times its size.
    pub max_messages: usize,
    /// Connections one peer address may hold open at once (0: no cap of its own);
    /// past it, that peer's oldest idle connection is closed for the new one, or the
    /// new one is. Whatever it is, when every slot is taken the oldest idle connection
    /// of a peer holding more than its share makes room, else the oldest idle one.
    pub max_connections_per_peer: usize,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            max_body_bytes: 32 * 1024 * 1024,
            max_connections: 4096,
            header_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(60),
            max_concurrent_chat: 512,
            chat_queue: 64,
            max_messages: 20_000,
            max_connections_per_peer: 0,
        }
    }
}

/// TLS on the listening socket; both files or neither.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TlsConfig {
    /// PEM certificate chain.
    pub cert_file: Option<PathBuf>,
    /// PEM private key.
    pub key_file: Option<PathBuf>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    /// Human-readable lines.
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Logging.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    /// `text` or `json`.
    pub format: LogFormat,
    /// Filter directives used when `RUST_LOG` is unset.
    pub level: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            format: LogFormat::Text,
            level: "info".to_owned(),
        }
    }
}

/// Admin endpoint access.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// Bearer token that opens `/handoff/*` to non-loopback clients.
    pub token: Option<String>,
    /// Loopback clients addressing localhost are served without the token. Set false
    /// behind a reverse proxy on the same host, whose requests all come from loopback.
    pub loopback: bool,
}

impl Default for AdminConfig {
    fn default() -> Self {
        Self {
            token: None,
            loopback: true,
        }
    }
}

/// Proxy keys. With none configured every caller is served, and its tenant is derived
/// from its credential.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuthConfig {
    /// The keys callers must present (`Authorization: Bearer` or `x-api-key`).
    pub keys: Vec<KeyConfig>,
    /// Serve a non-loopback listener with neither keys nor an admin token.
    pub allow_open: bool,
}

/// One proxy key: its tenant name, how to recognise it, and its limits.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// The key's tenant.
    pub name: String,
    /// Hex SHA-256 of the key; the key itself is never stored.
    #[serde(default)]
    pub sha256: Option<String>,
    /// Or: a variable holding the key.
    #[serde(default)]
    pub key_env: Option<String>,
    /// Models the key may use; all when empty.
    #[serde(default)]
    pub models: Vec<String>,
    /// Requests per minute.
    #[serde(default)]
    pub rpm: Option<u32>,
    /// Estimated input tokens per minute (a body's bytes / 4), reserved before a
    /// request is admitted and settled once its size is known.
    #[serde(default)]
    pub tpm: Option<u64>,
    /// Let a request larger than a whole minute's `tpm` wait for a full bucket and owe
    /// the rest, instead of being refused with 429.
    #[serde(default)]
    pub tpm_oversize: bool,
    /// How long this key's conversations are kept, overriding `store.retention`.
    #[serde(default)]
    pub retention: Option<Retention>,
    /// Paths the key may use, each with everything under it (`/v1/files` covers
    /// `/v1/files/file-…`); when unset, the inference APIs and their objects
    /// (`dialect::key_paths`, in handoff-wire).
    #[serde(default)]
    pub paths: Option<Vec<String>>,
    /// Middleware hooks for this key's requests, before any route's; the route's or
    /// `middleware.chain` when unset.
    #[serde(default)]
    pub hooks: Option<Vec<String>>,
}

/// When appended lines are fsynced.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FsyncPolicy {
    /// After every append.
    Always,
    /// At most every 100 ms.
    #[default]
    Batch,
    /// Left to the operating system.
    Never,
}

/// Where the log of originals lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// One folder per conversation under `data_dir` (one process per data dir).
    #[default]
    Disk,
    /// A PostgreSQL database shared by every replica.
    Postgres,
}

/// The store of originals.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// `disk` (default) or `postgres`.
    pub backend: StoreBackend,
    /// The database URL for the `postgres` backend (`HANDOFF_STORE__URL`).
    pub url: Option<String>,
    /// Database connections per replica.
    pub pool_size: usize,
    /// How long a replica's claim on a conversation's compaction lasts without
    /// renewal: after a crash, another replica takes over once it expires.
    #[serde(with = "humantime_serde")]
    pub lease_ttl: Duration,
    /// fsync policy for appends (disk backend).
    pub fsync: FsyncPolicy,
    /// Refuse requests with 503 when the store cannot write.
    pub required: bool,
    /// Conversations whose state is kept in memory.
    pub cache_capacity: u64,
    /// About how many bytes of conversation state are kept in memory, all
    /// conversations together; the least used reload from the store.
    pub cache_bytes: u64,
    /// Bytes the per-message caches may hold, all together: the parsed facts of
    /// messages and the memos of recent long bodies, half each, weighed with the
    /// client's strings they keep.
    pub message_cache_bytes: u64,
    /// Messages whose token counts are kept in memory (about 60 bytes each).
    pub count_cache_entries: u64,
    /// Distinct messages whose parsed facts (ids, tool pairs, counted text's length)
    /// are kept in memory, so a re-sent message is not parsed again.
    pub facts_cache_entries: usize,
    /// Messages of recent long bodies remembered with where they lay (about 50 bytes
    /// each), so the part a client re-sends is not scanned again.
    pub prefix_cache_entries: usize,
    /// Bytes one tenant's log may hold on disk (0: no quota); past it, its tracked
    /// requests get 507. The disk store counts; PostgreSQL's own quotas apply there.
    pub tenant_quota_bytes: u64,
    /// How long a conversation is kept after its last request; `None`: forever.
    #[serde(with = "humantime_serde")]
    pub retention: Option<Duration>,
    /// Per-tenant retention, overriding `retention`: a duration, or `"forever"`.
    pub tenant_retention: std::collections::BTreeMap<String, Retention>,
    /// How long a conversation idles before the disk store compresses it; `None`:
    /// never.
    #[serde(with = "humantime_serde")]
    pub compress_after: Option<Duration>,
    /// How often the background task prunes and compresses.
    #[serde(with = "humantime_serde")]
    pub upkeep_interval: Duration,
}

/// A retention override: a duration, or kept forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Kept this long after the last request.
    For(Duration),
    /// Never pruned.
    Forever,
}

impl Serialize for Retention {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::For(duration) => {
                serializer.serialize_str(&humantime::format_duration(*duration).to_string())
            }
            Self::Forever => serializer.serialize_str("forever"),
        }
    }
}

impl<'de> Deserialize<'de> for Retention {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text == "forever" {
            return Ok(Self::Forever);
        }
        humantime::parse_duration(&text)
            .map(Self::For)
            .map_err(|err| {
                serde::de::Error::custom(format!(
                    "{text:?}: {err} (a duration such as \"90d\", or \"forever\")"
                ))
            })
    }
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self {
            backend: StoreBackend::Disk,
            url: None,
            pool_size: 16,
            lease_ttl: Duration::from_secs(30),
            fsync: FsyncPolicy::Batch,
            required: true,
            cache_capacity: 10_000,
            cache_bytes: 128 * 1024 * 1024,
            message_cache_bytes: 64 * 1024 * 1024,
            count_cache_entries: 1_000_000,
            facts_cache_entries: 500_000,
            prefix_cache_entries: 1_000_000,
            tenant_quota_bytes: 0,
            retention: None,
            tenant_retention: Default::default(),
            compress_after: None,
            upkeep_interval: Duration::from_secs(600),
        }
    }
}

/// How tokens are counted for a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tokenizer {
    /// tiktoken `o200k_base`.
    #[default]
    O200k,
    /// tiktoken `cl100k_base`.
    Cl100k,
    /// Bytes divided by four, for models with no public tokenizer.
    Estimate,
}

/// Facts about one model.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// Total tokens the model accepts, input and output together.
    pub context_window: u64,
    /// Token counter.
    #[serde(default)]
    pub tokenizer: Tokenizer,
    /// Output reserve when the request sets no `max_tokens`.
    #[serde(default)]
    pub default_output_reserve: Option<u64>,
    /// The upstream needs `reasoning_content` on assistant messages.
    #[serde(default)]
    pub reasoning_marker: bool,
    /// Compaction settings for this model only.
    #[serde(default)]
    pub compaction: Option<ModelCompactionConfig>,
    /// The API handoff's own summary calls use with this model when it is the summary
    /// model; the conversation's own API when unset.
    #[serde(default)]
    pub api: Option<ModelApi>,
    /// `upstream.native_compaction` for this model, over a route's and a dialect's.
    #[serde(default)]
    pub native_compaction: Option<NativeCompaction>,
}

/// An API a model can be called with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelApi {
    /// Chat completions.
    Chat,
}

/// `[models."<m>".compaction]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCompactionConfig {
    /// The chain for this model; the global one when empty.
    #[serde(default)]
    pub chain: Vec<String>,
    /// `compaction.keep_recent` for this model: a model whose cache reads cost more
    /// (or whose window is small) pays more for each token kept verbatim.
    #[serde(default)]
    pub keep_recent: Option<f64>,
}

/// `[compaction.strategies.<name>]`: a named strategy instance.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StrategyConfig {
    /// `summarize`, `extract` or `exec`.
    pub kind: String,
    /// summarize: the model that writes the handoff.
    #[serde(default)]
    pub model: Option<String>,
    /// summarize: prompt template file.
    #[serde(default)]
    pub prompt_file: Option<PathBuf>,
    /// summarize: fields merged into the summary request.
    #[serde(default)]
    pub request_extra: serde_json::Map<String, serde_json::Value>,
    /// Time allowed for one attempt; `compaction.summary_timeout` when unset.
    #[serde(default, with = "humantime_serde")]
    pub timeout: Option<Duration>,
    /// exec: the program and its arguments; no shell is involved.
    #[serde(default)]
    pub command: Vec<String>,
    /// exec: environment variables passed through (all others are cleared).
    #[serde(default)]
    pub env: Vec<String>,
    /// exec: largest stdout accepted.
    #[serde(default = "default_exec_output")]
    pub max_output_bytes: usize,
    /// Replace old tool results by placeholders before this strategy runs.
    #[serde(default)]
    pub prune: Option<PruneConfig>,
    /// Largest handoff this strategy may write, in tokens; `min(8192, window/10)` when
    /// unset (and never more than that).
    #[serde(default)]
    pub handoff_tokens: Option<u64>,
}

fn default_exec_output() -> usize {
    1024 * 1024
}

/// Tool-output pruning: old tool results become placeholders with tool name and size.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PruneConfig {
    /// The newest tool output kept whole, in tokens.
    pub keep_recent_tokens: u64,
}

/// Compaction policy.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CompactionConfig {
    /// Master switch for every compaction path, the reactive one included.
    pub enabled: bool,
    /// Share of the input budget that triggers compaction.
    pub trigger: f64,
    /// Share of the input budget kept verbatim as recent units.
    pub keep_recent: f64,
    /// First strategy in the chain.
    pub strategy: String,
    /// Last strategy in the chain; always deterministic.
    pub fallback: String,
    /// Model that writes summaries; the request's model when unset.
    pub summary_model: Option<String>,
    /// Time allowed for one summary call; a folding attempt gets this once per call
    /// it may make.
    #[serde(with = "humantime_serde")]
    pub summary_timeout: Duration,
    /// Most model calls one summary attempt may make when it folds a long history.
    pub max_summary_calls: u32,
    /// Fields merged into every summary request.
    pub summary_request_extra: serde_json::Map<String, serde_json::Value>,
    /// Summary prompt template file; the built-in prompt when unset.
    pub prompt_file: Option<PathBuf>,
    /// Compact-and-retry rounds after an upstream context-length error.
    pub max_retries: u32,
    /// Shorten over-long tool bodies in the recent part when nothing else fits.
    pub rescue: bool,
    /// Share of the handoff budget the ledger may use: the exact facts (the user's
    /// messages, identifiers, tool outcomes) every handoff ends with. 0: no ledger.
    pub ledger_share: f64,
    /// When a view's compaction is prepared in the background, so the request that
    /// crosses the trigger adopts it at once: `"auto"` (from the conversation's growth
    /// and the summariser's latency), or a share of the trigger (0: never prepare).
    pub prepare_at: PrepareAt,
    /// Preparations running at once, over all conversations; more are dropped.
    pub max_background: usize,
    /// Longest a request waits for a model-written summary. Past it, the view is sent
    /// with a stand-in from the chain's deterministic strategies, and the summary is
    /// adopted by the first request after it lands. `0s`: never wait for a model.
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// Summary calls one folding attempt makes at once: its parts are summarised
    /// concurrently and merged by a last call. 1: in sequence, each call extending the
    /// handoff the one before wrote.
    pub fold_concurrency: u32,
    /// Summary calls in flight at once over all conversations; more wait for a slot.
    pub max_summary_concurrency: usize,
    /// Messages after the leading system ones that are standing context, kept verbatim
    /// in every view like `system` (a files message, few-shot examples).
    pub pin: PinConfig,
    /// The strategies to try, in order; `[strategy, fallback]` when empty.
    pub chain: Vec<String>,
    /// Named strategy instances.
    pub strategies: BTreeMap<String, StrategyConfig>,
    /// Strategy names a client may pick with `x-handoff-strategy`.
    pub request_override_allow: Vec<String>,
}

impl CompactionConfig {
    /// The share of the input budget kept verbatim for `model`: its own
    /// `[models."<m>".compaction] keep_recent`, else `keep_recent`.
    pub fn keep_recent_for(&self, model: Option<&ModelConfig>) -> f64 {
        model
            .and_then(|m| m.compaction.as_ref())
            .and_then(|c| c.keep_recent)
            .unwrap_or(self.keep_recent)
    }

    /// The global chain: `chain`, or the `strategy` / `fallback` shorthand.
    pub fn global_chain(&self) -> Vec<String> {
        if !self.chain.is_empty() {
            return self.chain.clone();
        }
        let mut chain = vec![self.strategy.clone()];
        if self.fallback != self.strategy {
            chain.push(self.fallback.clone());
        }
        chain
    }
}

/// `[compaction.pin]`: which messages after the leading system ones are pinned. The
/// pinned part is the longest run from the start of the list that these rules cover.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PinConfig {
    /// The first N messages after the leading system ones.
    pub first: usize,
    /// Messages by role and content.
    pub rules: Vec<PinRule>,
}

/// One content rule of `[[compaction.pin.rules]]`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PinRule {
    /// The role the message has (`user`, `assistant`, …).
    pub role: String,
    /// A regex its text must match.
    pub pattern: String,
    /// Pin the assistant message right after it too (an acknowledgement).
    #[serde(default)]
    pub with_reply: bool,
    /// The message ends a preamble: it and every message before it are pinned (a
    /// client's few-shot examples closed by a marker). Looked for among the first 16
    /// messages.
    #[serde(default)]
    pub through: bool,
}

impl Default for CompactionConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            trigger: 0.9,
            keep_recent: 0.1,
            strategy: "summarize".to_owned(),
            fallback: "extract".to_owned(),
            summary_model: None,
            summary_timeout: Duration::from_secs(120),
            max_summary_calls: 8,
            summary_request_extra: serde_json::Map::new(),
            prompt_file: None,
            max_retries: 2,
            rescue: true,
            ledger_share: 0.3,
            prepare_at: PrepareAt::Auto,
            max_background: 4,
            max_wait: Duration::from_secs(2),
            fold_concurrency: 4,
            max_summary_concurrency: 16,
            pin: PinConfig::default(),
            chain: Vec::new(),
            strategies: BTreeMap::new(),
            request_override_allow: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_patterns_match_with_stars() {
        let route = |p: &str| RouteConfig {
            pattern: p.into(),
            upstream: None,
            api_key_env: None,
            chain: None,
            hooks: None,
            native_compaction: None,
        };
        assert!(route("gpt-4o*").matches("gpt-4o-mini"));
        assert!(route("gpt-4o*").matches("gpt-4o"));
        assert!(!route("gpt-4o*").matches("gpt-4.1"));
        assert!(route("*-instruct").matches("qwen-7b-instruct"));
        assert!(route("meta-llama/*-70B-*").matches("meta-llama/Llama-3.3-70B-Instruct"));
        assert!(route("exact").matches("exact"));
        assert!(!route("exact").matches("exactly"));
    }
}
