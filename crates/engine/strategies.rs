//! The strategy registry: every named strategy of the config, built once per config
//! snapshot by the plugin registry (`handoff-registry`), and the choice of chain for a
//! request (header override, route, model, global).

use std::collections::HashMap;
use std::sync::Arc;

use handoff_registry::{build_strategy, BuildError};

use crate::compaction::chain::{Chain, NamedStrategy, SummaryModel};
use crate::config::{Config, StrategyConfig};

/// Why the registry could not be built.
#[derive(Debug, thiserror::Error)]
#[error("{key}: {source}")]
pub struct ChainError {
    /// The config key of the strategy.
    pub key: String,
    /// What the plugin registry could not build.
    pub source: BuildError,
}

/// Every strategy of a config, by name, and every chain the config names, built once.
pub struct Registry {
    by_name: HashMap<String, NamedStrategy>,
    global: Vec<String>,
    /// The global chain, built: what most requests take, without a lookup.
    global_chain: Chain,
    /// The global chain, each route's and each model's, by their names: a request
    /// takes one of these by reference count, not by copying its strategies.
    chains: HashMap<Box<[String]>, Chain>,
    /// The chain a client's override of each strategy selects.
    overrides: HashMap<String, Chain>,
}

impl Registry {
    /// Builds every strategy of `config` (reading prompt files).
    pub fn build(config: &Config) -> Result<Self, ChainError> {
        let compaction = &config.compaction;
        let mut by_name = HashMap::new();
        let builtin_summarize = StrategyConfig {
            kind: "summarize".into(),
            model: compaction.summary_model.clone(),
            prompt_file: compaction.prompt_file.clone(),
            request_extra: compaction.summary_request_extra.clone(),
            timeout: None,
            command: Vec::new(),
            env: Vec::new(),
            max_output_bytes: 0,
            prune: None,
            handoff_tokens: None,
        };
        let builtin_extract = StrategyConfig {
            kind: "extract".into(),
            ..builtin_summarize.clone()
        };
        let declared = compaction
            .strategies
            .iter()
            .map(|(n, c)| (n.as_str(), c, format!("compaction.strategies.{n}")));
        let builtins = [
            ("summarize", &builtin_summarize),
            ("extract", &builtin_extract),
        ]
        .into_iter()
        .filter(|(name, _)| !compaction.strategies.contains_key(*name))
        .map(|(n, c)| (n, c, "compaction".to_owned()));
        for (name, settings, key) in builtins.chain(declared) {
            let strategy = build_strategy(settings).map_err(|source| ChainError {
                key: key.clone(),
                source,
            })?;
            let summary_model = settings.model.clone().map(|name| {
                let entry = config.model(&name);
                SummaryModel {
                    window: entry.map(|m| m.context_window),
                    tokenizer: entry.map(|m| m.tokenizer),
                    name,
                }
            });
            by_name.insert(
                name.to_owned(),
                NamedStrategy {
                    name: name.to_owned(),
                    strategy,
                    timeout: settings.timeout,
                    summary_model,
                    prune: settings.prune.map(|p| p.keep_recent_tokens),
                    handoff_tokens: settings.handoff_tokens,
                },
            );
        }
        let mut registry = Self {
            by_name,
            global: compaction.global_chain(),
            global_chain: Chain::default(),
            chains: HashMap::new(),
            overrides: HashMap::new(),
        };
        let routes = config.routes.iter().filter_map(|r| r.chain.as_deref());
        let models = config
            .models
            .values()
            .filter_map(|m| m.compaction.as_ref())
            .map(|c| c.chain.as_slice())
            .filter(|chain| !chain.is_empty());
        let named: Vec<&[String]> = std::iter::once(registry.global.as_slice())
            .chain(routes)
            .chain(models)
            .collect();
        let chains = named
            .into_iter()
            .map(|names| (names.into(), registry.chain(names)))
            .collect();
        let overrides = registry
            .by_name
            .keys()
            .map(|name| (name.clone(), registry.overridden(name)))
            .collect();
        registry.chains = chains;
        registry.overrides = overrides;
        registry.global_chain = registry.named(&registry.global);
        Ok(registry)
    }

    /// The strategies called `names`, in order (unknown names were refused at load).
    pub fn chain(&self, names: &[String]) -> Chain {
        names
            .iter()
            .filter_map(|n| self.by_name.get(n).cloned())
            .collect()
    }

    /// The chain a client's override selects: `name`, then the global chain's
    /// deterministic end unless `name` is deterministic itself.
    fn overridden(&self, name: &str) -> Chain {
        let mut names = vec![name.to_owned()];
        let deterministic = self
            .by_name
            .get(name)
            .is_some_and(|named| named.strategy.is_deterministic());
        if !deterministic {
            names.extend(self.global.last().cloned());
        }
        self.chain(&names)
    }

    /// The chain called `names`: built at load when the config names it.
    fn named(&self, names: &[String]) -> Chain {
        match self.chains.get(names) {
            Some(chain) => Arc::clone(chain),
            None => self.chain(names),
        }
    }

    /// The chain for a request: the client's allowed override (then the global chain's
    /// deterministic end), else the route's, else the model's, else the global one.
    pub fn select(&self, config: &Config, model: &str, override_name: Option<&str>) -> Chain {
        if let Some(name) = override_name {
            return match self.overrides.get(name) {
                Some(chain) => Arc::clone(chain),
                None => self.overridden(name),
            };
        }
        // Borrowed: this runs on every tracked request.
        let route = config
            .routes
            .iter()
            .find(|r| r.matches(model))
            .and_then(|r| r.chain.as_deref());
        let own = config
            .model(model)
            .and_then(|m| m.compaction.as_ref())
            .map(|c| c.chain.as_slice())
            .filter(|chain| !chain.is_empty());
        match route.or(own) {
            Some(names) => self.named(names),
            None => Arc::clone(&self.global_chain),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(chain: &Chain) -> Vec<&str> {
        chain.iter().map(|s| s.name.as_str()).collect()
    }

    #[test]
    fn each_request_shares_the_chain_built_at_load_and_selects_as_documented() {
        let config = crate::config::from_toml(
            "[models.\"own\"]\ncontext_window = 4096\n[models.\"own\".compaction]\nchain = [\"extract\"]\n\
             [[routes]]\nmatch = \"rt-*\"\nchain = [\"quick\", \"extract\"]\n\
             [compaction]\nchain = [\"summarize\", \"extract\"]\n\
             request_override_allow = [\"quick\", \"extract\"]\n\
             [compaction.strategies.quick]\nkind = \"summarize\"\n",
        )
        .unwrap();
        let registry = Registry::build(&config).unwrap();
        let select = |model: &str, chosen: Option<&str>| registry.select(&config, model, chosen);

        assert_eq!(names(&select("gpt-4o", None)), ["summarize", "extract"]);
        assert_eq!(names(&select("rt-1", None)), ["quick", "extract"]);
        assert_eq!(names(&select("own", None)), ["extract"]);
        // An override keeps the global chain's deterministic end, unless it is one.
        assert_eq!(names(&select("own", Some("quick"))), ["quick", "extract"]);
        assert_eq!(names(&select("rt-1", Some("extract"))), ["extract"]);

        // Two requests get the same chain, not two copies of its strategies.
        for (model, chosen) in [
            ("gpt-4o", None),
            ("rt-1", None),
            ("own", None),
            ("own", Some("quick")),
        ] {
            assert!(
                Arc::ptr_eq(&select(model, chosen), &select(model, chosen)),
                "{model} {chosen:?} built its chain again"
            );
        }
    }
}
