//! What every request handler shares: the config snapshot and the upstream client.

use std::sync::Arc;

use crate::config::Config;
use crate::upstream::{Upstream, UpstreamError};

/// Shared by every connection.
pub struct AppState {
    /// The effective config.
    pub config: Arc<Config>,
    /// The pooled upstream client.
    pub upstream: Upstream,
}

impl AppState {
    /// Builds the state for `config`.
    pub fn new(config: Config) -> Result<Self, UpstreamError> {
        let upstream = Upstream::new(&config.upstream)?;
        Ok(Self {
            config: Arc::new(config),
            upstream,
        })
    }
}
