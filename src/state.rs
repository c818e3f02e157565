//! What every request handler shares: the config snapshot, the upstream client and the
//! conversation tracker.

use std::sync::Arc;

use crate::config::Config;
use crate::conversation::Tracker;
use crate::store::{DiskStore, Store, Writer};
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
}

/// Shared by every connection.
pub struct AppState {
    /// The effective config.
    pub config: Arc<Config>,
    /// The pooled upstream client.
    pub upstream: Upstream,
    /// Conversation tracking over the store.
    pub tracker: Arc<Tracker>,
}

impl AppState {
    /// Builds the state for `config`; must run inside the tokio runtime.
    pub fn new(config: Config) -> Result<Self, StateError> {
        let upstream = Upstream::new(&config.upstream)?;
        let writer = Writer::start(config.store.fsync).map_err(StateError::Writer)?;
        let store: Arc<dyn Store> = Arc::new(DiskStore::new(&config.data_dir, writer));
        let tracker = Arc::new(Tracker::new(store, config.store.cache_capacity));
        Ok(Self {
            config: Arc::new(config),
            upstream,
            tracker,
        })
    }
}
