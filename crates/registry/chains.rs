//! The hook chains of a config, built once per config: the global one, each route's and
//! each key's, every hook named in several of them one instance.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use handoff_core::config::{Config, ConfigError, Failure, HookTurns};
use handoff_plugin_api::{Hook, Stage};

use super::hooks;

/// A config error at `key`.
fn invalid(key: String, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
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
    pub fn build(config: &Config) -> Result<Self, ConfigError> {
        let middleware = &config.middleware;
        let mut built: HashMap<&str, BuiltHook> = HashMap::new();
        for (name, settings) in &middleware.hooks {
            let key = format!("middleware.hooks.{name}");
            let Some(factory) = hooks::factory(&settings.kind) else {
                let known = hooks::known();
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
    pub fn select(&self, config: &Config, tenant: Option<&str>, model: &str) -> &[BuiltHook] {
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
