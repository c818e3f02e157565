//! A provider's prompt cache and its bill, as the providers document them, so a test
//! can measure what a session costs and not only how long its requests are.
//!
//! - [`CacheStyle::Automatic`] (OpenAI): every request's prefix is cached once it is
//!   1,024 tokens long; a later request reads the longest cached prefix it shares, in
//!   steps of 128 tokens past the first 1,024. Cached input is billed at its own price;
//!   writing costs nothing extra.
//! - [`CacheStyle::Breakpoints`] (Anthropic): only a block marked `cache_control` writes
//!   the prefix through it (at least 1,024 tokens), billed at the write price. Each mark
//!   also reads: the provider looks for a cached prefix ending at that block or at one
//!   of the 19 blocks before it, and bills the longest one found at the read price.
//!
//! Entries live five minutes from their last use, on the runtime's clock (paused in
//! tests). Prefixes are compared block by block (a message, a content block, the tool
//! list), which is how both providers' caches can hit at all.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};
use tokio::time::Instant;

use crate::strict::{is_summary, text_tokens};
use crate::{Recorded, Reply};

/// How the provider caches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStyle {
    /// OpenAI: automatic prefix caching, usage in `prompt_tokens_details.cached_tokens`.
    Automatic,
    /// Anthropic: `cache_control` breakpoints, usage in `cache_read_input_tokens` and
    /// `cache_creation_input_tokens`.
    Breakpoints,
}

/// USD per million tokens.
#[derive(Debug, Clone, Copy)]
pub struct Prices {
    /// Fresh input.
    pub input: f64,
    /// Output.
    pub output: f64,
    /// Input read from the cache.
    pub cache_read: f64,
    /// Input written to the cache.
    pub cache_write: f64,
}

/// Claude Sonnet 4.5's list prices (five-minute cache writes).
pub const SONNET: Prices = Prices {
    input: 3.0,
    output: 15.0,
    cache_read: 0.3,
    cache_write: 3.75,
};

/// GPT-4o's list prices.
pub const GPT_4O: Prices = Prices {
    input: 2.5,
    output: 10.0,
    cache_read: 1.25,
    cache_write: 2.5,
};

/// The shortest prefix either provider caches.
const MIN_CACHED: u64 = 1024;

/// OpenAI's cache hits grow in steps of this many tokens past [`MIN_CACHED`].
const STEP: u64 = 128;

/// Blocks before a breakpoint that Anthropic looks back through, the mark's included.
const LOOKBACK: usize = 20;

/// How long an entry lives after its last use.
const TTL: Duration = Duration::from_secs(300);

/// One request's tokens by price class.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Billed {
    /// Fresh input.
    pub input: u64,
    /// Input read from the cache.
    pub cache_read: u64,
    /// Input written to the cache.
    pub cache_write: u64,
    /// Output.
    pub output: u64,
}

impl Billed {
    /// What it costs at `prices`.
    pub fn usd(&self, prices: &Prices) -> f64 {
        (self.input as f64 * prices.input
            + self.cache_read as f64 * prices.cache_read
            + self.cache_write as f64 * prices.cache_write
            + self.output as f64 * prices.output)
            / 1e6
    }

    /// All input tokens.
    pub fn prompt(&self) -> u64 {
        self.input + self.cache_read + self.cache_write
    }
}

/// One billed request.
#[derive(Debug, Clone, Copy)]
pub struct Bill {
    /// True for one of handoff's summary calls.
    pub summary: bool,
    /// Its tokens.
    pub billed: Billed,
}

/// Blocks with `cache_control` one Messages request may carry; more are refused.
const MAX_BREAKPOINTS: usize = 4;

/// A block of a request's prompt: its tokens, the hash of the prefix through it, and
/// whether it carries a `cache_control` mark.
struct Block {
    tokens: u64,
    prefix: u64,
    marked: bool,
}

/// The cache and the bills of one provider.
pub struct PromptCache {
    style: CacheStyle,
    prices: Prices,
    entries: Mutex<HashMap<u64, Instant>>,
    bills: Mutex<Vec<Bill>>,
    refused: Mutex<Vec<String>>,
}

impl PromptCache {
    /// An empty cache of `style`, billing at `prices`.
    pub fn new(style: CacheStyle, prices: Prices) -> Arc<Self> {
        Arc::new(Self {
            style,
            prices,
            entries: Mutex::default(),
            bills: Mutex::default(),
            refused: Mutex::default(),
        })
    }

    /// Bills `request`, answered by `reply`, and rewrites the reply's usage (a JSON
    /// reply's) to what the provider would report.
    pub fn bill(&self, request: &Recorded, reply: Reply) -> Reply {
        self.bill_counted(request, reply, None)
    }

    /// [`PromptCache::bill`] for a provider that counted the request at `counted`
    /// tokens: each block's share is scaled to that count, so the bill and the window
    /// agree.
    pub fn bill_counted(&self, request: &Recorded, reply: Reply, counted: Option<u64>) -> Reply {
        let body = request.json();
        let mut blocks = self.blocks(&body);
        let own: u64 = blocks.iter().map(|b| b.tokens).sum();
        if let Some(counted) = counted.filter(|_| own > 0) {
            for block in &mut blocks {
                block.tokens = block.tokens * counted / own;
            }
        }
        let total: u64 = blocks.iter().map(|b| b.tokens).sum();
        let marks = blocks.iter().filter(|b| b.marked).count();
        if self.style == CacheStyle::Breakpoints && marks > MAX_BREAKPOINTS {
            let message = format!(
                "A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {marks}."
            );
            if let Ok(mut refused) = self.refused.lock() {
                refused.push(message.clone());
            }
            return Reply::Json {
                status: http::StatusCode::BAD_REQUEST,
                body: json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}}),
            };
        }
        let (read, write) = match self.style {
            CacheStyle::Automatic => self.automatic(&blocks),
            CacheStyle::Breakpoints => self.breakpoints(&blocks),
        };
        match reply {
            Reply::Json { status, mut body } if status.is_success() => {
                let output = output_tokens(&body["usage"]);
                let billed = Billed {
                    input: total - read - write,
                    cache_read: read,
                    cache_write: write,
                    output,
                };
                body["usage"] = self.usage(&billed);
                self.note(&request.json(), billed);
                Reply::Json { status, body }
            }
            // Refused requests cost nothing; streams keep the mock's own usage.
            Reply::Json { status, body } => {
                if let Ok(mut refused) = self.refused.lock() {
                    refused.push(body.to_string());
                }
                Reply::Json { status, body }
            }
            other => {
                let billed = Billed {
                    input: total - read - write,
                    cache_read: read,
                    cache_write: write,
                    output: 0,
                };
                self.note(&request.json(), billed);
                other
            }
        }
    }

    fn note(&self, body: &Value, billed: Billed) {
        if let Ok(mut bills) = self.bills.lock() {
            bills.push(Bill {
                summary: is_summary(body),
                billed,
            });
        }
    }

    /// The error bodies of the requests refused so far (over the window, malformed).
    pub fn refused(&self) -> Vec<String> {
        self.refused.lock().map(|r| r.clone()).unwrap_or_default()
    }

    /// Every request billed so far.
    pub fn bills(&self) -> Vec<Bill> {
        self.bills.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// The session's cost so far, and the summary calls' share of it.
    pub fn cost(&self) -> (f64, f64) {
        let bills = self.bills();
        // Folded from +0.0: an empty f64 sum is -0.0.
        let add = |sum: f64, bill: &Bill| sum + bill.billed.usd(&self.prices);
        let all = bills.iter().fold(0.0, add);
        let summaries = bills.iter().filter(|b| b.summary).fold(0.0, add);
        (all, summaries)
    }

    /// The usage object this style reports.
    fn usage(&self, billed: &Billed) -> Value {
        match self.style {
            CacheStyle::Automatic => json!({
                "prompt_tokens": billed.prompt(), "completion_tokens": billed.output,
                "total_tokens": billed.prompt() + billed.output,
                "prompt_tokens_details": {"cached_tokens": billed.cache_read}}),
            CacheStyle::Breakpoints => json!({
                "input_tokens": billed.input, "output_tokens": billed.output,
                "cache_read_input_tokens": billed.cache_read,
                "cache_creation_input_tokens": billed.cache_write}),
        }
    }

    /// OpenAI: the longest cached prefix is read; every prefix of this request is
    /// cached from now on.
    fn automatic(&self, blocks: &[Block]) -> (u64, u64) {
        let now = Instant::now();
        let Ok(mut entries) = self.entries.lock() else {
            return (0, 0);
        };
        let mut through = 0;
        let mut read = 0;
        for block in blocks {
            through += block.tokens;
            if through < MIN_CACHED {
                continue;
            }
            if entries.get(&block.prefix).is_some_and(|until| *until > now) {
                read = MIN_CACHED + (through - MIN_CACHED) / STEP * STEP;
            }
            entries.insert(block.prefix, now + TTL);
        }
        (read, 0)
    }

    /// Anthropic: each mark reads the longest prefix cached at it or in the lookback
    /// before it, and writes the prefix through it.
    fn breakpoints(&self, blocks: &[Block]) -> (u64, u64) {
        let now = Instant::now();
        let Ok(mut entries) = self.entries.lock() else {
            return (0, 0);
        };
        let through: Vec<u64> = blocks
            .iter()
            .scan(0, |sum, b| {
                *sum += b.tokens;
                Some(*sum)
            })
            .collect();
        let marks: Vec<usize> = (0..blocks.len()).filter(|i| blocks[*i].marked).collect();
        let mut read = 0;
        for mark in &marks {
            let hit = (mark.saturating_sub(LOOKBACK - 1)..=*mark).rev().find(|j| {
                entries
                    .get(&blocks[*j].prefix)
                    .is_some_and(|until| *until > now)
            });
            if let Some(j) = hit {
                entries.insert(blocks[j].prefix, now + TTL);
                read = read.max(through[j]);
            }
        }
        let mut written = read;
        for mark in marks {
            if through[mark] >= MIN_CACHED {
                entries.insert(blocks[mark].prefix, now + TTL);
                written = written.max(through[mark]);
            }
        }
        (read, written - read)
    }

    /// The prompt as blocks, in the order the provider reads them.
    fn blocks(&self, body: &Value) -> Vec<Block> {
        let mut parts: Vec<(Value, bool)> = Vec::new();
        match self.style {
            CacheStyle::Automatic => {
                if !body["tools"].is_null() {
                    parts.push((body["tools"].clone(), false));
                }
                let list = body.get("messages").or(body.get("input"));
                for message in list.and_then(Value::as_array).into_iter().flatten() {
                    parts.push((message.clone(), false));
                }
            }
            CacheStyle::Breakpoints => {
                for tool in body["tools"].as_array().into_iter().flatten() {
                    parts.push(unmarked(tool));
                }
                match &body["system"] {
                    Value::Array(blocks) => parts.extend(blocks.iter().map(unmarked)),
                    Value::Null => {}
                    text => parts.push((text.clone(), false)),
                }
                for message in body["messages"].as_array().into_iter().flatten() {
                    match &message["content"] {
                        Value::Array(blocks) => {
                            for (at, block) in blocks.iter().enumerate() {
                                let (block, marked) = unmarked(block);
                                // The role opens the message's first block.
                                let role = if at == 0 {
                                    &message["role"]
                                } else {
                                    &Value::Null
                                };
                                parts.push((json!([role, block]), marked));
                            }
                        }
                        text => parts.push((json!([message["role"], text]), false)),
                    }
                }
            }
        }
        let mut prefix = 0u64;
        parts
            .into_iter()
            .map(|(part, marked)| {
                let text = part.to_string();
                let mut hasher = DefaultHasher::new();
                prefix.hash(&mut hasher);
                text.hash(&mut hasher);
                prefix = hasher.finish();
                Block {
                    tokens: text_tokens(&text),
                    prefix,
                    marked,
                }
            })
            .collect()
    }
}

/// `block` without its `cache_control` mark, and whether it had one: the mark says
/// where to cache, it is not part of what is cached.
fn unmarked(block: &Value) -> (Value, bool) {
    let mut block = block.clone();
    let marked = block
        .as_object_mut()
        .and_then(|fields| fields.remove("cache_control"))
        .is_some_and(|mark| !mark.is_null());
    (block, marked)
}

/// The output tokens a reply's usage reports, in either shape.
fn output_tokens(usage: &Value) -> u64 {
    usage["completion_tokens"]
        .as_u64()
        .or(usage["output_tokens"].as_u64())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recorded(body: Value) -> Recorded {
        Recorded {
            method: http::Method::POST,
            target: "/v1/messages".into(),
            headers: http::HeaderMap::new(),
            body: body.to_string().into(),
        }
    }

    fn usage(cache: &PromptCache, body: Value) -> Value {
        let reply = Reply::json(json!({"usage": {"output_tokens": 10}}));
        match cache.bill(&recorded(body), reply) {
            Reply::Json { body, .. } => body["usage"].clone(),
            _ => Value::Null,
        }
    }

    fn long(n: usize) -> String {
        format!("fact {n} ").repeat(800)
    }

    #[tokio::test(start_paused = true)]
    async fn breakpoints_write_then_read_within_the_lookback_and_expire() {
        let cache = PromptCache::new(CacheStyle::Breakpoints, SONNET);
        let marked = |text: String| json!({"type": "text", "text": text, "cache_control": {"type": "ephemeral"}});
        let first = json!({"system": [marked(long(0))], "messages": [{"role": "user", "content": [marked("q1".into())]}]});
        let one = usage(&cache, first);
        assert_eq!(one["cache_read_input_tokens"], 0);
        let written = one["cache_creation_input_tokens"].as_u64().unwrap();
        assert!(written > 1024, "{one}");
        // The next turn moves the mark to its last block and reads what the first wrote.
        let second = json!({"system": [marked(long(0))], "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q1"}]},
            {"role": "assistant", "content": [{"type": "text", "text": "a1"}]},
            {"role": "user", "content": [marked("q2".into())]}]});
        let two = usage(&cache, second.clone());
        assert_eq!(two["cache_read_input_tokens"].as_u64(), Some(written));
        // Unused for five minutes: gone.
        tokio::time::advance(TTL + Duration::from_secs(1)).await;
        let three = usage(&cache, second);
        assert_eq!(three["cache_read_input_tokens"], 0, "{three}");
        // Without marks nothing is cached.
        let plain = json!({"system": long(1), "messages": [{"role": "user", "content": "q"}]});
        usage(&cache, plain.clone());
        assert_eq!(usage(&cache, plain)["cache_read_input_tokens"], 0);
    }

    #[tokio::test(start_paused = true)]
    async fn automatic_caching_reads_the_shared_prefix_in_steps() {
        let cache = PromptCache::new(CacheStyle::Automatic, GPT_4O);
        let first = json!({"messages": [{"role": "system", "content": long(0)}, {"role": "user", "content": "q1"}]});
        assert_eq!(
            usage(&cache, first)["prompt_tokens_details"]["cached_tokens"],
            0
        );
        let second = json!({"messages": [{"role": "system", "content": long(0)}, {"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}]});
        let two = usage(&cache, second);
        let cached = two["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap();
        assert!(
            cached >= 1024 && (cached - 1024).is_multiple_of(128),
            "{two}"
        );
        assert!(cached <= two["prompt_tokens"].as_u64().unwrap());
        // Another system prompt shares nothing.
        let other = json!({"messages": [{"role": "system", "content": long(1)}, {"role": "user", "content": "q1"}]});
        assert_eq!(
            usage(&cache, other)["prompt_tokens_details"]["cached_tokens"],
            0
        );
        let bills = cache.bills();
        assert_eq!(bills.len(), 3);
        assert!(cache.cost().0 > 0.0);
    }
}
