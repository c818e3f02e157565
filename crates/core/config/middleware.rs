//! `[middleware]`: the hooks a tracked request goes through, at the stages each names
//! (`request`, `view`, `reply`). Each hook is a named instance of a kind (`redact`,
//! `deny`, `tag`, `exec`, or one a binary registers); the plugin registry
//! (`handoff-registry`) builds them when the config loads, so a reload swaps them with
//! the rest of the config and a mistake stops the load, naming its key.

use std::collections::BTreeMap;
use std::time::Duration;

use handoff_plugin_api::{RuleSettings, Stage};
use serde::{Deserialize, Serialize};

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
