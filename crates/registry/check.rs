//! A config's kind names checked against this build's registry: every strategy kind
//! known, every chain ending in a strategy that calls no model, every hook built. The
//! settings layer checks the rest (`handoff_core::config::load`).

use handoff_core::config::{strategy_kind, Config, ConfigError};

use super::chains::HookChains;
use super::strategies::{is_deterministic, is_known, known};

/// Checks `config`'s strategy and hook kinds; the error names the key.
pub fn check(config: &Config) -> Result<(), ConfigError> {
    let compaction = &config.compaction;
    for (name, strategy) in &compaction.strategies {
        if !is_known(&strategy.kind) {
            return Err(invalid(
                format!("compaction.strategies.{name}.kind"),
                format!(
                    "unknown kind {:?}; known: {}",
                    strategy.kind,
                    known().join(", ")
                ),
            ));
        }
    }
    if compaction.chain.is_empty() {
        let fallback = strategy_kind(config, &compaction.fallback).unwrap_or_default();
        if !is_deterministic(fallback) {
            return Err(invalid(
                "compaction.fallback".into(),
                format!(
                    "{:?} is not deterministic; the fallback must call no model (kind extract)",
                    compaction.fallback
                ),
            ));
        }
    }
    ends_deterministic(
        config,
        "compaction.chain".into(),
        &compaction.global_chain(),
    )?;
    for (model, entry) in &config.models {
        if let Some(own) = entry
            .compaction
            .as_ref()
            .filter(|own| !own.chain.is_empty())
        {
            let key = format!("models.\"{model}\".compaction.chain");
            ends_deterministic(config, key, &own.chain)?;
        }
    }
    for (index, route) in config.routes.iter().enumerate() {
        if let Some(chain) = &route.chain {
            ends_deterministic(config, format!("routes[{index}].chain"), chain)?;
        }
    }
    HookChains::build(config)?;
    Ok(())
}

/// A chain must end in a strategy that always produces a handoff without a model.
fn ends_deterministic(config: &Config, key: String, chain: &[String]) -> Result<(), ConfigError> {
    let Some(last) = chain.last() else {
        return Ok(());
    };
    let kind = strategy_kind(config, last).unwrap_or_default();
    if is_deterministic(kind) {
        return Ok(());
    }
    Err(invalid(
        key,
        format!("must end in a deterministic strategy (one that calls no model, such as kind extract); {last:?} is {kind}"),
    ))
}

fn invalid(key: String, reason: String) -> ConfigError {
    ConfigError::Invalid { key, reason }
}

#[cfg(test)]
mod tests {
    use handoff_core::config::{from_toml, Config};

    use super::check;

    fn load(toml: &str) -> Result<Config, String> {
        let config = from_toml(toml).map_err(|err| err.to_string())?;
        check(&config).map_err(|err| err.to_string())?;
        Ok(config)
    }

    #[test]
    fn chains_are_checked_where_they_are_declared() {
        let ok = load(
            "[compaction]\nchain = [\"cheap\", \"summarize\", \"extract\"]\n[compaction.strategies.cheap]\nkind = \"summarize\"\nmodel = \"gpt-4o-mini\"\n",
        );
        assert!(ok.is_ok(), "{ok:?}");
        let err = |toml: &str| load(toml).unwrap_err();
        assert!(
            err("[compaction]\nchain = [\"nope\", \"extract\"]\n").contains("compaction.chain[0]")
        );
        assert!(err("[compaction]\nchain = [\"summarize\"]\n").contains("deterministic"));
        assert!(err("[compaction.strategies.x]\nkind = \"magic\"\n")
            .contains("compaction.strategies.x.kind"));
        assert!(err("[compaction.strategies.x]\nkind = \"exec\"\n").contains("needs a command"));
        assert!(
            err("[[routes]]\nmatch = \"gpt*\"\nchain = [\"summarize\"]\n")
                .contains("routes[0].chain")
        );
        assert!(err(
            "[models.m]\ncontext_window = 10\n[models.m.compaction]\nchain = [\"summarize\"]\n"
        )
        .contains("models.\"m\".compaction.chain"));
        assert!(err("[compaction]\nrequest_override_allow = [\"ghost\"]\n")
            .contains("request_override_allow[0]"));
        assert!(err("[middleware.hooks.h]\nkind = \"nope\"\n").contains("middleware.hooks.h.kind"));
    }

    #[test]
    fn a_non_deterministic_fallback_is_refused() {
        let err = load("[compaction]\nfallback = \"summarize\"\n").unwrap_err();
        assert!(err.contains("compaction.fallback"), "{err}");
    }
}
