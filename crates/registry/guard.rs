//! The binary exec plugins (strategies and hooks alike) start under, if the host has
//! one: a plugin then dies with the process ([`handoff_strategy_exec::guard_main`]).

use std::path::PathBuf;
use std::sync::OnceLock;

static EXEC_GUARD: OnceLock<PathBuf> = OnceLock::new();

/// Starts exec plugins under `binary`, handoff's own, which runs the guard when asked.
/// Only the real binary can: a test harness that embeds the library would run its tests
/// instead.
pub fn guard_exec_with(binary: PathBuf) {
    let _ = EXEC_GUARD.set(binary);
}

/// The guard binary, once set.
pub(crate) fn guard() -> Option<&'static PathBuf> {
    EXEC_GUARD.get()
}
