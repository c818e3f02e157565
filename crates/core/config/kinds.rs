//! Strategy kinds: the built-ins, plus kinds that a binary registers before it starts
//! handoff (a Rust strategy crate; see `docs/plugins.md`).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use handoff_plugin_api::Strategy;
use handoff_strategy_exec::Exec;
use handoff_strategy_extract::Extract;
use handoff_strategy_summarize::Summarize;

use crate::config::StrategyConfig;

/// Builds a strategy from its `[compaction.strategies.<name>]` settings.
pub(crate) type Factory = fn(&StrategyConfig) -> Arc<dyn Strategy>;

/// Kinds built into handoff, each with a factory of a strategy that answers what the
/// kind is (the registry builds the real ones, with their prompts read).
const BUILT_IN: &[(&str, Factory)] = &[
    ("summarize", summarize_probe),
    ("extract", extract),
    ("exec", exec),
];

/// Built-in kinds a chain may name without declaring them (exec needs a command).
pub(crate) const USABLE_BY_NAME: &[&str] = &["summarize", "extract"];

fn summarize_probe(_: &StrategyConfig) -> Arc<dyn Strategy> {
    Arc::new(Summarize::new(String::new(), Default::default()))
}

fn extract(_: &StrategyConfig) -> Arc<dyn Strategy> {
    Arc::new(Extract)
}

fn exec(settings: &StrategyConfig) -> Arc<dyn Strategy> {
    Arc::new(Exec::new(
        settings.command.clone(),
        settings.env.clone(),
        settings.max_output_bytes,
    ))
}

fn extra() -> &'static RwLock<HashMap<String, Factory>> {
    static EXTRA: OnceLock<RwLock<HashMap<String, Factory>>> = OnceLock::new();
    EXTRA.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Registers a strategy kind; call it before the config is loaded. Whether the kind
/// may end a chain is asked of a strategy it builds
/// ([`Strategy::is_deterministic`]).
pub fn register(kind: &str, factory: Factory) {
    if let Ok(mut kinds) = extra().write() {
        kinds.insert(kind.to_owned(), factory);
    }
}

/// True for a built-in or registered kind.
pub(crate) fn is_known(kind: &str) -> bool {
    any_factory(kind).is_some()
}

/// True for a kind that may end a chain: a strategy of that kind, built from default
/// settings, says it never calls a model and always produces a handoff.
pub fn is_deterministic(kind: &str) -> bool {
    any_factory(kind).is_some_and(|factory| {
        let probe = StrategyConfig {
            kind: kind.to_owned(),
            ..StrategyConfig::default()
        };
        factory(&probe).is_deterministic()
    })
}

/// The factory of a registered (not built-in) kind.
pub fn factory(kind: &str) -> Option<Factory> {
    extra().read().ok()?.get(kind).copied()
}

/// The factory of any kind, built-in or registered.
fn any_factory(kind: &str) -> Option<Factory> {
    BUILT_IN
        .iter()
        .find(|(name, _)| *name == kind)
        .map(|(_, factory)| *factory)
        .or_else(|| factory(kind))
}

/// Every known kind, for error messages.
pub fn known() -> Vec<String> {
    let mut all: Vec<String> = BUILT_IN.iter().map(|(k, _)| (*k).to_owned()).collect();
    if let Ok(kinds) = extra().read() {
        all.extend(kinds.keys().cloned());
    }
    all
}
