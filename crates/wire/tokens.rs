//! Token counting: tiktoken's `o200k_base` / `cl100k_base`, or bytes/4 for models with
//! no public tokenizer. Message counts are cached by message digest, so a message is
//! tokenised once however often it is resent.

use std::sync::{Arc, OnceLock};

use handoff_plugin_api::TokenCounter;
use serde_json::Value;
use tiktoken_rs::CoreBPE;

use crate::base::digest::{message_digest, Digest, MessageDigest};
use crate::config::Tokenizer;

/// Tokens every message costs beyond its text (role, separators), per OpenAI's guide.
pub const MESSAGE_OVERHEAD: u64 = 4;

/// Tokens that prime the reply, counted once per request.
pub const REPLY_PRIMING: u64 = 3;

/// Counted messages kept in the cache.
const CACHE_ENTRIES: u64 = 1_000_000;

/// What the model reads of a message, as text to count.
pub(crate) type MessageText = fn(&Value) -> String;

/// The tokenizers and the per-message count cache.
pub struct Tokens {
    text: MessageText,
    o200k: OnceLock<Option<CoreBPE>>,
    cl100k: OnceLock<Option<CoreBPE>>,
    /// Counts by digest, tokenizer and [`cache_scope`](crate::cache_scope): per tenant,
    /// so no request finds (or times) another tenant's messages.
    cache: moka::sync::Cache<(MessageDigest, u8, u64), u32>,
}

/// A count's key in the cache, in the running work's scope.
fn key(digest: &MessageDigest, tokenizer: Tokenizer) -> (MessageDigest, u8, u64) {
    (*digest, tokenizer as u8, crate::cache_scope::current())
}

impl Tokens {
    /// Empty cache; tokenizers load on first use. `text` reads what the model reads
    /// of a message (the wire formats' business: `dialect::text::message_text`).
    pub fn new(text: MessageText) -> Self {
        Self::with_capacity(text, CACHE_ENTRIES)
    }

    /// The same, keeping at most `entries` counts (`store.count_cache_entries`).
    pub fn with_capacity(text: MessageText, entries: u64) -> Self {
        Self {
            text,
            o200k: OnceLock::new(),
            cl100k: OnceLock::new(),
            cache: moka::sync::Cache::new(entries),
        }
    }

    /// True when counting with `tokenizer` will not first load its tables (hundreds of
    /// ms and tens of MB, once per process).
    pub fn is_loaded(&self, tokenizer: Tokenizer) -> bool {
        match tokenizer {
            Tokenizer::O200k => self.o200k.get().is_some(),
            Tokenizer::Cl100k => self.cl100k.get().is_some(),
            Tokenizer::Estimate => true,
        }
    }

    fn bpe(&self, tokenizer: Tokenizer) -> Option<&CoreBPE> {
        let slot = match tokenizer {
            Tokenizer::O200k => &self.o200k,
            Tokenizer::Cl100k => &self.cl100k,
            Tokenizer::Estimate => return None,
        };
        slot.get_or_init(|| {
            let loaded = match tokenizer {
                Tokenizer::Cl100k => tiktoken_rs::cl100k_base(),
                _ => tiktoken_rs::o200k_base(),
            };
            loaded
                .map_err(|err| tracing::error!(error = %err, "tokenizer unavailable; estimating"))
                .ok()
        })
        .as_ref()
    }

    /// Loads `tokenizer`'s tables now, if it has any (hundreds of ms, once).
    pub fn load(&self, tokenizer: Tokenizer) {
        self.bpe(tokenizer);
    }

    /// Tokens of `text`.
    pub fn count_text(&self, tokenizer: Tokenizer, text: &str) -> u64 {
        match self.bpe(tokenizer) {
            Some(bpe) => bpe.encode_ordinary(text).len() as u64,
            None => (text.len() as u64).div_ceil(4),
        }
    }

    /// The cached count of the message with `digest`, overhead included, if any.
    pub fn cached(&self, tokenizer: Tokenizer, digest: &MessageDigest) -> Option<u64> {
        self.cache.get(&key(digest, tokenizer)).map(u64::from)
    }

    /// Tokens of a message with known digest, overhead included; cached.
    pub fn count_message(
        &self,
        tokenizer: Tokenizer,
        digest: &MessageDigest,
        message: &Value,
    ) -> u64 {
        let key = key(digest, tokenizer);
        if let Some(count) = self.cache.get(&key) {
            return u64::from(count);
        }
        let count = self.count_text(tokenizer, &(self.text)(message)) + MESSAGE_OVERHEAD;
        self.cache
            .insert(key, u32::try_from(count).unwrap_or(u32::MAX));
        count
    }

    /// Like [`Tokens::count_message`], reading the message only on a cache miss: a
    /// message seen before is counted without being parsed.
    pub(crate) fn count_lazy<'v>(
        &self,
        tokenizer: Tokenizer,
        digest: &MessageDigest,
        message: impl FnOnce() -> &'v Value,
    ) -> u64 {
        self.cached(tokenizer, digest)
            .unwrap_or_else(|| self.count_message(tokenizer, digest, message()))
    }

    /// Tokens of raw UTF-8 text known by `digest` (e.g. the `tools` schemas); cached,
    /// so only a miss reads the bytes as text.
    pub fn count_raw(&self, tokenizer: Tokenizer, digest: &Digest, text: &[u8]) -> u64 {
        let key = key(digest, tokenizer);
        if let Some(count) = self.cache.get(&key) {
            return u64::from(count);
        }
        let count = self.count_text(tokenizer, &String::from_utf8_lossy(text));
        self.cache
            .insert(key, u32::try_from(count).unwrap_or(u32::MAX));
        count
    }

    /// A [`TokenCounter`] for strategies, bound to one tokenizer.
    pub fn counter(self: &Arc<Self>, tokenizer: Tokenizer) -> Arc<dyn TokenCounter> {
        Arc::new(BoundCounter {
            tokens: Arc::clone(self),
            tokenizer,
        })
    }
}

struct BoundCounter {
    tokens: Arc<Tokens>,
    tokenizer: Tokenizer,
}

impl TokenCounter for BoundCounter {
    fn count_text(&self, text: &str) -> u64 {
        self.tokens.count_text(self.tokenizer, text)
    }

    fn count_message(&self, message: &Value) -> u64 {
        self.tokens
            .count_message(self.tokenizer, &message_digest(message), message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn content(message: &Value) -> String {
        message["content"].as_str().unwrap_or("").to_owned()
    }

    #[test]
    fn counts_are_plausible_and_cached() {
        let tokens = Tokens::new(content);
        let message = json!({"role": "user", "content": "hello world, this is a test"});
        let digest = message_digest(&message);
        let first = tokens.count_message(Tokenizer::O200k, &digest, &message);
        assert!((8..=14).contains(&first), "{first}");
        // Cached by digest: the same digest reads the first count back.
        let other = json!({"content": "a much longer text than the first one, counted again"});
        assert_eq!(
            tokens.count_message(Tokenizer::O200k, &digest, &other),
            first
        );
        assert_eq!(tokens.count_text(Tokenizer::Estimate, "abcdefgh"), 2);
    }

    #[tokio::test]
    async fn a_count_is_found_only_in_the_scope_of_the_tenant_that_made_it() {
        use crate::cache_scope::{forget, of, within};
        let tokens = Tokens::new(content);
        let message = json!({"role": "user", "content": "a text one tenant sent"});
        let digest = message_digest(&message);
        let (a, b) = (of("tokens-test-a"), of("tokens-test-b"));
        within(a, async {
            tokens.count_message(Tokenizer::Estimate, &digest, &message);
        })
        .await;
        let cached = |scope| within(scope, async { tokens.cached(Tokenizer::Estimate, &digest) });
        assert!(cached(a).await.is_some());
        assert_eq!(cached(b).await, None, "another tenant never finds it");
        forget("tokens-test-a");
        assert_eq!(
            cached(of("tokens-test-a")).await,
            None,
            "nor does its own after an erasure"
        );
    }
}
