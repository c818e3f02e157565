//! Strategy kinds: `summarize`, `extract` and `exec` built in, plus the kinds a binary
//! registers (a Rust strategy crate; see `docs/plugins.md`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, OnceLock, RwLock};

use handoff_core::config::StrategyConfig;
use handoff_plugin_api::Strategy;
use handoff_strategy_exec::Exec;
use handoff_strategy_extract::Extract;
use handoff_strategy_summarize::Summarize;

/// The prompt `summarize` writes with when no `prompt_file` is set.
pub use handoff_strategy_summarize::DEFAULT_PROMPT;

/// Builds a strategy of a registered kind from its `[compaction.strategies.<name>]`
/// settings.
pub type StrategyFactory = fn(&StrategyConfig) -> Arc<dyn Strategy>;

/// Why a strategy could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// A kind this build does not have.
    #[error("unknown kind {kind:?}; known: {known}")]
    UnknownKind {
        /// The kind asked for.
        kind: String,
        /// Every kind there is, for the message.
        known: String,
    },
    /// `summarize`'s prompt file could not be read.
    #[error("prompt_file {}: {source}", path.display())]
    Prompt {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The kinds built in, in the order error messages list them.
const BUILT_IN: &[&str] = &["summarize", "extract", "exec"];

fn registered() -> &'static RwLock<HashMap<String, StrategyFactory>> {
    static REGISTERED: OnceLock<RwLock<HashMap<String, StrategyFactory>>> = OnceLock::new();
    REGISTERED.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Registers a strategy kind; call it before the config is loaded. Whether the kind may
/// end a chain is asked of a strategy it builds ([`Strategy::is_deterministic`]).
pub fn register_strategy(kind: &str, factory: StrategyFactory) {
    if let Ok(mut kinds) = registered().write() {
        kinds.insert(kind.to_owned(), factory);
    }
}

/// Builds the strategy `settings` describe (reading `summarize`'s prompt file).
pub fn build_strategy(settings: &StrategyConfig) -> Result<Arc<dyn Strategy>, BuildError> {
    Ok(match settings.kind.as_str() {
        "summarize" => {
            let prompt = match &settings.prompt_file {
                None => DEFAULT_PROMPT.to_owned(),
                Some(path) => {
                    std::fs::read_to_string(path).map_err(|source| BuildError::Prompt {
                        path: path.clone(),
                        source,
                    })?
                }
            };
            Arc::new(Summarize::new(prompt, settings.request_extra.clone()))
        }
        "extract" => Arc::new(Extract),
        "exec" => {
            let exec = Exec::new(
                settings.command.clone(),
                settings.env.clone(),
                settings.max_output_bytes,
            );
            Arc::new(match super::guard::guard() {
                Some(guard) => exec.guarded_by(guard.clone()),
                None => exec,
            })
        }
        other => match registered().read().ok().and_then(|k| k.get(other).copied()) {
            Some(factory) => factory(settings),
            None => {
                return Err(BuildError::UnknownKind {
                    kind: other.to_owned(),
                    known: known().join(", "),
                })
            }
        },
    })
}

/// True for a kind that may end a chain: a strategy of that kind, built from default
/// settings, says it never calls a model and always produces a handoff. False for an
/// unknown kind.
pub fn is_deterministic(kind: &str) -> bool {
    let probe = StrategyConfig {
        kind: kind.to_owned(),
        ..StrategyConfig::default()
    };
    build_strategy(&probe).is_ok_and(|strategy| strategy.is_deterministic())
}

/// True for a built-in or registered kind.
pub(crate) fn is_known(kind: &str) -> bool {
    BUILT_IN.contains(&kind) || registered().read().is_ok_and(|k| k.contains_key(kind))
}

/// Every known kind, built-in first, for error messages.
pub(crate) fn known() -> Vec<String> {
    let mut all: Vec<String> = BUILT_IN.iter().map(|k| (*k).to_owned()).collect();
    if let Ok(kinds) = registered().read() {
        let mut extra: Vec<String> = kinds.keys().cloned().collect();
        extra.sort();
        all.extend(extra);
    }
    all
}
