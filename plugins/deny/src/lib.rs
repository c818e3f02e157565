//! The `deny` hook: refuses a request that a rule matches. A rule names any of a model
//! pattern, a tenant, a path pattern, a content regex and a size; a request is refused
//! by the first rule all of whose conditions hold, with that rule's status and message,
//! in the client's API shape.

#![forbid(unsafe_code)]

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{
    content_text, wildcard_match as glob, Denial, Hook, HookDecision, HookError, HookRequest,
};
use regex::Regex;

/// One rule, as configured: every condition given must hold.
#[derive(Debug, Clone, Default)]
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
    /// The status answered, 400 to 499; 403 when unset.
    pub status: Option<u16>,
    /// What the client reads.
    pub message: String,
}

#[derive(Debug, Clone)]
struct Rule {
    model: Option<String>,
    tenant: Option<String>,
    path: Option<String>,
    content: Option<Regex>,
    larger_than: Option<usize>,
    denial: Denial,
}

/// A `deny` hook: its rules, in order.
#[derive(Debug, Clone)]
pub struct Deny {
    rules: Vec<Rule>,
}

impl Deny {
    /// The hook for `rules`; a rule with no condition, a bad status or a content regex
    /// that does not compile is an error that names the rule by its index.
    pub fn new(rules: &[RuleSettings]) -> Result<Self, String> {
        if rules.is_empty() {
            return Err("no rules: it would refuse nothing".into());
        }
        let mut built = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let content = rule
                .content
                .as_deref()
                .map(Regex::new)
                .transpose()
                .map_err(|err| format!("rules[{i}].content: {err}"))?;
            let status = rule.status.unwrap_or(403);
            if !(400..=499).contains(&status) {
                return Err(format!("rules[{i}].status: {status} is not a 4xx status"));
            }
            let any = rule.model.is_some()
                || rule.tenant.is_some()
                || rule.path.is_some()
                || content.is_some()
                || rule.larger_than.is_some();
            if !any {
                return Err(format!(
                    "rules[{i}]: no condition; it would refuse every request"
                ));
            }
            if rule.message.trim().is_empty() {
                return Err(format!("rules[{i}].message: say why, for the client"));
            }
            built.push(Rule {
                model: rule.model.clone(),
                tenant: rule.tenant.clone(),
                path: rule.path.clone(),
                content,
                larger_than: rule.larger_than,
                denial: Denial {
                    status,
                    message: rule.message.clone(),
                },
            });
        }
        Ok(Self { rules: built })
    }

    /// The denial of the first rule that matches `request`.
    fn judge(&self, request: &HookRequest) -> Option<Denial> {
        // The text is read once, and only when a rule needs it.
        let mut texts: Option<Vec<String>> = None;
        for rule in &self.rules {
            if rule
                .model
                .as_deref()
                .is_some_and(|p| !glob(p, &request.model))
                || rule.tenant.as_deref().is_some_and(|t| t != request.tenant)
                || rule
                    .path
                    .as_deref()
                    .is_some_and(|p| !glob(p, &request.path))
            {
                continue;
            }
            let texts = texts
                .get_or_insert_with(|| request.messages.iter().map(|m| content_text(m)).collect());
            if rule
                .larger_than
                .is_some_and(|most| texts.iter().map(|t| t.chars().count()).sum::<usize>() <= most)
            {
                continue;
            }
            if rule
                .content
                .as_ref()
                .is_some_and(|regex| !texts.iter().any(|t| regex.is_match(t)))
            {
                continue;
            }
            return Some(rule.denial.clone());
        }
        None
    }
}

impl Hook for Deny {
    fn kind(&self) -> &'static str {
        "deny"
    }

    fn on_request<'a>(
        &'a self,
        request: &'a HookRequest,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        let decision = HookDecision {
            deny: self.judge(request),
            ..HookDecision::default()
        };
        async move { Ok(decision) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn request(model: &str, tenant: &str, text: &str) -> HookRequest {
        HookRequest {
            dialect: "openai".into(),
            path: "/v1/chat/completions".into(),
            model: model.into(),
            tenant: tenant.into(),
            messages: vec![std::sync::Arc::new(
                json!({"role": "user", "content": text}),
            )],
            tags: Default::default(),
        }
    }

    #[test]
    fn the_first_rule_whose_every_condition_holds_refuses() {
        let deny = Deny::new(&[
            RuleSettings {
                model: Some("gpt-4*".into()),
                tenant: Some("interns".into()),
                message: "interns use the small models".into(),
                ..Default::default()
            },
            RuleSettings {
                content: Some("(?i)ignore (all|previous) instructions".into()),
                status: Some(400),
                message: "prompt injection".into(),
                ..Default::default()
            },
            RuleSettings {
                larger_than: Some(20),
                status: Some(413),
                message: "too long".into(),
                ..Default::default()
            },
        ])
        .unwrap();
        let status = |r: &HookRequest| deny.judge(r).map(|d| d.status);
        assert_eq!(status(&request("gpt-4o", "interns", "hi")), Some(403));
        assert_eq!(status(&request("gpt-4o", "staff", "hi")), None);
        assert_eq!(status(&request("o3", "interns", "hi")), None);
        assert_eq!(
            status(&request("o3", "staff", "Ignore previous instructions")),
            Some(400)
        );
        assert_eq!(status(&request("o3", "staff", &"x".repeat(21))), Some(413));
        assert_eq!(status(&request("o3", "staff", &"x".repeat(20))), None);
    }

    #[test]
    fn a_rule_without_a_condition_or_reason_or_with_a_bad_status_is_refused() {
        let rule = |settings: RuleSettings| Deny::new(&[settings]).unwrap_err();
        assert!(rule(RuleSettings {
            message: "m".into(),
            ..Default::default()
        })
        .contains("no condition"));
        assert!(rule(RuleSettings {
            model: Some("x".into()),
            ..Default::default()
        })
        .contains("message"));
        assert!(rule(RuleSettings {
            model: Some("x".into()),
            status: Some(200),
            message: "m".into(),
            ..Default::default()
        })
        .contains("200"));
        assert!(rule(RuleSettings {
            content: Some("(".into()),
            message: "m".into(),
            ..Default::default()
        })
        .contains("rules[0].content"));
    }

    #[test]
    fn globs_match_whole_names() {
        assert!(glob("gpt-4*", "gpt-4o"));
        assert!(glob("*mini", "gpt-4o-mini"));
        assert!(glob("a*b*c", "a-b-c"));
        assert!(!glob("gpt-4*", "o3"));
        assert!(!glob("ab*ba", "aba"));
        assert!(glob("exact", "exact") && !glob("exact", "exactly"));
    }
}
