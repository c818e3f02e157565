//! The `redact` hook: finds secrets and personal data in a request's messages, for the
//! host to replace by markers before the request is tracked, compacted or sent.
//!
//! Named detectors cover what users ask for first: `api_keys` (the common providers'
//! key shapes), `emails`, and `cards` (13 to 19 digits, spaces or dashes between them,
//! that pass the Luhn check, so order numbers and timestamps stay). Any other shape is a
//! regex with a label. Every string of every message is searched, tool arguments and
//! results included.

#![forbid(unsafe_code)]

use std::collections::BTreeSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::Arc;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{Hook, HookDecision, HookError, HookRequest, Redaction};
use regex::{Regex, RegexSet};

/// The named detectors, for error messages and docs.
pub const DETECTORS: &[&str] = &["api_keys", "emails", "cards"];

/// Key shapes of the common providers: OpenAI and Anthropic (`sk-…`), AWS access keys,
/// GitHub tokens, Google API keys, Slack tokens, Stripe keys, Hugging Face tokens.
const API_KEYS: &str = concat!(
    r"(?-u:\b)sk-[A-Za-z0-9_-]{20,}",
    r"|(?-u:\b)(?:AKIA|ASIA)[0-9A-Z]{16}(?-u:\b)",
    r"|(?-u:\b)gh[pousr]_[A-Za-z0-9]{36,}(?-u:\b)|(?-u:\b)github_pat_[A-Za-z0-9_]{22,}",
    r"|(?-u:\b)AIza[0-9A-Za-z_-]{35}(?-u:\b)",
    r"|(?-u:\b)xox[abposr]-[A-Za-z0-9-]{10,}",
    r"|(?-u:\b)[rs]k_(?:live|test)_[A-Za-z0-9]{16,}(?-u:\b)",
    r"|(?-u:\b)hf_[A-Za-z0-9]{30,}(?-u:\b)",
);

/// The `emails` detector's regex.
pub const EMAILS: &str =
    r"(?-u:\b)[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?-u:\b)";

/// Candidates only: [`luhn`] decides.
const CARDS: &str = r"(?-u:\b)[0-9](?:[ -]?[0-9]){12,18}(?-u:\b)";

/// One thing to look for.
#[derive(Debug, Clone)]
struct Detector {
    label: String,
    pattern: Regex,
    /// Cards: a match counts only if its digits pass the Luhn check.
    luhn: bool,
}

/// A `redact` hook: its detectors, in order.
pub struct Redact {
    detectors: Vec<Detector>,
    /// Every detector's pattern, for one pass over a text that most often holds none.
    any: RegexSet,
    /// What a long text was found to hold, by the keyed hash of its tenant and itself:
    /// a long conversation re-sends the same texts every turn, and each is searched
    /// once per tenant (no tenant can time whether another sent a text).
    seen: quick_cache::sync::Cache<u64, Arc<[Redaction]>>,
    keys: RandomState,
}

impl std::fmt::Debug for Redact {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redact")
            .field("detectors", &self.detectors)
            .finish()
    }
}

/// Texts shorter than this are searched every time: cheaper than hashing and caching.
const CACHED_FROM: usize = 256;

/// Long texts whose findings are kept.
const CACHED_TEXTS: usize = 16 * 1024;

impl Redact {
    /// The hook for `named` detectors (of [`DETECTORS`]) and `patterns`, each a label
    /// and a regex; an unknown name or a regex that does not compile is an error that
    /// names it.
    pub fn new(named: &[String], patterns: &[(String, String)]) -> Result<Self, String> {
        let mut detectors = Vec::new();
        for name in named {
            let (label, source, luhn) = match name.as_str() {
                "api_keys" => ("api_key", API_KEYS, false),
                "emails" => ("email", EMAILS, false),
                "cards" => ("card", CARDS, true),
                other => {
                    return Err(format!(
                        "unknown detector {other:?}; known: {}",
                        DETECTORS.join(", ")
                    ))
                }
            };
            let pattern = Regex::new(source).map_err(|err| format!("{name}: {err}"))?;
            detectors.push(Detector {
                label: label.to_owned(),
                pattern,
                luhn,
            });
        }
        for (label, source) in patterns {
            if label.is_empty()
                || !label
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            {
                return Err(format!(
                    "pattern label {label:?}: letters, digits and _ only (it names the marker)"
                ));
            }
            let pattern = Regex::new(source).map_err(|err| format!("pattern {label:?}: {err}"))?;
            detectors.push(Detector {
                label: label.clone(),
                pattern,
                luhn: false,
            });
        }
        if detectors.is_empty() {
            return Err("no detectors and no patterns: it would redact nothing".into());
        }
        let any = RegexSet::new(detectors.iter().map(|d| d.pattern.as_str()))
            .map_err(|err| err.to_string())?;
        Ok(Self {
            detectors,
            any,
            seen: quick_cache::sync::Cache::new(CACHED_TEXTS),
            keys: RandomState::new(),
        })
    }

    /// What the detectors find in `text` of `tenant`'s, each distinct text once, in
    /// order found.
    pub fn find(
        &self,
        tenant: &str,
        text: &str,
        found: &mut Vec<Redaction>,
        seen: &mut BTreeSet<String>,
    ) {
        if text.len() < CACHED_FROM {
            return self.search(text, found, seen);
        }
        // Keyed (a random key per hook): no client can make two texts share an entry.
        let key = self.keys.hash_one((tenant, text));
        let hits = match self.seen.get(&key) {
            Some(hits) => hits,
            None => {
                let mut hits = Vec::new();
                self.search(text, &mut hits, &mut BTreeSet::new());
                let hits: Arc<[Redaction]> = hits.into();
                self.seen.insert(key, Arc::clone(&hits));
                hits
            }
        };
        for hit in hits.iter() {
            if seen.insert(hit.find.clone()) {
                found.push(hit.clone());
            }
        }
    }

    fn search(&self, text: &str, found: &mut Vec<Redaction>, seen: &mut BTreeSet<String>) {
        let matched = self.any.matches(text);
        if !matched.matched_any() {
            return;
        }
        for detector in matched.iter().filter_map(|i| self.detectors.get(i)) {
            for hit in detector.pattern.find_iter(text) {
                let hit = hit.as_str();
                if detector.luhn && !luhn(hit) {
                    continue;
                }
                if seen.insert(hit.to_owned()) {
                    found.push(Redaction {
                        find: hit.to_owned(),
                        label: detector.label.clone(),
                    });
                }
            }
        }
    }
}

impl Hook for Redact {
    fn kind(&self) -> &'static str {
        "redact"
    }

    fn forget_texts(&self) {
        self.seen.clear();
    }

    fn on_request<'a>(
        &'a self,
        request: &'a HookRequest,
    ) -> BoxFuture<'a, Result<HookDecision, HookError>> {
        let mut found = Vec::new();
        let mut seen = BTreeSet::new();
        request.each_string(&mut |text| self.find(&request.tenant, text, &mut found, &mut seen));
        let decision = HookDecision {
            redact: found,
            ..HookDecision::default()
        };
        async move { Ok(decision) }.boxed()
    }
}

/// True when the digits of `candidate` pass the Luhn check.
fn luhn(candidate: &str) -> bool {
    let digits: Vec<u32> = candidate.chars().filter_map(|c| c.to_digit(10)).collect();
    if !(13..=19).contains(&digits.len()) {
        return false;
    }
    let sum: u32 = digits
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &d)| match (i % 2 == 1, d * 2) {
            (true, doubled) if doubled > 9 => doubled - 9,
            (true, doubled) => doubled,
            (false, _) => d,
        })
        .sum();
    sum.is_multiple_of(10)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    fn found(redact: &Redact, text: &str) -> Vec<(String, String)> {
        let mut found = Vec::new();
        redact.find("t", text, &mut found, &mut BTreeSet::new());
        found.into_iter().map(|r| (r.label, r.find)).collect()
    }

    fn all() -> Redact {
        let named: Vec<String> = DETECTORS.iter().map(|d| (*d).to_owned()).collect();
        Redact::new(&named, &[]).unwrap()
    }

    #[test]
    fn each_provider_s_key_shape_is_found_and_ordinary_words_are_not() {
        let keys = [
            "sk-proj-abcdefghijklmnopqrstuvwx123",
            "sk-ant-api03-abcdefghijklmnopqrstuvwxyz",
            "AKIAIOSFODNN7EXAMPLE",
            "ghp_abcdefghijklmnopqrstuvwxyz0123456789",
            "AIzaSyA-abcdefghijklmnopqrstuvwxyz12345",
            "xoxb-1234567890-abcdef",
            "sk_live_abcdefghijklmnop1234",
            "hf_abcdefghijklmnopqrstuvwxyz012345",
        ];
        for key in keys {
            assert_eq!(
                found(&all(), &format!("use {key} here")),
                vec![("api_key".to_owned(), key.to_owned())],
                "{key}"
            );
        }
        assert!(found(&all(), "the task-runner and skeleton keys, ask me").is_empty());
    }

    #[test]
    fn cards_must_pass_luhn_and_emails_are_found() {
        let text = "card 4111 1111 1111 1111, order 4111 1111 1111 1112, mail ana.b@example.co.uk";
        assert_eq!(
            found(&all(), text),
            vec![
                ("email".to_owned(), "ana.b@example.co.uk".to_owned()),
                ("card".to_owned(), "4111 1111 1111 1111".to_owned()),
            ]
        );
    }

    #[tokio::test]
    async fn every_string_of_every_message_is_searched_and_each_text_named_once() {
        let request = HookRequest {
            dialect: "openai".into(),
            path: "/v1/chat/completions".into(),
            model: "m".into(),
            tenant: "t".into(),
            messages: vec![
                Arc::new(
                    json!({"role": "user", "content": [{"type": "text", "text": "me: a@b.io"}]}),
                ),
                Arc::new(
                    json!({"role": "assistant", "tool_calls": [{"id": "c", "type": "function",
                    "function": {"name": "mail", "arguments": "{\"to\":\"a@b.io\",\"cc\":\"c@d.io\"}"}}]}),
                ),
            ],
            outside: vec![Arc::new(
                json!({"field": "prediction", "value": {"type": "content", "content": "cc e@f.io"}}),
            )],
            tags: Default::default(),
        };
        let decision = all().on_request(&request).await.unwrap();
        let finds: Vec<&str> = decision.redact.iter().map(|r| r.find.as_str()).collect();
        assert_eq!(finds, ["a@b.io", "c@d.io", "e@f.io"]);
    }

    #[test]
    fn a_long_text_is_searched_once_and_found_the_same_every_time() {
        let redact = all();
        let text = format!(
            "{} mail ana@example.org {}",
            "x ".repeat(200),
            "y ".repeat(200)
        );
        let first = found(&redact, &text);
        assert_eq!(
            first,
            vec![("email".to_owned(), "ana@example.org".to_owned())]
        );
        assert_eq!(redact.seen.len(), 1, "kept");
        assert_eq!(found(&redact, &text), first, "from the cache");
        let other = text.replace("ana@", "bob@");
        assert_eq!(
            found(&redact, &other)[0].1,
            "bob@example.org",
            "another text, searched"
        );
    }

    #[test]
    fn a_bad_pattern_or_label_or_detector_is_named() {
        let bad = |named: &[&str], patterns: &[(&str, &str)]| {
            let named: Vec<String> = named.iter().map(|n| (*n).to_owned()).collect();
            let patterns: Vec<(String, String)> = patterns
                .iter()
                .map(|(l, p)| ((*l).to_owned(), (*p).to_owned()))
                .collect();
            Redact::new(&named, &patterns).unwrap_err()
        };
        assert!(bad(&["phones"], &[]).contains("phones"));
        assert!(bad(&[], &[("ticket", "(")]).contains("ticket"));
        assert!(bad(&[], &[("a b", "x")]).contains("a b"));
        assert!(bad(&[], &[]).contains("nothing"));
    }
}
