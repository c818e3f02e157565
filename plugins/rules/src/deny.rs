//! The `deny` hook: a request is refused by the first rule that matches it, with that
//! rule's status and message, in the client's API shape.

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{Denial, Hook, HookDecision, HookError, HookRequest};

use crate::conditions::{Conditions, Text};
use crate::RuleSettings;

/// A `deny` hook: its rules, in order.
#[derive(Debug, Clone)]
pub struct Deny {
    rules: Vec<(Conditions, Denial)>,
}

impl Deny {
    /// The hook for `rules`; a rule with no condition or reason, a bad status or a
    /// content regex that does not compile is an error that names the rule.
    pub fn new(rules: &[RuleSettings]) -> Result<Self, String> {
        if rules.is_empty() {
            return Err("no rules: it would refuse nothing".into());
        }
        let mut built = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let conditions = Conditions::new(i, rule)?;
            let status = rule.status.unwrap_or(403);
            if !(400..=499).contains(&status) {
                return Err(format!("rules[{i}].status: {status} is not a 4xx status"));
            }
            if rule.message.trim().is_empty() {
                return Err(format!("rules[{i}].message: say why, for the client"));
            }
            if !rule.tags.is_empty() || rule.reroute.is_some() {
                return Err(format!(
                    "rules[{i}]: tags and reroute belong to a `tag` hook's rules"
                ));
            }
            let denial = Denial {
                status,
                message: rule.message.clone(),
            };
            built.push((conditions, denial));
        }
        Ok(Self { rules: built })
    }

    /// The denial of the first rule that matches `request`.
    fn judge(&self, request: &HookRequest) -> Option<Denial> {
        let mut text = Text::of(&request.messages, &request.outside);
        self.rules
            .iter()
            .find(|(conditions, _)| conditions.hold(request, &mut text))
            .map(|(_, denial)| denial.clone())
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
    use handoff_plugin_api::wildcard_match as glob;
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
            outside: Vec::new(),
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
            message: "m".into(),
            reroute: Some("y".into()),
            ..Default::default()
        })
        .contains("tag"));
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
