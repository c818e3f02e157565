//! Building the strategy chain from config: `compaction.strategy` first,
//! `compaction.fallback` (always deterministic) last.

use std::sync::Arc;

use handoff_strategy_extract::Extract;
use handoff_strategy_summarize::{Summarize, DEFAULT_PROMPT};

use crate::compaction::chain::NamedStrategy;
use crate::config::CompactionConfig;

/// Why a chain could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ChainError {
    /// A strategy kind this build does not have.
    #[error("compaction: unknown strategy {0:?}; known: summarize, extract")]
    UnknownKind(String),
    /// The prompt template could not be read.
    #[error("compaction.prompt_file {path}: {source}")]
    Prompt {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The chain for `config`, first to last, without repeats.
pub fn build_chain(config: &CompactionConfig) -> Result<Vec<NamedStrategy>, ChainError> {
    let mut names = vec![config.strategy.clone()];
    if config.fallback != config.strategy {
        names.push(config.fallback.clone());
    }
    names
        .into_iter()
        .map(|name| {
            let strategy: Arc<dyn handoff_plugin_api::Strategy> = match name.as_str() {
                "summarize" => Arc::new(Summarize::new(
                    prompt(config)?,
                    config.summary_request_extra.clone(),
                )),
                "extract" => Arc::new(Extract),
                other => return Err(ChainError::UnknownKind(other.to_owned())),
            };
            Ok(NamedStrategy { name, strategy })
        })
        .collect()
}

fn prompt(config: &CompactionConfig) -> Result<String, ChainError> {
    match &config.prompt_file {
        None => Ok(DEFAULT_PROMPT.to_owned()),
        Some(path) => std::fs::read_to_string(path).map_err(|source| ChainError::Prompt {
            path: path.display().to_string(),
            source,
        }),
    }
}
