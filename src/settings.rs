//! The config as the binary loads it: the settings layer's own checks
//! ([`config::load`]), then those of the layers above it that it cannot make, the plugin
//! registry's kinds and the store's URL.

use crate::config::{self, Config, ConfigError, Overrides};

/// The layered config, checked in full: what `serve`, a reload and `config check` load.
pub(crate) fn load(overrides: &Overrides) -> Result<Config, ConfigError> {
    let config = config::load(overrides)?;
    check(&config)?;
    Ok(config)
}

/// The checks of the layers above the settings layer.
pub(crate) fn check(config: &Config) -> Result<(), ConfigError> {
    crate::plugins::check(config)?;
    crate::store::check_url(&config.store)
}
