//! Tracking's inner loops on a ~100k-token conversation (about 400 KB of messages):
//! parsing the body, digesting every message, and tracking a conversation that has
//! already been seen (only the request line is new).
//!
//! `cargo bench --bench tracking`

// criterion's macros declare public functions of their own, undocumented.
#![allow(missing_docs)]

#[path = "support/mod.rs"]
mod support;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use handoff::conversation::identify;
use handoff::dialect::ChatRequest;
use handoff::digest::{message_digest, prefix_digests};
use handoff::tenant::TenantId;
use mock_upstream::fixtures::long_conversation;
use serde_json::json;

fn body() -> Vec<u8> {
    let (messages, tools) = long_conversation(400_000);
    json!({"model": "gpt-4o", "messages": messages, "tools": tools})
        .to_string()
        .into_bytes()
}

fn benches(c: &mut Criterion) {
    let body = body();
    let mut group = c.benchmark_group("tracking_100k_tokens");
    group.throughput(Throughput::Bytes(body.len() as u64));

    // The same body again and again: after the first, its messages come from the memo
    // of the body before (dialect::prefix), as an agent's next turn's would.
    group.bench_function("parse_body", |b| {
        b.iter(|| ChatRequest::parse(&body).map(|r| r.messages.len()))
    });
    // A body whose leading bytes no memo has: every message is scanned.
    let mut model = 0u64;
    group.bench_function("parse_body_unseen", |b| {
        b.iter_batched(
            || {
                model += 1;
                let mut fresh = format!("{{\"x_unseen\":{model},").into_bytes();
                fresh.extend_from_slice(&body[1..]);
                fresh
            },
            |fresh| ChatRequest::parse(&fresh).map(|r| r.messages.len()),
            BatchSize::LargeInput,
        )
    });

    let request = ChatRequest::parse(&body).unwrap_or_else(|err| unreachable!("{err}"));
    group.bench_function("digest_and_chain", |b| {
        b.iter(|| {
            let digests: Vec<_> = request
                .messages
                .iter()
                .map(|m| message_digest(m.value()))
                .collect();
            prefix_digests(&digests)
        })
    });

    let runtime = support::runtime();
    let dir = tempfile::tempdir().unwrap_or_else(|err| unreachable!("{err}"));
    let id =
        identify(TenantId::legacy(), None, &request).unwrap_or_else(|err| unreachable!("{err}"));
    support::bench_track_seen(&mut group, &runtime, dir.path(), &id, &request);
    group.finish();
}

criterion_group!(tracking, benches);
criterion_main!(tracking);
