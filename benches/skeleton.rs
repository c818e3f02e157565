//! The fixed costs of one tracked small chat request, each in isolation: reading the
//! body, the tenant's HMAC, naming the conversation, tracking a seen one, its counts,
//! reading the reply, and the access line. What the harness measures for a whole
//! request (benches/e2e.sh, CPU µs per request) minus their sum is the skeleton:
//! sockets, HTTP, the runtime's hand-offs.
//!
//! `cargo bench --bench skeleton`

// criterion's macros declare public functions of their own, undocumented.
#![allow(missing_docs)]

#[path = "support/mod.rs"]
mod support;

use criterion::{criterion_group, criterion_main, Criterion};
use handoff::access_log::RequestLog;
use handoff::config::Tokenizer;
use handoff::conversation::identify;
use handoff::dialect::anthropic::AnthropicMessages;
use handoff::dialect::openai::replies_from_json;
use handoff::dialect::ChatRequest;
use handoff::dialect::Parsing;
use handoff::tenant::ServerSecret;
use handoff::tokens::Tokens;
use serde_json::json;

fn benches(c: &mut Criterion) {
    let body = json!({"model": "bench-model", "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris."},
    ]})
    .to_string()
    .into_bytes();
    let reply = json!({"id": "chatcmpl-1", "object": "chat.completion", "created": 1,
        "model": "bench-model", "choices": [{"index": 0, "finish_reason": "stop",
        "message": {"role": "assistant", "content": "Rome."}}],
        "usage": {"prompt_tokens": 20, "completion_tokens": 2, "total_tokens": 22}})
    .to_string()
    .into_bytes();
    let mut group = c.benchmark_group("small_request");

    group.bench_function("parse_body", |b| {
        b.iter(|| ChatRequest::parse(&body).map(|r| r.messages.len()))
    });
    // An agent's system prompt (Claude Code's is tens of KB) comes back in every request:
    // read again, its facts come from the cache; a new one is parsed and digested.
    let system: String = (0..2_000).map(|n| format!("rule {n}. ")).collect();
    let anthropic = |system: &str| {
        json!({"model": "bench-model", "max_tokens": 64, "system": system, "messages": [
            {"role": "user", "content": "What is the capital of France?"},
        ]})
        .to_string()
        .into_bytes()
    };
    let seen = anthropic(&system);
    group.bench_function("anthropic_20kb_system_seen", |b| {
        b.iter(|| AnthropicMessages.parse(&seen).map(|r| r.messages.len()))
    });
    let mut variant = 0u64;
    group.bench_function("anthropic_20kb_system_unseen", |b| {
        b.iter_batched(
            || {
                variant += 1;
                anthropic(&format!("{variant} {system}"))
            },
            |body| AnthropicMessages.parse(&body).map(|r| r.messages.len()),
            criterion::BatchSize::LargeInput,
        )
    });
    let secret = ServerSecret::from_bytes([7; 32]);
    group.bench_function("tenant_hmac", |b| {
        b.iter(|| secret.tenant_for(b"Bearer sk-bench"))
    });
    let request = ChatRequest::parse(&body).unwrap_or_else(|err| unreachable!("{err}"));
    let tenant = secret.tenant_for(b"Bearer sk-bench");
    group.bench_function("identify", |b| {
        b.iter(|| identify(tenant.clone(), None, &request).map(|id| id.to_string().len()))
    });
    let tokens = Tokens::new(handoff::dialect::text::message_text);
    let count = || -> u64 {
        request
            .messages
            .iter()
            .map(|m| m.token_count(&tokens, Tokenizer::O200k))
            .sum()
    };
    count();
    group.bench_function("counted_again", |b| b.iter(count));

    let runtime = support::runtime();
    let dir = tempfile::tempdir().unwrap_or_else(|err| unreachable!("{err}"));
    let id = identify(tenant.clone(), None, &request).unwrap_or_else(|err| unreachable!("{err}"));
    support::bench_track_seen(&mut group, &runtime, dir.path(), &id, &request);

    group.bench_function("read_reply", |b| {
        b.iter(|| replies_from_json(&reply).is_ok())
    });

    // handoff's text format, written nowhere: the formatting is what is measured.
    let subscriber = tracing_subscriber::fmt()
        .with_writer(std::io::sink)
        .with_ansi(false)
        .event_format(handoff::telemetry::text_format(false))
        .finish();
    tracing::subscriber::with_default(subscriber, || {
        group.bench_function("access_line", |b| {
            b.iter(|| {
                let mut log = RequestLog::start(http::Method::POST, "/v1/chat/completions".into());
                log.set_tenant(&tenant);
                log.set_conversation(&id);
                drop(log);
            })
        });
    });
    group.finish();
}

criterion_group!(skeleton, benches);
criterion_main!(skeleton);
