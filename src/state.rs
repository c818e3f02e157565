//! What every request handler shares. Long-lived parts (the tracker, token counts,
//! counters) live for the process; everything derived from the config lives in a
//! [`Snapshot`] that a reload swaps whole. A request loads one snapshot when it starts
//! and keeps it to the end, so in-flight requests finish on the config they began with.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use handoff_plugin_api::CancellationToken;
use serde::Serialize;

use crate::auth::Secrets;
use crate::auth::{Credentials, KeyError, RateLimiter};
use crate::compaction::job::Compactor;
use crate::config::StoreBackend;
use crate::config::{self, Config, Overrides, UpstreamConfig};
use crate::conversation::Tracker;
use crate::dialect::DialectKind;
use crate::metrics::Metrics;
use crate::store::layout::{migrate_legacy_layout, MigrationError};
use crate::strategies::{ChainError, Registry};
use crate::tenant::{ServerSecret, SECRET_FILE};
use crate::tokens::Tokens;
use crate::upstream::{Upstream, UpstreamError};

/// Why the shared state could not be built.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StateError {
    /// An upstream client could not be built.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The store could not be opened.
    #[error(transparent)]
    Store(#[from] crate::store::OpenError),
    /// Another process serves the same data dir.
    #[error(transparent)]
    Lock(#[from] crate::store::LockError),
    /// The strategy registry could not be built.
    #[error(transparent)]
    Chain(#[from] ChainError),
    /// The config file could not be loaded.
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    /// The server secret could not be read or created.
    #[error("cannot read or create the server secret {path}: {source}")]
    Secret {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A key's variable is unset.
    #[error(transparent)]
    Keys(#[from] KeyError),
    /// A pre-tenant data dir could not be moved to the tenant `legacy`.
    #[error(transparent)]
    Migration(#[from] MigrationError),
    /// `[tracing]` is on and its export could not start.
    #[error(transparent)]
    Tracing(#[from] crate::otel::OtelError),
}

/// Everything built from one config.
pub(crate) struct Snapshot {
    /// The config.
    pub config: Arc<Config>,
    /// The default upstream.
    pub upstream: Upstream,
    /// Each route's own upstream, index-aligned with `config.routes`.
    route_upstreams: Vec<Option<Upstream>>,
    /// Each `dialects.<name>.base_url`'s upstream, where one is set.
    dialect_upstreams: HashMap<DialectKind, Upstream>,
    /// The named strategies.
    pub registry: Registry,
    /// Proxy keys and the upstream key.
    pub credentials: Credentials,
    /// `compaction.pin`, compiled.
    pub pins: crate::pins::Pins,
    /// `[middleware]`'s hooks and the chains of routes and keys, built.
    pub hooks: crate::plugins::HookChains,
    /// When it was loaded, RFC 3339.
    pub loaded_at: String,
}

impl Snapshot {
    /// Builds clients and strategies for `config`.
    pub(crate) fn build(config: Config, secrets: &Secrets) -> Result<Self, StateError> {
        let main_key = config
            .upstream
            .api_key_env
            .as_deref()
            .map(|variable| crate::auth::read_key(secrets, "upstream.api_key_env", variable))
            .transpose()?;
        let upstream = Upstream::new(&config.upstream)?.with_key(main_key.as_deref())?;
        // Another base URL with the upstream's timeouts, and its own key: the main key
        // only where the main upstream is.
        let at = |url: &Option<String>, key_env: &Option<String>, field: &str| {
            let Some(url) = url else {
                return Ok(None);
            };
            let other = Upstream::new(&UpstreamConfig {
                base_url: url.clone(),
                ..config.upstream.clone()
            })?;
            let key = match key_env {
                Some(variable) => Some(crate::auth::read_key(secrets, field, variable)?),
                None if other.same_origin(&upstream) => main_key.clone(),
                None => None,
            };
            Ok::<_, StateError>(Some(other.with_key(key.as_deref())?))
        };
        let route_upstreams = config
            .routes
            .iter()
            .enumerate()
            .map(|(i, route)| {
                at(
                    &route.upstream,
                    &route.api_key_env,
                    &format!("routes[{i}].api_key_env"),
                )
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut dialect_upstreams = HashMap::new();
        for (name, dialect) in &config.dialects {
            let kind = DialectKind::ALL
                .iter()
                .copied()
                .find(|kind| kind.name() == name)
                .ok_or_else(|| config::ConfigError::Invalid {
                    key: format!("dialects.{name}"),
                    reason: format!(
                        "no such dialect; known: {}",
                        DialectKind::ALL
                            .iter()
                            .map(|k| k.name())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                })?;
            let key = format!("dialects.{name}.api_key_env");
            if let Some(upstream) = at(&dialect.base_url, &dialect.api_key_env, &key)? {
                dialect_upstreams.insert(kind, upstream);
            }
        }
        let registry = Registry::build(&config)?;
        let credentials = Credentials::build(&config, secrets)?;
        let pins = crate::pins::Pins::build(&config.compaction.pin).map_err(|err| {
            config::ConfigError::Invalid {
                key: "compaction.pin.rules".into(),
                reason: err.to_string(),
            }
        })?;
        let hooks = crate::plugins::HookChains::build(&config)?;
        Ok(Self {
            config: Arc::new(config),
            upstream,
            pins,
            route_upstreams,
            dialect_upstreams,
            registry,
            credentials,
            hooks,
            loaded_at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        })
    }

    /// The upstream for a request of `dialect` that is not routed by model (e.g.
    /// `count_tokens`): the dialect's own base URL, else the default.
    pub(crate) fn dialect_upstream(&self, dialect: DialectKind) -> &Upstream {
        self.dialect_upstreams
            .get(&dialect)
            .unwrap_or(&self.upstream)
    }

    /// The upstream for `model` in `dialect`: a matching route's, else the dialect's.
    pub(crate) fn upstream_in(&self, dialect: DialectKind, model: &str) -> &Upstream {
        self.config
            .routes
            .iter()
            .zip(&self.route_upstreams)
            .find(|(route, _)| route.matches(model))
            .and_then(|(_, upstream)| upstream.as_ref())
            .unwrap_or_else(|| self.dialect_upstream(dialect))
    }
}

/// Reloads so far, for `GET /handoff/config`.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ReloadStatus {
    /// Successful reloads.
    pub reloads: u64,
    /// Why the last attempt failed, if it did.
    pub last_error: Option<String>,
    /// When the last attempt was made.
    pub last_attempt: Option<String>,
}

/// What a state is built over: its store, secret, counters and token counts.
struct Parts {
    store: Arc<dyn crate::store::Store>,
    secret: ServerSecret,
    metrics: Arc<Metrics>,
    tokens: Arc<Tokens>,
    data_dir_lock: Option<crate::store::DataDirLock>,
    /// Where the key variables are read.
    secrets: Secrets,
}

/// Shared by every connection.
pub(crate) struct AppState {
    current: ArcSwap<Snapshot>,
    overrides: Overrides,
    /// Where the key variables are read, at start and at each reload.
    secrets: Secrets,
    reload: Mutex<ReloadStatus>,
    /// Conversation tracking over the store.
    pub tracker: Arc<Tracker>,
    /// Which tenant created which upstream object.
    pub ownership: crate::ownership::Ownership,
    /// Token counting with its cache.
    pub tokens: Arc<Tokens>,
    /// Compaction runs.
    pub compactor: Compactor,
    /// Counters for `/handoff/metrics`.
    pub metrics: Arc<Metrics>,
    /// Fired at shutdown: running compactions stop and commit nothing.
    pub shutdown: CancellationToken,
    /// The key that turns credentials into tenants; never logged.
    pub secret: ServerSecret,
    /// Per-key rate limits, kept across reloads.
    pub limiter: Arc<RateLimiter>,
    /// Slots for tracked requests (`limits.max_concurrent_chat`, fixed at start).
    pub chat_gate: crate::gate::ChatGate,
    /// The neutral forms of messages the middleware hooks saw, by digest.
    pub hook_forms: crate::neutral_forms::NeutralForms,
    /// The upstreams and models found to refuse the APIs' own compaction.
    pub native_refusals: crate::native::Refusals,
    /// OpenTelemetry export, when `[tracing]` is on (fixed at start).
    pub telemetry: Option<crate::otel::Telemetry>,
    /// The disk store's exclusive hold on its data dir, for the life of the process.
    _data_dir_lock: Option<crate::store::DataDirLock>,
}

impl AppState {
    /// Refuses a request that names an upstream object its tenant did not create. A
    /// Responses id or conversation is the tenant's when its conversation logged it.
    pub(crate) async fn check_owned(
        &self,
        tenant: &crate::tenant::TenantId,
        named: &[String],
    ) -> Result<(), crate::error::ApiError> {
        let distinct: std::collections::BTreeSet<&String> = named.iter().collect();
        for object in distinct {
            let logged = self
                .tracker
                .conversation_of_response(tenant, object)
                .await
                .map_err(|err| crate::error::ApiError::storage(err.to_string()))?;
            if logged.is_none() {
                self.ownership.check(tenant, [object.as_str()]).await?;
            }
        }
        Ok(())
    }

    /// Refuses (507) a request of a tenant whose log already holds its
    /// `store.tenant_quota_bytes`. The store refuses, before writing, the lines that
    /// would take it past; this spares the work of a request that cannot be logged.
    pub(crate) async fn check_quota(
        &self,
        snap: &Snapshot,
        tenant: &crate::tenant::TenantId,
    ) -> Result<(), crate::error::ApiError> {
        let quota = snap.config.store.tenant_quota_bytes;
        if quota == 0 {
            return Ok(());
        }
        let used = self
            .tracker
            .store()
            .tenant_bytes(tenant)
            .await
            .map_err(|err| crate::rescue::store(&err))?;
        match used.filter(|used| *used >= quota) {
            Some(used) => Err(crate::error::ApiError::quota_exceeded(format!(
                "tenant {tenant} holds {used} bytes of logged conversations, its quota is {quota} (store.tenant_quota_bytes)"
            ))),
            None => Ok(()),
        }
    }

    /// Builds the state for `config` (loaded with `overrides`), opening its store.
    pub(crate) async fn new(config: Config, overrides: Overrides) -> Result<Self, StateError> {
        // With postgres the database is the system of record: nothing goes to data_dir.
        let disk = config.store.backend == StoreBackend::Disk;
        let data_dir_lock = disk
            .then(|| crate::store::DataDirLock::acquire(&config.data_dir))
            .transpose()?;
        if disk && migrate_legacy_layout(&config.data_dir)? {
            tracing::info!(
                data_dir = %config.data_dir.display(),
                "moved the conversations of a pre-tenant data dir to tenants/legacy/"
            );
        }
        let metrics = Arc::new(Metrics::default());
        let opened =
            crate::store::open(&config.store, &config.data_dir, Arc::clone(&metrics)).await?;
        opened.store.set_quota(config.store.tenant_quota_bytes);
        let secret = match opened.secret {
            Some(bytes) => ServerSecret::from_bytes(bytes),
            None => ServerSecret::load_or_create(&config.data_dir).map_err(|source| {
                StateError::Secret {
                    path: config.data_dir.join(SECRET_FILE).display().to_string(),
                    source,
                }
            })?,
        };
        let tokens = Arc::new(Tokens::with_capacity(
            crate::dialect::text::message_text,
            config.store.count_cache_entries,
        ));
        let half = usize::try_from(config.store.message_cache_bytes / 2).unwrap_or(usize::MAX);
        crate::dialect::size_facts_cache(config.store.facts_cache_entries, half);
        crate::dialect::size_prefix_cache(config.store.prefix_cache_entries, half);
        let parts = Parts {
            store: opened.store,
            secret,
            metrics,
            tokens,
            data_dir_lock,
            secrets: Secrets::default(),
        };
        Self::assemble(config, overrides, parts)
    }

    /// The state over a [`MemoryStore`](crate::store::MemoryStore) and a fixed
    /// secret, counting with `tokens` (shared, so its tables load once): what the
    /// in-process tests run the router on.
    #[cfg(test)]
    pub(crate) fn in_memory(
        config: Config,
        tokens: Arc<Tokens>,
        secrets: Secrets,
    ) -> Result<Self, StateError> {
        let parts = Parts {
            store: Arc::new(crate::store::MemoryStore::default()),
            secret: ServerSecret::from_bytes([7; 32]),
            metrics: Arc::new(Metrics::default()),
            tokens,
            data_dir_lock: None,
            secrets,
        };
        Self::assemble(config, Overrides::default(), parts)
    }

    fn assemble(config: Config, overrides: Overrides, parts: Parts) -> Result<Self, StateError> {
        let Parts {
            store,
            secret,
            metrics,
            tokens,
            data_dir_lock,
            secrets,
        } = parts;
        let config_limits = config.limits.clone();
        let ownership =
            crate::ownership::Ownership::new(Arc::clone(&store), config.store.cache_capacity);
        let tracker = Arc::new(
            Tracker::weighed(store, config.store.cache_capacity, config.store.cache_bytes)
                .with_lease_ttl(config.store.lease_ttl),
        );
        let shutdown = CancellationToken::new();
        let telemetry = crate::otel::Telemetry::start(&config.tracing, Arc::clone(&metrics))?;
        let compactor = Compactor {
            tokens: Arc::clone(&tokens),
            cancel: shutdown.clone(),
            metrics: Arc::clone(&metrics),
            summary_calibrations: Default::default(),
            background: crate::compaction::background::Background::new(
                config.compaction.max_background,
            ),
            summary_slots: Arc::new(tokio::sync::Semaphore::new(
                config.compaction.max_summary_concurrency.max(1),
            )),
            pace: Arc::default(),
        };
        Ok(Self {
            current: ArcSwap::from_pointee(Snapshot::build(config, &secrets)?),
            overrides,
            secrets,
            reload: Mutex::new(ReloadStatus::default()),
            tracker,
            ownership,
            tokens,
            compactor,
            metrics,
            shutdown,
            secret,
            limiter: Arc::default(),
            chat_gate: crate::gate::ChatGate::new(
                config_limits.max_concurrent_chat,
                config_limits.chat_queue,
            ),
            hook_forms: crate::neutral_forms::NeutralForms::new(),
            native_refusals: crate::native::Refusals::default(),
            telemetry,
            _data_dir_lock: data_dir_lock,
        })
    }

    /// Tells commands run beside this server where its admin API is (the data dir's
    /// lock file), when it holds a disk data dir.
    pub(crate) fn advertise(&self, url: &str) {
        if let Some(lock) = &self._data_dir_lock {
            if let Err(err) = lock.advertise(url) {
                tracing::warn!(error = %err, "cannot write the listening address into the data dir's lock file");
            }
        }
    }

    /// The config snapshot in force; hold it for the whole request.
    pub(crate) fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Reloads the config with the same flags: parsed and validated in full, then
    /// swapped at once; on any error the old snapshot stays and the error is kept. With
    /// `only_if_changed` (a file event), a config equal to the one in force is not
    /// swapped unless the last reload failed: an editor's or a watcher's second event
    /// for one save would otherwise rebuild every hook and plugin, and end their
    /// processes, for nothing.
    pub(crate) fn reload(&self, only_if_changed: bool) -> Result<(), String> {
        let attempt = humantime::format_rfc3339_millis(SystemTime::now()).to_string();
        let loaded = crate::settings::load(&self.overrides).map_err(StateError::from);
        if let (true, Ok(config)) = (only_if_changed, &loaded) {
            // After a refused file, the same config again is news: its error clears.
            let failed = self
                .reload
                .lock()
                .map_or(true, |status| status.last_error.is_some());
            if !failed && format!("{config:?}") == format!("{:?}", self.snapshot().config) {
                tracing::debug!(
                    "the config file changed on disk but not in content; nothing to reload"
                );
                return Ok(());
            }
        }
        let result = loaded.and_then(|config| Snapshot::build(config, &self.secrets));
        let mut status = self
            .reload
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        status.last_attempt = Some(attempt);
        match result {
            Ok(next) => {
                let previous = self.snapshot();
                for (key, changed) in [
                    ("listen", previous.config.listen != next.config.listen),
                    ("data_dir", previous.config.data_dir != next.config.data_dir),
                    ("workers", previous.config.workers != next.config.workers),
                    (
                        "store",
                        format!("{:?}", previous.config.store)
                            != format!("{:?}", next.config.store),
                    ),
                    (
                        "tls",
                        format!("{:?}", previous.config.tls) != format!("{:?}", next.config.tls),
                    ),
                ] {
                    if changed {
                        tracing::warn!(key, "this setting changes only after a restart");
                    }
                }
                self.current.store(Arc::new(next));
                status.reloads += 1;
                status.last_error = None;
                tracing::info!(reloads = status.reloads, "config reloaded");
                Ok(())
            }
            Err(err) => {
                let message = err.to_string();
                tracing::error!(error = %message, "config reload refused; the previous config stays in force");
                status.last_error = Some(message.clone());
                Err(message)
            }
        }
    }

    /// Reloads so far.
    pub(crate) fn reload_status(&self) -> ReloadStatus {
        self.reload.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// The config file a reload reads, if any.
    pub(crate) fn config_file(&self) -> Option<std::path::PathBuf> {
        config::config_file(&self.overrides)
    }
}
