//! Strategy kinds: the built-ins, plus kinds that a binary registers before it starts
//! handoff (a Rust strategy crate; see `docs/plugins.md`).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use handoff_plugin_api::Strategy;

use crate::config::StrategyConfig;

/// Builds a strategy from its `[compaction.strategies.<name>]` settings.
pub type Factory = fn(&StrategyConfig) -> Arc<dyn Strategy>;

/// Kinds built into handoff.
pub const BUILT_IN: &[&str] = &["summarize", "extract", "exec"];

#[derive(Clone, Copy)]
struct Kind {
    deterministic: bool,
    factory: Factory,
}

fn extra() -> &'static RwLock<HashMap<String, Kind>> {
    static EXTRA: OnceLock<RwLock<HashMap<String, Kind>>> = OnceLock::new();
    EXTRA.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Registers a strategy kind; call it before the config is loaded.
///
/// A deterministic kind must never fail to produce a handoff: only such a kind may end
/// a chain.
pub fn register(kind: &str, deterministic: bool, factory: Factory) {
    if let Ok(mut kinds) = extra().write() {
        kinds.insert(
            kind.to_owned(),
            Kind {
                deterministic,
                factory,
            },
        );
    }
}

/// True for a built-in or registered kind.
pub fn is_known(kind: &str) -> bool {
    BUILT_IN.contains(&kind) || extra().read().is_ok_and(|k| k.contains_key(kind))
}

/// True for a kind that may end a chain.
pub fn is_deterministic(kind: &str) -> bool {
    kind == "extract"
        || extra()
            .read()
            .is_ok_and(|k| k.get(kind).is_some_and(|k| k.deterministic))
}

/// The factory of a registered (not built-in) kind.
pub fn factory(kind: &str) -> Option<Factory> {
    extra().read().ok()?.get(kind).map(|k| k.factory)
}

/// Every known kind, for error messages.
pub fn known() -> Vec<String> {
    let mut all: Vec<String> = BUILT_IN.iter().map(|k| (*k).to_owned()).collect();
    if let Ok(kinds) = extra().read() {
        all.extend(kinds.keys().cloned());
    }
    all
}
