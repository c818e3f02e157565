//! `compaction.pin`: which messages after the leading system ones a request sends as
//! standing context (a files message, few-shot examples), pinned like `system`: kept
//! verbatim in every view, counted in the budget, never summarised, and logged as the
//! pinned set, so editing one in place continues the conversation.

use regex::Regex;

use crate::config::PinConfig;
use handoff_plugin_api::content_text;

use crate::dialect::{ChatRequest, Role};

/// The compiled rules.
#[derive(Debug, Default)]
pub struct Pins {
    first: usize,
    rules: Vec<(String, Regex, bool)>,
}

impl Pins {
    /// Compiles `config`'s rules; the error names the pattern.
    pub fn build(config: &PinConfig) -> Result<Self, regex::Error> {
        let rules = config
            .rules
            .iter()
            .map(|rule| {
                Ok((
                    rule.role.clone(),
                    Regex::new(&rule.pattern)?,
                    rule.with_reply,
                ))
            })
            .collect::<Result<_, regex::Error>>()?;
        Ok(Self {
            first: config.first,
            rules,
        })
    }

    /// Widens `request`'s pinned part: the leading system messages, then the longest run
    /// the rules cover. The last message is never pinned: it is the turn being asked.
    pub fn apply(&self, request: &mut ChatRequest) {
        if self.first == 0 && self.rules.is_empty() {
            return;
        }
        let messages = &request.messages;
        let last = messages.len().saturating_sub(1);
        let mut at = request.pinned_len();
        let mut counted = 0;
        while at < last {
            let message = &messages[at];
            if message.role.is_instruction() {
                at += 1;
                continue;
            }
            if counted < self.first {
                counted += 1;
                at += 1;
                continue;
            }
            let value = message.value();
            let role = value.get("role").and_then(|r| r.as_str()).unwrap_or("");
            let text = content_text(value);
            let Some((_, _, with_reply)) = self
                .rules
                .iter()
                .find(|(r, pattern, _)| r == role && pattern.is_match(&text))
            else {
                break;
            };
            at += 1;
            let reply = messages.get(at).filter(|m| m.role == Role::Assistant);
            if *with_reply && at < last && reply.is_some() {
                at += 1;
            }
        }
        request.pinned = Some(at);
    }
}
