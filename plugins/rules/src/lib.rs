//! The rule hooks: `deny` refuses a request that a rule matches; `tag` adds metadata
//! to the request's record and metrics and may send it to another model. A rule names
//! any of a model pattern, a tenant, a path pattern, a content regex and a size; it
//! matches when every condition it names holds.

#![forbid(unsafe_code)]

mod conditions;
mod deny;
mod tag;

pub use deny::Deny;
pub use tag::Tag;

pub use handoff_plugin_api::RuleSettings;
