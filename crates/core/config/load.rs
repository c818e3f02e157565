//! Layered loading: built-in defaults, the embedded default file, the config file,
//! `HANDOFF_*` variables, then CLI flags, each stronger than the one before.

use std::path::{Path, PathBuf};

use figment::providers::{Env, Format, Serialized, Toml};
use figment::Figment;
use http::Uri;
use serde::Serialize;

use super::{Config, PrepareAt};

/// The documented default config, compiled in so that `handoff serve` needs no file.
const EMBEDDED_DEFAULT: &str = include_str!("../../../config/handoff.toml");

/// The file read when no `--config` is given, relative to the working directory.
const LOCAL_CONFIG: &str = "config/handoff.toml";

/// Built-in strategies a chain may name without declaring them (exec needs a command).
const USABLE_BY_NAME: &[&str] = &["summarize", "extract"];

/// The kind of the strategy called `name`: declared, or a built-in used by name.
pub fn strategy_kind<'a>(config: &'a Config, name: &'a str) -> Option<&'a str> {
    match config.compaction.strategies.get(name) {
        Some(declared) => Some(declared.kind.as_str()),
        None if USABLE_BY_NAME.contains(&name) => Some(name),
        None => None,
    }
}

/// Checks a chain at `key`: at least one strategy, each a known name. Its kinds, and
/// that its last calls no model, the plugin registry checks (`handoff_registry::check`).
fn validate_chain(config: &Config, key: &str, chain: &[String]) -> Result<(), ConfigError> {
    if chain.is_empty() {
        return Err(invalid(key, "a chain needs at least one strategy"));
    }
    for (index, name) in chain.iter().enumerate() {
        if strategy_kind(config, name).is_none() {
            return Err(invalid(
                &format!("{key}[{index}]"),
                format!(
                    "unknown strategy {name:?}; declare it under [compaction.strategies.{name}]"
                ),
            ));
        }
    }
    Ok(())
}

/// Checks strategy kinds, chain names and endings, the override allow-list, and routes.
fn validate_strategies(config: &Config) -> Result<(), ConfigError> {
    let compaction = &config.compaction;
    for (name, strategy) in &compaction.strategies {
        let key = format!("compaction.strategies.{name}");
        if strategy.kind == "exec" && strategy.command.is_empty() {
            return Err(invalid(
                &format!("{key}.command"),
                "an exec strategy needs a command",
            ));
        }
    }
    if compaction.chain.is_empty() && strategy_kind(config, &compaction.strategy).is_none() {
        return Err(invalid(
            "compaction.strategy",
            format!("unknown strategy {:?}; known: summarize, extract, or a name under [compaction.strategies]", compaction.strategy),
        ));
    }
    validate_chain(config, "compaction.chain", &compaction.global_chain())?;
    for (model, entry) in &config.models {
        if let Some(own) = &entry.compaction {
            if !own.chain.is_empty() {
                validate_chain(
                    config,
                    &format!("models.\"{model}\".compaction.chain"),
                    &own.chain,
                )?;
            }
            if own.keep_recent.is_some_and(|k| !(k > 0.0 && k < 1.0)) {
                return Err(invalid(
                    &format!("models.\"{model}\".compaction.keep_recent"),
                    "must be in (0, 1)",
                ));
            }
        }
    }
    for (index, route) in config.routes.iter().enumerate() {
        if let Some(chain) = &route.chain {
            validate_chain(config, &format!("routes[{index}].chain"), chain)?;
        }
        if let Some(url) = &route.upstream {
            let uri: Uri = url.parse().map_err(|err| {
                invalid(
                    &format!("routes[{index}].upstream"),
                    format!("not a URL: {err}"),
                )
            })?;
            if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.authority().is_none() {
                return Err(invalid(
                    &format!("routes[{index}].upstream"),
                    "must be an http(s) URL with a host",
                ));
            }
        }
    }
    for (index, name) in compaction.request_override_allow.iter().enumerate() {
        if strategy_kind(config, name).is_none() {
            return Err(invalid(
                &format!("compaction.request_override_allow[{index}]"),
                format!("unknown strategy {name:?}"),
            ));
        }
    }
    Ok(())
}

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

/// The file the config is read from: `--config`, `HANDOFF_CONFIG`, else
/// `config/handoff.toml` when it exists.
pub fn config_file(overrides: &Overrides) -> Option<PathBuf> {
    overrides
        .config_file
        .clone()
        .or_else(|| std::env::var_os("HANDOFF_CONFIG").map(PathBuf::from))
        .or_else(|| {
            Path::new(LOCAL_CONFIG)
                .is_file()
                .then(|| PathBuf::from(LOCAL_CONFIG))
        })
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

/// A config from the defaults, the embedded default file and `text`, checked as
/// [`load`] checks it, without reading any file or the environment: for in-process
/// tests and embedding.
pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
    let config: Config = Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(EMBEDDED_DEFAULT))
        .merge(Toml::string(text))
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
    config
        .tracing
        .check()
        .map_err(|(key, reason)| invalid(key, reason))?;
    for (index, rule) in config.compaction.pin.rules.iter().enumerate() {
        regex::Regex::new(&rule.pattern).map_err(|err| {
            invalid(
                &format!("compaction.pin.rules[{index}].pattern"),
                err.to_string(),
            )
        })?;
    }
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
    for (key, value) in [
        ("limits.max_body_bytes", config.limits.max_body_bytes),
        ("limits.max_connections", config.limits.max_connections),
        (
            "limits.max_concurrent_chat",
            config.limits.max_concurrent_chat,
        ),
    ] {
        if value == 0 {
            return Err(invalid(key, "must be above 0"));
        }
    }

    if config.admin.token.as_deref().is_some_and(str::is_empty) {
        return Err(invalid(
            "admin.token",
            "is empty; remove it or set a token (an empty one would open the admin API)",
        ));
    }
    validate_keys(config)?;
    validate_store(&config.store)?;

    let compaction = &config.compaction;
    if compaction.max_summary_calls == 0 {
        return Err(invalid(
            "compaction.max_summary_calls",
            "must be at least 1",
        ));
    }
    if !(compaction.trigger > 0.0 && compaction.trigger <= 1.0) {
        return Err(invalid("compaction.trigger", "must be in (0, 1]"));
    }
    if !(compaction.keep_recent > 0.0 && compaction.keep_recent < 1.0) {
        return Err(invalid("compaction.keep_recent", "must be in (0, 1)"));
    }
    if !(0.0..=0.75).contains(&compaction.ledger_share) {
        return Err(invalid(
            "compaction.ledger_share",
            "must be in [0, 0.75]: the strategy needs the rest of the handoff budget",
        ));
    }
    if let PrepareAt::Share(share) = compaction.prepare_at {
        if !(0.0..1.0).contains(&share) {
            return Err(invalid(
                "compaction.prepare_at",
                "must be \"auto\" or in [0, 1): a share of the trigger (0: never prepare)",
            ));
        }
    }
    validate_strategies(config)?;
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

/// Checks that a postgres store has a URL it can parse, and sane sizes.
fn validate_store(store: &super::StoreConfig) -> Result<(), ConfigError> {
    if store.backend == super::StoreBackend::Postgres {
        // Its syntax is the store's to check (`handoff_store::check_url`).
        if store.url.is_none() {
            return Err(invalid(
                "store.url",
                "the postgres backend needs a url (or HANDOFF_STORE__URL)",
            ));
        }
    }
    if store.pool_size == 0 {
        return Err(invalid("store.pool_size", "must be at least 1"));
    }
    if store.lease_ttl < std::time::Duration::from_millis(100) {
        return Err(invalid("store.lease_ttl", "must be at least 100ms"));
    }
    Ok(())
}

/// True for the tenant names handoff gives callers without a key.
fn is_reserved_tenant(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower == "legacy"
        || lower
            .strip_prefix("t-")
            .is_some_and(|hex| hex.len() == 16 && hex.chars().all(|c| c.is_ascii_hexdigit()))
}

/// Checks `[[auth.keys]]`: tenant-safe unique names, one way to recognise each key.
fn validate_keys(config: &Config) -> Result<(), ConfigError> {
    let mut names = std::collections::HashSet::new();
    for (index, key) in config.auth.keys.iter().enumerate() {
        let at = format!("auth.keys[{index}]");
        crate::base::tenant::TenantId::parse(&key.name)
            .map_err(|err| invalid(&format!("{at}.name"), err.to_string()))?;
        if is_reserved_tenant(&key.name) {
            // Such a key would continue the conversations of a keyless caller.
            return Err(invalid(
                &format!("{at}.name"),
                format!(
                    "{:?} is reserved: `legacy` and `t-` + 16 hex digits name the tenants handoff derives",
                    key.name
                ),
            ));
        }
        if !names.insert(key.name.as_str()) {
            return Err(invalid(
                &format!("{at}.name"),
                format!("{:?} is used twice", key.name),
            ));
        }
        match (&key.sha256, &key.key_env) {
            (Some(hex), None) => {
                if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
                    return Err(invalid(
                        &format!("{at}.sha256"),
                        "must be 64 hex digits (sha256sum of the key)",
                    ));
                }
            }
            (None, Some(_)) => {}
            _ => return Err(invalid(&at, "set exactly one of sha256 and key_env")),
        }
    }
    Ok(())
}

/// Checks what only `serve` needs: the variables keys come from, and that a listener
/// reachable from other hosts is not left open by mistake.
pub fn check_serve(config: &Config) -> Result<(), ConfigError> {
    let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.is_empty());
    for (index, key) in config.auth.keys.iter().enumerate() {
        if let Some(name) = key.key_env.as_deref().filter(|n| !set(n)) {
            return Err(invalid(
                &format!("auth.keys[{index}].key_env"),
                format!("the variable {name} is not set"),
            ));
        }
    }
    if let Some(name) = config.upstream.api_key_env.as_deref().filter(|n| !set(n)) {
        return Err(invalid(
            "upstream.api_key_env",
            format!("the variable {name} is not set"),
        ));
    }
    let open = config.auth.keys.is_empty() && config.admin.token.is_none();
    if open && !config.listen.ip().is_loopback() && !config.auth.allow_open {
        return Err(invalid(
            "listen",
            format!(
                "{} is reachable from other hosts, and neither auth.keys nor admin.token is set; set one of them, or auth.allow_open = true to serve it open",
                config.listen
            ),
        ));
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
    fn a_key_cannot_take_a_derived_tenants_name() {
        let hex = "0".repeat(64);
        for name in ["legacy", "t-0123456789abcdef", "T-0123456789ABCDEF"] {
            let config: Config = Figment::from(Serialized::defaults(Config::default()))
                .merge(Toml::string(&format!(
                    "[[auth.keys]]\nname = \"{name}\"\nsha256 = \"{hex}\"\n"
                )))
                .extract()
                .unwrap();
            let err = validate(&config).unwrap_err().to_string();
            assert!(err.contains("reserved"), "{name}: {err}");
        }
        let config: Config = Figment::from(Serialized::defaults(Config::default()))
            .merge(Toml::string(&format!(
                "[[auth.keys]]\nname = \"t-team\"\nsha256 = \"{hex}\"\n"
            )))
            .extract()
            .unwrap();
        assert!(validate(&config).is_ok());
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
    fn chain_names_are_checked_where_they_are_declared() {
        let err = |toml: &str| from_toml(toml).unwrap_err().to_string();
        assert!(
            err("[compaction]\nchain = [\"nope\", \"extract\"]\n").contains("compaction.chain[0]")
        );
        assert!(err("[compaction.strategies.x]\nkind = \"exec\"\n").contains("needs a command"));
        assert!(err("[models.m]\ncontext_window = 10\n[models.m.compaction]\nchain = [\"zzz\", \"extract\"]\n").contains("models.\"m\".compaction.chain[0]"));
        assert!(err("[compaction]\nrequest_override_allow = [\"ghost\"]\n")
            .contains("request_override_allow[0]"));
    }
}
