//! `compaction.pin`: which messages after the leading system ones a request sends as
//! standing context (a files message, few-shot examples), pinned like `system`: kept
//! verbatim in every view, counted in the budget, never summarised, and logged as the
//! pinned set, so editing one in place continues the conversation.

use std::borrow::Cow;

use regex::Regex;
use serde_json::Value;

use crate::config::PinConfig;
use crate::dialect::{ChatRequest, Message, Role};

/// How far into the list a `through` rule looks for the end of a preamble.
const THROUGH_WITHIN: usize = 16;

/// How far back from the turn being asked a content rule looks for standing context
/// that sits after the history (aider's files message follows its edit history).
const FLOAT_WITHIN: usize = 32;

/// How much of a message's text a pattern is matched against: preambles announce
/// themselves at the start, and a long tool result is not copied to find that out.
const MATCH_BYTES: usize = 4096;

/// One compiled rule.
#[derive(Debug)]
struct Rule {
    role: String,
    pattern: Regex,
    with_reply: bool,
    through: bool,
}

/// The compiled rules.
#[derive(Debug, Default)]
pub struct Pins {
    first: usize,
    rules: Vec<Rule>,
}

impl Pins {
    /// Compiles `config`'s rules; the error names the pattern.
    pub fn build(config: &PinConfig) -> Result<Self, regex::Error> {
        let rules = config
            .rules
            .iter()
            .map(|rule| {
                Ok(Rule {
                    role: rule.role.clone(),
                    pattern: Regex::new(&rule.pattern)?,
                    with_reply: rule.with_reply,
                    through: rule.through,
                })
            })
            .collect::<Result<_, regex::Error>>()?;
        Ok(Self {
            first: config.first,
            rules,
        })
    }

    /// False when no rule of the kind can cover `message` by its role alone, which is
    /// known without parsing it (most messages of a long body never are).
    fn may_cover(&self, message: &Message, through: bool) -> bool {
        // A known role is the value's `role`, or there is none (a Responses call item).
        let Some(name) = message.role.name() else {
            return true;
        };
        self.rules
            .iter()
            .any(|rule| rule.through == through && (rule.role == name || rule.role.is_empty()))
    }

    /// The rule that covers `message`, if any; `through` selects which kind.
    fn rule_for(&self, message: &Message, through: bool) -> Option<&Rule> {
        if !self.may_cover(message, through) {
            return None;
        }
        let value = message.value();
        let role = value.get("role").and_then(Value::as_str).unwrap_or("");
        let mut text = None;
        self.rules
            .iter()
            .filter(|rule| rule.through == through && rule.role == role)
            .find(|rule| {
                let text = text.get_or_insert_with(|| head_text(value));
                rule.pattern.is_match(text)
            })
    }

    /// Widens `request`'s pinned part: the leading system messages, through the end of
    /// a preamble a `through` rule marks, then the longest run the other rules cover,
    /// then what those rules cover further on (floated into the pinned part, their
    /// places kept in `request.floated`). The last message is never pinned: it is the
    /// turn being asked.
    pub fn apply(&self, request: &mut ChatRequest) {
        if self.first == 0 && self.rules.is_empty() {
            return;
        }
        let messages = &request.messages;
        let last = messages.len().saturating_sub(1);
        let mut at = request.pinned_len();
        // Past the pinned part with its reply, if `rule` says so.
        let past = |at: usize, rule: &Rule| {
            let reply = messages.get(at + 1).filter(|m| m.role == Role::Assistant);
            if rule.with_reply && at + 1 < last && reply.is_some() {
                at + 2
            } else {
                at + 1
            }
        };
        if self.rules.iter().any(|rule| rule.through) {
            let end = (at + THROUGH_WITHIN).min(last);
            if let Some((index, rule)) = (at..end)
                .rev()
                .find_map(|i| Some((i, self.rule_for(&messages[i], true)?)))
            {
                at = past(index, rule);
            }
        }
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
            let Some(rule) = self.rule_for(message, false) else {
                break;
            };
            at = past(at, rule);
        }
        let floated = self.floating(messages, at, last);
        request.pinned = Some(at + floated.len());
        if !floated.is_empty() {
            // Stable: the floated keep their order, and so does everything else.
            let mut moved = Vec::with_capacity(floated.len());
            let mut kept = Vec::with_capacity(request.messages.len() - floated.len());
            for (index, message) in std::mem::take(&mut request.messages)
                .into_iter()
                .enumerate()
            {
                if floated.binary_search(&index).is_ok() {
                    moved.push(message);
                } else {
                    kept.push(message);
                }
            }
            let rest = kept.split_off(at);
            kept.extend(moved);
            kept.extend(rest);
            request.messages = kept;
            request.floated = floated;
        }
    }

    /// The places, in order, of the messages after the pinned run (`at`) and before the
    /// turn being asked (`last`) that a content rule covers, replies included: plain
    /// text messages only, never part of a tool pair.
    fn floating(&self, messages: &[Message], at: usize, last: usize) -> Vec<usize> {
        let mut floated = Vec::new();
        let text_only = |m: &Message| {
            let raw = m.raw.get();
            !crate::dialect::any_marker(raw, crate::dialect::MarkerKind::Paired)
        };
        let mut index = last.saturating_sub(FLOAT_WITHIN).max(at);
        while index < last {
            let message = &messages[index];
            let rule = (message.role != Role::Assistant
                && self.may_cover(message, false)
                && text_only(message))
            .then(|| self.rule_for(message, false))
            .flatten();
            let Some(rule) = rule else {
                index += 1;
                continue;
            };
            floated.push(index);
            let reply = messages
                .get(index + 1)
                .filter(|m| m.role == Role::Assistant && text_only(m));
            if rule.with_reply && index + 1 < last && reply.is_some() {
                floated.push(index + 1);
                index += 1;
            }
            index += 1;
        }
        floated
    }
}

/// The start of `message`'s text, at most [`MATCH_BYTES`] of it, borrowed when the
/// content is a string.
fn head_text(message: &Value) -> Cow<'_, str> {
    fn cut(text: &str) -> &str {
        let mut end = text.len().min(MATCH_BYTES);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        &text[..end]
    }
    match message.get("content") {
        Some(Value::String(text)) => Cow::Borrowed(cut(text)),
        Some(Value::Array(parts)) => {
            let mut out = String::new();
            for text in parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
            {
                if !out.is_empty() {
                    out.push('\n');
                }
                out.push_str(cut(text));
                if out.len() >= MATCH_BYTES {
                    break;
                }
            }
            Cow::Owned(out)
        }
        _ => Cow::Borrowed(""),
    }
}
