//! `first_and_last`: a deterministic strategy that keeps the conversation's opening
//! request and its newest user messages, the two things a resumed agent most needs.
//!
//! It depends only on `handoff-plugin-api` for the strategy itself; `main.rs` registers
//! it as a kind and runs handoff's command line.

#![forbid(unsafe_code)]

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{cap_head_tail, AttemptError, Strategy, StrategyInput, Summary};
use serde_json::Value;

/// Newest user messages kept besides the first one.
const NEWEST: usize = 3;

/// The strategy.
#[derive(Debug, Default)]
pub struct FirstAndLast;

fn user_texts(input: &StrategyInput) -> Vec<String> {
    input
        .history
        .iter()
        .flat_map(|unit| unit.messages.iter())
        .filter(|m| m["role"] == "user")
        .filter_map(|m| m.get("content").and_then(Value::as_str).map(str::to_owned))
        .collect()
}

impl Strategy for FirstAndLast {
    fn kind(&self) -> &'static str {
        "first_and_last"
    }

    fn is_deterministic(&self) -> bool {
        true
    }

    fn summarize<'a>(
        &'a self,
        input: &'a StrategyInput,
    ) -> BoxFuture<'a, Result<Summary, AttemptError>> {
        async move {
            let users = user_texts(input);
            // About 3 characters a token, split between the parts.
            let share = usize::try_from(input.budgets.handoff_tokens)
                .unwrap_or(usize::MAX)
                .saturating_mul(3)
                / (NEWEST + 2);
            let mut text = String::from("## Handoff (first and last)\n");
            if let Some(previous) = &input.previous_handoff {
                text.push_str(&format!(
                    "### Earlier handoff\n{}\n",
                    cap_head_tail(previous, share / 2, share / 2)
                ));
            }
            if let Some(first) = users.first() {
                text.push_str(&format!(
                    "### Opening request\n{}\n",
                    cap_head_tail(first, share / 2, share / 2)
                ));
            }
            let newest: Vec<&String> = users.iter().skip(1).rev().take(NEWEST).collect();
            if !newest.is_empty() {
                text.push_str("### Latest requests (newest last)\n");
                for message in newest.into_iter().rev() {
                    text.push_str(&format!(
                        "- {}\n",
                        cap_head_tail(message, share / 2, share / 2)
                    ));
                }
            }
            Ok(Summary {
                text,
                usage: None,
                calls: None,
            })
        }
        .boxed()
    }
}

/// Registers the `first_and_last` kind with handoff.
pub fn register() {
    handoff::plugins::register_strategy("first_and_last", |_settings| {
        std::sync::Arc::new(FirstAndLast)
    });
}

#[cfg(test)]
mod tests {
    use handoff_plugin_api::Unit;
    use serde_json::json;

    use super::*;

    #[test]
    fn keeps_the_opening_and_the_newest_requests() {
        let history = (0..6)
            .map(|n| Unit {
                messages: vec![json!({"role": "user", "content": format!("request {n}")})],
            })
            .collect();
        let input = {
            let mut input = handoff_plugin_api::testing::input(history, 8000, 800);
            input.budgets.input_budget = 7000;
            input
        };
        let summary = futures_util::FutureExt::now_or_never(FirstAndLast.summarize(&input))
            .unwrap()
            .unwrap();
        assert!(summary.text.contains("request 0"));
        assert!(summary.text.contains("request 3") && summary.text.contains("request 5"));
        assert!(!summary.text.contains("request 2"));
    }

    #[test]
    fn once_registered_the_kind_loads_and_may_end_a_chain() {
        crate::register();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("handoff.toml");
        std::fs::write(&file, "[compaction]\nchain = [\"fl\"]\n[compaction.strategies.fl]\nkind = \"first_and_last\"\n").unwrap();
        let config = handoff::config::load(&handoff::config::Overrides {
            config_file: Some(file),
            ..Default::default()
        })
        .unwrap();
        let registry = handoff::strategies::Registry::build(&config).unwrap();
        let chain = registry.select(&config, "gpt-4o", None);
        assert_eq!(chain.len(), 1);
        assert_eq!(chain[0].strategy.kind(), "first_and_last");
    }
}
