//! handoff's plugin registry: every strategy and hook kind this build has, by name (the
//! built-in ones, and those a binary registers before it starts handoff), the factories
//! that build them, and the check of a config's kind names against them.
//!
//! It sits above the plugins and the settings layer, and below the engine: the config
//! keeps kind names as strings; the engine builds its chains, and the request path its
//! hook chains, from here.

#![forbid(unsafe_code)]

mod chains;
mod check;
mod guard;
mod hooks;
mod strategies;

pub use chains::{BuiltHook, HookChains};
pub use check::check;
pub use guard::guard_exec_with;
pub use hooks::{register_hook, HookFactory};
pub use strategies::{
    build_strategy, is_deterministic, register_strategy, BuildError, StrategyFactory,
    DEFAULT_PROMPT,
};
