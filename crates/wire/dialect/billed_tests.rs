//! Each API's usage read into price classes, from the shapes its reference documents.

#![allow(clippy::unwrap_used)]

use serde_json::json;

use super::DialectKind;
use crate::config::Billed;

fn billed(dialect: DialectKind, usage: serde_json::Value) -> Billed {
    dialect.get().billed(&usage).unwrap()
}

#[test]
fn each_api_s_usage_is_read_into_fresh_cached_written_and_output_tokens() {
    // OpenAI chat: cached tokens are part of prompt_tokens.
    let chat = json!({"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920}});
    assert_eq!(
        billed(DialectKind::OpenAiChat, chat),
        Billed {
            input: 86,
            cache_read: 1920,
            cache_write: 0,
            output: 300
        }
    );
    // Anthropic: input_tokens counts only what follows the last cache breakpoint.
    let messages = json!({"input_tokens": 50, "cache_creation_input_tokens": 248,
        "cache_read_input_tokens": 100_000, "output_tokens": 503});
    assert_eq!(
        billed(DialectKind::Anthropic, messages),
        Billed {
            input: 50,
            cache_read: 100_000,
            cache_write: 248,
            output: 503
        }
    );
    // Responses: cached tokens are part of input_tokens; reasoning is output.
    let responses = json!({"input_tokens": 5000, "input_tokens_details": {"cached_tokens": 4096},
        "output_tokens": 700, "output_tokens_details": {"reasoning_tokens": 500}, "total_tokens": 5700});
    assert_eq!(
        billed(DialectKind::Responses, responses),
        Billed {
            input: 904,
            cache_read: 4096,
            cache_write: 0,
            output: 700
        }
    );
    // Gemini: cached content is part of the prompt; thoughts are billed as output.
    let gemini = json!({"promptTokenCount": 12_000, "cachedContentTokenCount": 10_000,
        "candidatesTokenCount": 200, "thoughtsTokenCount": 800, "totalTokenCount": 13_000});
    assert_eq!(
        billed(DialectKind::Gemini, gemini),
        Billed {
            input: 2_000,
            cache_read: 10_000,
            cache_write: 0,
            output: 1_000
        }
    );
    assert!(DialectKind::OpenAiChat.get().billed(&json!({})).is_none());
    // A summary call through Anthropic, as its translator hands it back: the cache's
    // share kept, so it is billed at the cache prices.
    let translated = json!({"prompt_tokens": 398, "completion_tokens": 40,
        "prompt_tokens_details": {"cached_tokens": 100}, "cache_creation_input_tokens": 248});
    assert_eq!(
        billed(DialectKind::OpenAiChat, translated),
        Billed {
            input: 50,
            cache_read: 100,
            cache_write: 248,
            output: 40
        }
    );
}
