//! `[middleware]`: the hooks a tracked request goes through, at the stages each names
//! (`request`, `view`, `reply`). Each hook is a named instance of a kind (`redact`,
//! `deny`, `tag`, `exec`, or one a binary registers), built here when the config loads,
//! so a reload swaps them with the rest of the config and a mistake stops the load,
//! naming its key.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use handoff_hook_redact::Redact;
use handoff_hook_rules::{Deny, RuleSettings, Tag};
use handoff_plugin_api::{Hook, Stage};
use handoff_strategy_exec::ExecHook;
use serde::{Deserialize, Serialize};

use super::{ConfigError, HookTurns};

/// `[middleware]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MiddlewareConfig {
    /// The hooks every tracked request goes through, in order.
    pub chain: Vec<String>,
    /// The named hooks.
    pub hooks: BTreeMap<String, HookConfig>,
    /// The tag names whose values become a label of `handoff_hook_tags_total`; the
    /// others go only to the record, so a hook cannot grow the metrics without bound.
    pub metric_tags: Vec<String>,
}

/// What a hook's failure (an error, or no answer within its `timeout`) does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Failure {
    /// The request is refused (503): what the hook guards is never skipped.
    #[default]
    Closed,
    /// The request goes on as if the hook were not configured.
    Open,
}

/// `[middleware.hooks.<name>]`: a named hook.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookConfig {
    /// `redact`, `deny`, `tag`, `exec`, or a registered kind.
    pub kind: String,
    /// When it is called: `request` (the default), `view`, `reply`.
    #[serde(default = "default_stages")]
    pub stages: Vec<Stage>,
    /// The markers its request-stage redactions put in are turned back into their
    /// texts in the reply the client gets (the log keeps the reply as sent).
    #[serde(default)]
    pub reversible: bool,
    /// What a failure does: `closed` (the default) or `open`.
    #[serde(default)]
    pub failure: Failure,
    /// Time allowed for one call, its wait for a turn excluded.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Calls of one tenant that may wait for a hook serving one call at a time (exec);
    /// one more fails as `failure` says.
    #[serde(default = "default_queue")]
    pub queue: usize,
    /// The longest a call waits for its turn at such a hook before it fails as
    /// `failure` says.
    #[serde(default = "default_timeout", with = "humantime_serde")]
    pub queue_wait: Duration,
    /// redact: named detectors (`api_keys`, `emails`, `cards`).
    #[serde(default)]
    pub detectors: Vec<String>,
    /// redact: more shapes, each a marker label and a regex.
    #[serde(default)]
    pub patterns: BTreeMap<String, String>,
    /// deny, tag: the rules (deny: the first that matches refuses; tag: each that
    /// matches adds its tags).
    #[serde(default)]
    pub rules: Vec<RuleSettings>,
    /// exec: the program and its arguments; no shell is involved.
    #[serde(default)]
    pub command: Vec<String>,
    /// exec: environment variables passed through (all others are cleared).
    #[serde(default)]
    pub env: Vec<String>,
    /// exec: the longest answer line accepted.
    #[serde(default = "super::default_exec_output")]
    pub max_output_bytes: usize,
}

fn default_timeout() -> Duration {
    Duration::from_secs(1)
}

fn default_queue() -> usize {
    16
}

fn default_stages() -> Vec<Stage> {
    vec![Stage::Request]
}

fn invalid(key: String, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// Builds a hook from its settings, or says what is wrong with them.
pub type HookFactory = fn(&HookConfig) -> Result<Arc<dyn Hook>, String>;

/// The binary exec hooks start under, if the host has one (see
/// `handoff_strategy_exec::guard_main`).
static EXEC_GUARD: OnceLock<std::path::PathBuf> = OnceLock::new();

/// Starts exec hooks under `binary`, which runs the guard when asked.
pub fn guard_exec_hooks_with(binary: std::path::PathBuf) {
    let _ = EXEC_GUARD.set(binary);
}

fn exec(settings: &HookConfig) -> Result<Arc<dyn Hook>, String> {
    if settings.command.is_empty() {
        return Err("command: an exec hook needs a program to run".into());
    }
    let hook = ExecHook::new(
        settings.command.clone(),
        settings.env.clone(),
        settings.max_output_bytes,
    );
    Ok(Arc::new(match EXEC_GUARD.get() {
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

fn factory(kind: &str) -> Option<HookFactory> {
    BUILT_IN
        .iter()
        .find(|(name, _)| *name == kind)
        .map(|(_, factory)| *factory)
        .or_else(|| extra().read().ok()?.get(kind).copied())
}

/// One hook of the chain, built.
#[derive(Clone)]
pub struct BuiltHook {
    /// Its name in `[middleware.hooks]`.
    pub name: String,
    /// The hook.
    pub hook: Arc<dyn Hook>,
    /// What its failure does.
    pub failure: Failure,
    /// Time allowed for one call, its wait for a turn excluded.
    pub timeout: Duration,
    /// Where its calls wait, for a hook that serves only so many at once.
    pub turns: Option<Arc<HookTurns>>,
    /// When it is called.
    pub stages: Arc<[Stage]>,
    /// Whether its request-stage markers are turned back in replies.
    pub reversible: bool,
}

impl BuiltHook {
    /// True when it is called at `stage`.
    pub fn at(&self, stage: Stage) -> bool {
        self.stages.contains(&stage)
    }
}

impl std::fmt::Debug for BuiltHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BuiltHook")
            .field("name", &self.name)
            .field("kind", &self.hook.kind())
            .field("failure", &self.failure)
            .field("stages", &self.stages)
            .finish()
    }
}

/// Every chain of hooks a request may get, built once per config: the global one, each
/// route's and each key's. A hook named in several chains is one instance.
#[derive(Debug, Clone, Default)]
pub struct HookChains {
    global: Arc<[BuiltHook]>,
    /// Index-aligned with `config.routes`.
    by_route: Vec<Option<Arc<[BuiltHook]>>>,
    /// By key name (its tenant).
    by_key: HashMap<String, Arc<[BuiltHook]>>,
}

impl HookChains {
    /// Builds every hook `config` declares and every chain that names them; an unknown
    /// name or kind, or settings a kind refuses, is an error naming the key.
    pub fn build(config: &super::Config) -> Result<Self, ConfigError> {
        let middleware = &config.middleware;
        let mut built: HashMap<&str, BuiltHook> = HashMap::new();
        for (name, settings) in &middleware.hooks {
            let key = format!("middleware.hooks.{name}");
            let Some(factory) = factory(&settings.kind) else {
                let mut known: Vec<String> =
                    BUILT_IN.iter().map(|(k, _)| (*k).to_owned()).collect();
                if let Ok(kinds) = extra().read() {
                    known.extend(kinds.keys().cloned());
                }
                return Err(invalid(
                    format!("{key}.kind"),
                    format!(
                        "unknown kind {:?}; known: {}",
                        settings.kind,
                        known.join(", ")
                    ),
                ));
            };
            if settings.timeout.is_zero() {
                return Err(invalid(format!("{key}.timeout"), "must be more than zero"));
            }
            if settings.stages.is_empty() {
                return Err(invalid(
                    format!("{key}.stages"),
                    "names no stage; it would never be called",
                ));
            }
            if settings.queue_wait.is_zero() {
                return Err(invalid(
                    format!("{key}.queue_wait"),
                    "must be more than zero",
                ));
            }
            let hook = factory(settings).map_err(|reason| invalid(key, reason))?;
            let turns = hook.concurrency().map(|capacity| {
                Arc::new(HookTurns::new(
                    capacity,
                    settings.queue,
                    settings.queue_wait,
                ))
            });
            built.insert(
                name,
                BuiltHook {
                    name: name.clone(),
                    hook,
                    failure: settings.failure,
                    timeout: settings.timeout,
                    turns,
                    stages: settings.stages.iter().copied().collect(),
                    reversible: settings.reversible,
                },
            );
        }
        let chain = |names: &[String], key: &str| -> Result<Arc<[BuiltHook]>, ConfigError> {
            names
                .iter()
                .enumerate()
                .map(|(i, name)| {
                    built.get(name.as_str()).cloned().ok_or_else(|| {
                        invalid(
                            format!("{key}[{i}]"),
                            format!(
                                "unknown hook {name:?}; declare it under [middleware.hooks.{name}]"
                            ),
                        )
                    })
                })
                .collect()
        };
        let global = chain(&middleware.chain, "middleware.chain")?;
        let by_route = config
            .routes
            .iter()
            .enumerate()
            .map(|(i, route)| {
                route
                    .hooks
                    .as_deref()
                    .map(|names| chain(names, &format!("routes[{i}].hooks")))
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        let mut by_key = HashMap::new();
        for (i, key) in config.auth.keys.iter().enumerate() {
            if let Some(names) = &key.hooks {
                by_key.insert(
                    key.name.clone(),
                    chain(names, &format!("auth.keys[{i}].hooks"))?,
                );
            }
        }
        Ok(Self {
            global,
            by_route,
            by_key,
        })
    }

    /// The chain of a request of `model` by the key of `tenant` (if keys are
    /// configured): the key's, else the first route matching the model that names
    /// hooks, else `middleware.chain`.
    pub fn select(
        &self,
        config: &super::Config,
        tenant: Option<&str>,
        model: &str,
    ) -> &[BuiltHook] {
        if let Some(chain) = tenant.and_then(|tenant| self.by_key.get(tenant)) {
            return chain;
        }
        config
            .routes
            .iter()
            .zip(&self.by_route)
            .find_map(|(route, chain)| chain.as_ref().filter(|_| route.matches(model)))
            .unwrap_or(&self.global)
    }

    /// Has every hook drop what it keeps of the texts it was shown.
    pub fn forget_texts(&self) {
        let routes = self.by_route.iter().flatten();
        for chain in std::iter::once(&self.global)
            .chain(self.by_key.values())
            .chain(routes)
        {
            chain.iter().for_each(|hook| hook.hook.forget_texts());
        }
    }

    /// True when no request gets a hook.
    pub fn is_empty(&self) -> bool {
        self.global.is_empty()
            && self.by_key.values().all(|chain| chain.is_empty())
            && self.by_route.iter().flatten().all(|chain| chain.is_empty())
    }
}
