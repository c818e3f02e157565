//! The strategy registry: every named strategy of the config, built once per config
//! snapshot, and the choice of chain for a request (header override, route, model,
//! global).

use std::collections::HashMap;
use std::sync::Arc;

use handoff_plugin_api::Strategy;
use handoff_strategy_exec::Exec;
use handoff_strategy_extract::Extract;
use handoff_strategy_summarize::{Summarize, DEFAULT_PROMPT};

use crate::compaction::chain::{NamedStrategy, SummaryModel};
use crate::config::{Config, StrategyConfig};

/// Why the registry could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// A strategy kind this build does not have.
    #[error("compaction.strategies.{name}: unknown kind {kind:?}")]
    UnknownKind {
        /// The strategy's name.
        name: String,
        /// Its kind.
        kind: String,
    },
    /// A prompt template could not be read.
    #[error("{key} {path}: {source}")]
    Prompt {
        /// The config key.
        key: String,
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// Every strategy of a config, by name.
pub struct Registry {
    by_name: HashMap<String, NamedStrategy>,
    global: Vec<String>,
}

fn read_prompt(key: &str, path: Option<&std::path::PathBuf>) -> Result<String, ChainError> {
    match path {
        None => Ok(DEFAULT_PROMPT.to_owned()),
        Some(path) => std::fs::read_to_string(path).map_err(|source| ChainError::Prompt {
            key: key.to_owned(),
            path: path.display().to_string(),
            source,
        }),
    }
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
            let strategy: Arc<dyn Strategy> = match settings.kind.as_str() {
                "summarize" => {
                    let prompt =
                        read_prompt(&format!("{key}.prompt_file"), settings.prompt_file.as_ref())?;
                    Arc::new(Summarize::new(prompt, settings.request_extra.clone()))
                }
                "extract" => Arc::new(Extract),
                "exec" => Arc::new(Exec::new(
                    settings.command.clone(),
                    settings.env.clone(),
                    settings.max_output_bytes,
                )),
                other => match crate::config::kinds::factory(other) {
                    Some(factory) => factory(settings),
                    None => {
                        return Err(ChainError::UnknownKind {
                            name: name.to_owned(),
                            kind: other.to_owned(),
                        })
                    }
                },
            };
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
        Ok(Self {
            by_name,
            global: compaction.global_chain(),
        })
    }

    /// The strategies called `names`, in order (unknown names were refused at load).
    pub fn chain(&self, names: &[String]) -> Vec<NamedStrategy> {
        names
            .iter()
            .filter_map(|n| self.by_name.get(n).cloned())
            .collect()
    }

    /// The chain for a request: the client's allowed override (then the global chain's
    /// deterministic end), else the route's, else the model's, else the global one.
    pub fn select(
        &self,
        config: &Config,
        model: &str,
        override_name: Option<&str>,
    ) -> Vec<NamedStrategy> {
        if let Some(name) = override_name {
            let mut names = vec![name.to_owned()];
            let deterministic = self
                .by_name
                .get(name)
                .is_some_and(|named| named.strategy.is_deterministic());
            if !deterministic {
                names.extend(self.global.last().cloned());
            }
            return self.chain(&names);
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
            .map(|c| c.chain.as_slice());
        self.chain(route.or(own).unwrap_or(&self.global))
    }
}
