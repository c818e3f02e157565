//! What every request handler shares: the config snapshot, the upstream client, the
//! conversation tracker, token counting, the compactor and the counters.

use std::sync::Arc;

use handoff_plugin_api::CancellationToken;

use crate::compaction::service::Compactor;
use crate::config::Config;
use crate::conversation::Tracker;
use crate::metrics::Metrics;
use crate::store::{DiskStore, Store, Writer};
use crate::strategies::{build_chain, ChainError};
use crate::tokens::Tokens;
use crate::upstream::{Upstream, UpstreamError};

/// Why the shared state could not be built.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The upstream client could not be built.
    #[error(transparent)]
    Upstream(#[from] UpstreamError),
    /// The writer thread could not start.
    #[error("cannot start the log writer: {0}")]
    Writer(std::io::Error),
    /// The strategy chain could not be built.
    #[error(transparent)]
    Chain(#[from] ChainError),
}

/// Shared by every connection.
pub struct AppState {
    /// The effective config.
    pub config: Arc<Config>,
    /// The pooled upstream client.
    pub upstream: Upstream,
    /// Conversation tracking over the store.
    pub tracker: Arc<Tracker>,
    /// Token counting with its cache.
    pub tokens: Arc<Tokens>,
    /// Compaction runs.
    pub compactor: Compactor,
    /// Counters for `/handoff/metrics`.
    pub metrics: Arc<Metrics>,
    /// Fired at shutdown: running compactions stop and commit nothing.
    pub shutdown: CancellationToken,
}

impl AppState {
    /// Builds the state for `config`; must run inside the tokio runtime.
    pub fn new(config: Config) -> Result<Self, StateError> {
        let upstream = Upstream::new(&config.upstream)?;
        let writer = Writer::start(config.store.fsync).map_err(StateError::Writer)?;
        let store: Arc<dyn Store> = Arc::new(DiskStore::new(&config.data_dir, writer));
        let tracker = Arc::new(Tracker::new(store, config.store.cache_capacity));
        let tokens = Arc::new(Tokens::new());
        let warm = Arc::clone(&tokens);
        // Loading the tokenizer tables takes a few hundred ms: not on the first request.
        tokio::task::spawn_blocking(move || warm.warm());
        let metrics = Arc::new(Metrics::default());
        let shutdown = CancellationToken::new();
        let compactor = Compactor {
            chain: build_chain(&config.compaction)?,
            tokens: Arc::clone(&tokens),
            cancel: shutdown.clone(),
            metrics: Arc::clone(&metrics),
        };
        Ok(Self {
            config: Arc::new(config),
            upstream,
            tracker,
            tokens,
            compactor,
            metrics,
            shutdown,
        })
    }
}
