//! Hook kinds: `redact`, `deny`, `tag` and `exec` built in, plus the kinds a binary
//! registers (a Rust hook crate; see `docs/plugins.md`).

use std::collections::HashMap;
use std::sync::{Arc, OnceLock, RwLock};

use handoff_core::config::HookConfig;
use handoff_hook_redact::Redact;
use handoff_hook_rules::{Deny, Tag};
use handoff_plugin_api::Hook;
use handoff_strategy_exec::ExecHook;

/// Builds a hook from its settings, or says what is wrong with them.
pub type HookFactory = fn(&HookConfig) -> Result<Arc<dyn Hook>, String>;

fn exec(settings: &HookConfig) -> Result<Arc<dyn Hook>, String> {
    if settings.command.is_empty() {
        return Err("command: an exec hook needs a program to run".into());
    }
    let hook = ExecHook::new(
        settings.command.clone(),
        settings.env.clone(),
        settings.max_output_bytes,
    );
    Ok(Arc::new(match super::guard::guard() {
        Some(guard) => hook.guarded_by(guard.clone()),
        None => hook,
    }))
}

fn redact(settings: &HookConfig) -> Result<Arc<dyn Hook>, String> {
    let patterns: Vec<(String, String)> = settings
        .patterns
        .iter()
        .map(|(label, regex)| (label.clone(), regex.clone()))
        .collect();
    Ok(Arc::new(Redact::new(&settings.detectors, &patterns)?))
}

fn deny(settings: &HookConfig) -> Result<Arc<dyn Hook>, String> {
    Ok(Arc::new(Deny::new(&settings.rules)?))
}

fn tag(settings: &HookConfig) -> Result<Arc<dyn Hook>, String> {
    Ok(Arc::new(Tag::new(&settings.rules)?))
}

const BUILT_IN: &[(&str, HookFactory)] = &[
    ("redact", redact),
    ("deny", deny),
    ("tag", tag),
    ("exec", exec),
];

fn extra() -> &'static RwLock<HashMap<String, HookFactory>> {
    static EXTRA: OnceLock<RwLock<HashMap<String, HookFactory>>> = OnceLock::new();
    EXTRA.get_or_init(|| RwLock::new(HashMap::new()))
}

/// Registers a hook kind (a Rust hook crate); call it before the config is loaded.
pub fn register_hook(kind: &str, factory: HookFactory) {
    if let Ok(mut kinds) = extra().write() {
        kinds.insert(kind.to_owned(), factory);
    }
}

/// The factory of a built-in or registered kind.
pub(crate) fn factory(kind: &str) -> Option<HookFactory> {
    BUILT_IN
        .iter()
        .find(|(name, _)| *name == kind)
        .map(|(_, factory)| *factory)
        .or_else(|| extra().read().ok()?.get(kind).copied())
}

/// Every known kind, built-in first, for error messages.
pub(crate) fn known() -> Vec<String> {
    let mut all: Vec<String> = BUILT_IN.iter().map(|(k, _)| (*k).to_owned()).collect();
    if let Ok(kinds) = extra().read() {
        let mut registered: Vec<String> = kinds.keys().cloned().collect();
        registered.sort();
        all.extend(registered);
    }
    all
}
