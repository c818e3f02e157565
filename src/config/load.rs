//! Layered loading: built-in defaults, the embedded default file, the config file,
//! `HANDOFF_*` variables, then CLI flags, each stronger than the one before.

use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use http::Uri;
use serde::Serialize;

use super::Config;

/// The documented default config, compiled in so that `handoff serve` needs no file.
const EMBEDDED_DEFAULT: &str = include_str!("../../config/handoff.toml");

/// The file read when no `--config` is given, relative to the working directory.
const LOCAL_CONFIG: &str = "config/handoff.toml";

/// Strategies that run without a model and so can never fail to produce a handoff.
const DETERMINISTIC_STRATEGIES: &[&str] = &["extract"];

/// Every strategy kind this build knows.
const KNOWN_STRATEGIES: &[&str] = &["summarize", "extract"];

/// Why a configuration could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The named config file does not exist.
    #[error("config file {0} does not exist")]
    MissingFile(PathBuf),
    /// A source could not be parsed, or a key is unknown or mistyped.
    #[error("invalid config: {0}")]
    Parse(Box<figment::Error>),
    /// The keys parse but their values break a rule.
    #[error("invalid config: {key}: {reason}")]
    Invalid {
        /// Dotted path of the offending key.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// CLI flags, the strongest layer.
#[derive(Debug, Default, Clone, Serialize)]
pub struct Overrides {
    /// `--config FILE` (or `HANDOFF_CONFIG`).
    #[serde(skip)]
    pub config_file: Option<PathBuf>,
    /// `--listen ADDR`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// `--upstream URL`.
    #[serde(skip)]
    pub upstream: Option<String>,
    /// `--data-dir DIR`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
}

/// Loads and validates the effective configuration.
pub fn load(overrides: &Overrides) -> Result<Config, ConfigError> {
    let mut figment = Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(EMBEDDED_DEFAULT));

    let explicit = overrides
        .config_file
        .clone()
        .or_else(|| std::env::var_os("HANDOFF_CONFIG").map(PathBuf::from));
    match explicit {
        Some(path) => {
            // Toml::file silently skips a missing file; a named file that is absent is a typo.
            if !path.is_file() {
                return Err(ConfigError::MissingFile(path));
            }
            figment = figment.merge(Toml::file_exact(path));
        }
        None if Path::new(LOCAL_CONFIG).is_file() => {
            figment = figment.merge(Toml::file_exact(LOCAL_CONFIG));
        }
        None => {}
    }

    figment = figment
        .merge(Env::prefixed("HANDOFF_").split("__").ignore(&["config"]))
        .merge(Serialized::defaults(overrides));
    if let Some(url) = &overrides.upstream {
        figment = figment.merge(("upstream.base_url", url));
    }

    let config: Config = figment
        .extract()
        .map_err(|err| ConfigError::Parse(Box::new(err)))?;
    validate(&config)?;
    Ok(config)
}

fn invalid(key: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_owned(),
        reason: reason.into(),
    }
}

/// Checks the rules that types alone cannot express.
fn validate(config: &Config) -> Result<(), ConfigError> {
    let uri: Uri = config
        .upstream
        .base_url
        .parse()
        .map_err(|err| invalid("upstream.base_url", format!("not a URL: {err}")))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(invalid("upstream.base_url", "scheme must be http or https")),
    }
    if uri.authority().is_none() {
        return Err(invalid("upstream.base_url", "has no host"));
    }
    if uri.query().is_some() {
        return Err(invalid(
            "upstream.base_url",
            "must not carry a query string",
        ));
    }

    if config.tls.cert_file.is_some() != config.tls.key_file.is_some() {
        return Err(invalid(
            "tls",
            "set both cert_file and key_file, or neither",
        ));
    }
    if config.limits.max_body_bytes == 0 {
        return Err(invalid("limits.max_body_bytes", "must be above 0"));
    }

    let compaction = &config.compaction;
    if !(compaction.trigger > 0.0 && compaction.trigger <= 1.0) {
        return Err(invalid("compaction.trigger", "must be in (0, 1]"));
    }
    if !(compaction.keep_recent > 0.0 && compaction.keep_recent < 1.0) {
        return Err(invalid("compaction.keep_recent", "must be in (0, 1)"));
    }
    if !KNOWN_STRATEGIES.contains(&compaction.strategy.as_str()) {
        return Err(invalid(
            "compaction.strategy",
            format!(
                "unknown strategy {:?}; known: {}",
                compaction.strategy,
                KNOWN_STRATEGIES.join(", ")
            ),
        ));
    }
    if !DETERMINISTIC_STRATEGIES.contains(&compaction.fallback.as_str()) {
        return Err(invalid(
            "compaction.fallback",
            format!(
                "{:?} is not deterministic; the fallback must be one of: {}",
                compaction.fallback,
                DETERMINISTIC_STRATEGIES.join(", ")
            ),
        ));
    }
    for (name, model) in &config.models {
        if model.context_window == 0 {
            return Err(invalid(
                &format!("models.\"{name}\".context_window"),
                "must be above 0",
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_is_valid_and_knows_common_models() {
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(EMBEDDED_DEFAULT))
            .extract()
            .unwrap();
        validate(&config).unwrap();
        assert_eq!(config.model("gpt-4o").unwrap().context_window, 128_000);
        assert_eq!(
            config.model("gpt-4o-2024-08-06").unwrap().context_window,
            128_000
        );
        assert!(config.model("no-such-model").is_none());
    }

    #[test]
    fn misspelt_key_names_the_key() {
        let err = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string("[compaction]\ntrigerr = 0.5\n"))
            .extract::<Config>()
            .unwrap_err();
        assert!(err.to_string().contains("trigerr"), "{err}");
    }

    #[test]
    fn non_deterministic_fallback_is_refused() {
        let mut config = Config::default();
        config.compaction.fallback = "summarize".into();
        let err = validate(&config).unwrap_err().to_string();
        assert!(err.contains("compaction.fallback"), "{err}");
    }
}
