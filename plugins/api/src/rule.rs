//! The settings of one rule of the `deny` and `tag` hooks: a shape the config reads and
//! the rules plugin interprets, so the settings layer needs no plugin to parse it.

use std::collections::BTreeMap;

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
