//! The rule hooks: `deny` refuses a request that a rule matches; `tag` adds metadata
//! to the request's record and metrics and may send it to another model. A rule names
//! any of a model pattern, a tenant, a path pattern, a content regex and a size; it
//! matches when every condition it names holds.

#![forbid(unsafe_code)]

mod conditions;
mod deny;
mod tag;

use std::collections::BTreeMap;

pub use deny::Deny;
pub use tag::Tag;

/// One rule, as configured (`[[middleware.hooks.<name>.rules]]`): every condition given
/// must hold.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSettings {
    /// A model pattern (`*` matches any run of characters).
    pub model: Option<String>,
    /// A tenant name (a proxy key's `name`).
    pub tenant: Option<String>,
    /// A path pattern (`*` as for models).
    pub path: Option<String>,
    /// A regex that some message's text matches.
    pub content: Option<String>,
    /// More characters of message text than this.
    pub larger_than: Option<usize>,
    /// deny: the status answered, 400 to 499; 403 when unset.
    pub status: Option<u16>,
    /// deny: what the client reads.
    #[serde(default)]
    pub message: String,
    /// tag: the tags a match adds.
    #[serde(default)]
    pub tags: BTreeMap<String, String>,
    /// tag: the model a match sends the request to.
    pub reroute: Option<String>,
}
