//! `compaction.pin`: which messages after the leading system ones a request sends as
//! standing context (a files message, few-shot examples), pinned like `system`: kept
//! verbatim in every view, counted in the budget, never summarised, and logged as the
//! pinned set, so editing one in place continues the conversation.

use std::borrow::Cow;
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};

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
    /// This build's key for the verdicts kept with each message's facts; none when
    /// there are more rules than a verdict has bits.
    memo: Option<NonZeroU32>,
}

/// The next build's memo key: distinct per build, so a reloaded rule set never reads
/// the verdicts of the one before.
static NEXT_MEMO: AtomicU32 = AtomicU32::new(1);

impl Pins {
    /// Compiles `config`'s rules; the error names the pattern.
    pub fn build(config: &PinConfig) -> Result<Self, regex::Error> {
        let rules: Vec<Rule> = config
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
        let memo = (rules.len() <= u32::BITS as usize)
            .then(|| NonZeroU32::new(NEXT_MEMO.fetch_add(1, Ordering::Relaxed)))
            .flatten();
        Ok(Self {
            first: config.first,
            rules,
            memo,
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

    /// The rule that covers `message`, if any; `through` selects which kind. Which
    /// rules match depends on the message's bytes alone, so it is worked out once per
    /// distinct message and kept with its facts: a conversation re-sends its files
    /// message in every request, and it is not parsed again each time.
    fn rule_for(&self, message: &Message, through: bool) -> Option<&Rule> {
        if !self.may_cover(message, through) {
            return None;
        }
        let Some(key) = self.memo else {
            return self
                .matches(message)
                .find(|(_, rule)| rule.through == through)
                .map(|(_, rule)| rule);
        };
        let matching = message.remembered(key, || {
            self.matches(message)
                .fold(0, |matching, (index, _)| matching | 1 << index)
        });
        self.rules
            .iter()
            .enumerate()
            .find(|(index, rule)| rule.through == through && matching & (1 << index) != 0)
            .map(|(_, rule)| rule)
    }

    /// The rules whose role and pattern match `message`, in order, with their places.
    fn matches<'p, 'm>(
        &'p self,
        message: &'m Message,
    ) -> impl Iterator<Item = (usize, &'p Rule)> + use<'p, 'm> {
        let value = message.value();
        let role = value.get("role").and_then(Value::as_str).unwrap_or("");
        let mut text = None;
        self.rules.iter().enumerate().filter(move |(_, rule)| {
            rule.role == role
                && rule
                    .pattern
                    .is_match(text.get_or_insert_with(|| head_text(value)))
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
            // The rule first: its verdict is kept per message, the marker scan is not.
            let rule = (message.role != Role::Assistant)
                .then(|| self.rule_for(message, false))
                .flatten()
                .filter(|_| text_only(message));
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

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::config::PinRule;
    use crate::dialect::DialectKind;

    fn pins(pattern: &str) -> Pins {
        let config = PinConfig {
            first: 0,
            rules: vec![PinRule {
                role: "user".into(),
                pattern: pattern.into(),
                with_reply: true,
                through: false,
            }],
        };
        Pins::build(&config).unwrap()
    }

    /// How many messages `pins` pins of a files message, its reply and a question.
    fn pinned_by(pins: &Pins) -> usize {
        let body = Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":"Here are the files: pins-memo.rs"},{"role":"assistant","content":"Ok."},{"role":"user","content":"Fix it."}]}"#,
        );
        let mut chat = DialectKind::OpenAiChat
            .get()
            .parse_body(&body.into())
            .unwrap();
        pins.apply(&mut chat);
        chat.pinned_len()
    }

    #[test]
    fn a_verdict_is_reused_by_its_rule_set_and_never_by_another() {
        let files = pins("^Here are the files");
        let other = pins("^Here are summaries");
        // Each body is parsed afresh, but its messages share their facts (and the
        // verdicts kept there) with every earlier body that had the same bytes.
        assert_eq!(pinned_by(&files), 3);
        assert_eq!(pinned_by(&files), 3);
        assert_eq!(pinned_by(&other), 1, "read the verdict of another rule set");
        assert_eq!(pinned_by(&files), 3, "kept the verdict of another rule set");
    }
}
