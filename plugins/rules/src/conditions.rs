//! The conditions of a rule, and the request text they read, read once per request.

use std::sync::Arc;

use handoff_plugin_api::{content_text, each_string, wildcard_match as glob, HookRequest};
use regex::Regex;
use serde_json::Value;

use crate::RuleSettings;

/// A rule's conditions, compiled.
#[derive(Debug, Clone)]
pub(crate) struct Conditions {
    model: Option<String>,
    tenant: Option<String>,
    path: Option<String>,
    content: Option<Regex>,
    larger_than: Option<usize>,
}

impl Conditions {
    /// The conditions of `rule` (the `i`th); a content regex that does not compile, or
    /// no condition at all, is an error naming the rule.
    pub(crate) fn new(i: usize, rule: &RuleSettings) -> Result<Self, String> {
        let content = rule
            .content
            .as_deref()
            .map(Regex::new)
            .transpose()
            .map_err(|err| format!("rules[{i}].content: {err}"))?;
        let conditions = Self {
            model: rule.model.clone(),
            tenant: rule.tenant.clone(),
            path: rule.path.clone(),
            content,
            larger_than: rule.larger_than,
        };
        let any = conditions.model.is_some()
            || conditions.tenant.is_some()
            || conditions.path.is_some()
            || conditions.content.is_some()
            || conditions.larger_than.is_some();
        if !any {
            return Err(format!(
                "rules[{i}]: no condition; it would match every request"
            ));
        }
        Ok(conditions)
    }

    /// True when every condition holds for `request`, whose `messages` are the text
    /// the content and size conditions read.
    pub(crate) fn hold(&self, request: &HookRequest, text: &mut Text<'_>) -> bool {
        if self
            .model
            .as_deref()
            .is_some_and(|p| !glob(p, &request.model))
            || self.tenant.as_deref().is_some_and(|t| t != request.tenant)
            || self
                .path
                .as_deref()
                .is_some_and(|p| !glob(p, &request.path))
        {
            return false;
        }
        if self
            .larger_than
            .is_some_and(|most| text.get().iter().map(|t| t.chars().count()).sum::<usize>() <= most)
        {
            return false;
        }
        self.content
            .as_ref()
            .is_none_or(|regex| text.get().iter().any(|t| regex.is_match(t)))
    }
}

/// The text of some messages and of what lies outside them, read when a condition
/// first needs it.
pub(crate) struct Text<'a> {
    messages: &'a [Arc<Value>],
    outside: &'a [Arc<Value>],
    read: Option<Vec<String>>,
}

impl<'a> Text<'a> {
    /// The text of `messages` (what a model reads in each) and of `outside` (every
    /// string of each member), not read yet.
    pub(crate) fn of(messages: &'a [Arc<Value>], outside: &'a [Arc<Value>]) -> Self {
        Self {
            messages,
            outside,
            read: None,
        }
    }

    fn get(&mut self) -> &[String] {
        let (messages, outside) = (self.messages, self.outside);
        self.read.get_or_insert_with(|| {
            let mut texts: Vec<String> = messages.iter().map(|m| content_text(m)).collect();
            for member in outside {
                let mut text = String::new();
                each_string(member, &mut |s| {
                    if !text.is_empty() {
                        text.push('\n');
                    }
                    text.push_str(s);
                });
                texts.push(text);
            }
            texts
        })
    }
}
