//! The `tag` hook: every rule that matches a request adds its tags, which go into the
//! request's record and (for the keys `middleware.metric_tags` names) its metrics; the
//! first matching rule that names a `reroute` model sends the request there. At the
//! reply stage its rules read the reply's text instead of the request's.

use std::collections::BTreeMap;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{Hook, HookDecision, HookError, HookReply, HookRequest};

use crate::conditions::{Conditions, Text};
use crate::RuleSettings;

/// One rule of a `tag` hook.
#[derive(Debug, Clone)]
struct TagRule {
    conditions: Conditions,
    tags: BTreeMap<String, String>,
    reroute: Option<String>,
}

/// A `tag` hook: its rules, in order.
#[derive(Debug, Clone)]
pub struct Tag {
    rules: Vec<TagRule>,
}

impl Tag {
    /// The hook for `rules`; a rule that adds nothing, or that a `deny` hook would
    /// read (a status or message), is an error naming it.
    pub fn new(rules: &[RuleSettings]) -> Result<Self, String> {
        if rules.is_empty() {
            return Err("no rules: it would tag nothing".into());
        }
        let mut built = Vec::new();
        for (i, rule) in rules.iter().enumerate() {
            let conditions = Conditions::new(i, rule)?;
            if rule.tags.is_empty() && rule.reroute.is_none() {
                return Err(format!(
                    "rules[{i}]: neither tags nor reroute; it would do nothing"
                ));
            }
            if rule.status.is_some() || !rule.message.is_empty() {
                return Err(format!(
                    "rules[{i}]: status and message belong to a `deny` hook's rules"
                ));
            }
            if let Some((key, _)) = rule.tags.iter().find(|(key, _)| key.is_empty()) {
                return Err(format!("rules[{i}].tags: {key:?} is not a tag name"));
            }
            built.push(TagRule {
                conditions,
                tags: rule.tags.clone(),
                reroute: rule.reroute.clone().filter(|model| !model.is_empty()),
            });
        }
        Ok(Self { rules: built })
    }

    /// The tags of every rule that matches `request` (a later rule's winning), and the
    /// first reroute; `text` is what the content conditions read.
    fn decide(&self, request: &HookRequest, mut text: Text<'_>) -> HookDecision {
        let mut decision = HookDecision::default();
        for rule in &self.rules {
            if rule.conditions.hold(request, &mut text) {
                decision
                    .tags
                    .extend(rule.tags.iter().map(|(k, v)| (k.clone(), v.clone())));
                if decision.model.is_none() {
                    decision.model.clone_from(&rule.reroute);
                }
            }
        }
        decision
    }
}

impl Hook for Tag {
    fn kind(&self) -> &'static str {
        "tag"
    }

    fn on_request<'a>(
        &'a self,
        request: &'a HookRequest,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        let decision = self.decide(request, Text::of(&request.messages, &request.outside));
        async move { Ok(decision) }.boxed()
    }

    fn on_reply<'a>(
        &'a self,
        reply: &'a HookReply,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        let mut decision = self.decide(&reply.request, Text::of(&reply.reply, &[]));
        // A reply is answered already: there is nothing to send elsewhere.
        decision.model = None;
        async move { Ok(decision) }.boxed()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn request(model: &str, text: &str) -> HookRequest {
        HookRequest {
            dialect: "anthropic".into(),
            path: "/v1/messages".into(),
            model: model.into(),
            tenant: "t".into(),
            messages: vec![Arc::new(json!({"role": "user", "content": text}))],
            outside: Vec::new(),
            tags: BTreeMap::new(),
        }
    }

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn hook() -> Tag {
        Tag::new(&[
            RuleSettings {
                model: Some("claude-*".into()),
                tags: tags(&[("family", "claude"), ("tier", "big")]),
                ..Default::default()
            },
            RuleSettings {
                content: Some("(?i)translate".into()),
                tags: tags(&[("tier", "small"), ("task", "translation")]),
                reroute: Some("cheap-1".into()),
                ..Default::default()
            },
            RuleSettings {
                content: Some("(?i)french".into()),
                reroute: Some("never-reached".into()),
                ..Default::default()
            },
        ])
        .unwrap()
    }

    #[tokio::test]
    async fn every_matching_rule_tags_a_later_one_winning_and_the_first_reroute_counts() {
        let hook = hook();
        let decided = hook
            .on_request(&request("claude-x", "Translate this to French"))
            .await
            .unwrap();
        assert_eq!(
            decided.tags,
            tags(&[
                ("family", "claude"),
                ("tier", "small"),
                ("task", "translation")
            ])
        );
        assert_eq!(decided.model.as_deref(), Some("cheap-1"));
        let plain = hook.on_request(&request("gpt-4o", "hello")).await.unwrap();
        assert_eq!(plain, HookDecision::default());
    }

    #[tokio::test]
    async fn at_the_reply_its_rules_read_the_reply_and_never_reroute() {
        let hook = hook();
        let reply = HookReply {
            request: request("gpt-4o", "hello"),
            reply: vec![Arc::new(
                json!({"role": "assistant", "content": "I can translate that"}),
            )],
        };
        let decided = hook.on_reply(&reply).await.unwrap();
        assert_eq!(
            decided.tags,
            tags(&[("tier", "small"), ("task", "translation")])
        );
        assert_eq!(decided.model, None);
    }

    #[test]
    fn a_rule_that_adds_nothing_or_speaks_to_the_client_is_refused() {
        let err = |rule: RuleSettings| Tag::new(&[rule]).unwrap_err();
        assert!(err(RuleSettings {
            model: Some("x".into()),
            ..Default::default()
        })
        .contains("nothing"));
        assert!(err(RuleSettings {
            model: Some("x".into()),
            tags: tags(&[("a", "b")]),
            message: "no".into(),
            ..Default::default()
        })
        .contains("deny"));
    }
}
