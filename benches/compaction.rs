//! A deterministic compaction (the `extract` strategy) of a ~200k-token history:
//! split, extract, commit to disk, re-project. Token counts are warm, as they are after
//! the request that triggered the compaction was estimated.
//!
//! Also: the CPU time of the thread that awaits it, on a current-thread runtime (a
//! `workers = N` worker's), since its CPU work runs on the blocking pool.
//!
//! `cargo bench --bench compaction`

// criterion's macros declare public functions of their own, undocumented.
#![allow(missing_docs)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use futures_util::future::BoxFuture;
use handoff::compaction::budget::RequestBudget;
use handoff::compaction::chain::{Chain, NamedStrategy};
use handoff::compaction::job::{Compactor, Job};
use handoff::config::{Config, FsyncPolicy, ModelConfig, Tokenizer};
use handoff::conversation::{ConversationId, Tracked, Tracker};
use handoff::dialect::ChatRequest;
use handoff::metrics::Metrics;
use handoff::projection::project_view;
use handoff::store::{DiskStore, Store, Writer};
use handoff::tenant::TenantId;
use handoff::tokens::Tokens;
use handoff_plugin_api::{CancellationToken, ModelCallError, ModelClient, ModelReply};
use handoff_strategy_extract::Extract;
use mock_upstream::fixtures::long_conversation;
use serde_json::{json, Value};

struct NoModel;

impl ModelClient for NoModel {
    fn complete(&self, _: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        Box::pin(async {
            Err(ModelCallError(
                "the deterministic benchmark calls no model".into(),
            ))
        })
    }
}

fn benches(c: &mut Criterion) {
    let (messages, tools) = long_conversation(460_000);
    let body = json!({"model": "gpt-4o", "messages": messages, "tools": tools}).to_string();
    let request = ChatRequest::parse(body.as_bytes()).unwrap_or_else(|err| unreachable!("{err}"));
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|err| unreachable!("{err}"));
    let dir = tempfile::tempdir().unwrap_or_else(|err| unreachable!("{err}"));
    let tokens = Arc::new(Tokens::new(handoff::dialect::text::message_text));
    let (tracker, compactor) = runtime.block_on(async {
        let writer = Writer::start(
            FsyncPolicy::Batch,
            Default::default(),
            dir.path().to_owned(),
        )
        .unwrap_or_else(|err| unreachable!("{err}"));
        let store: Arc<dyn Store> = Arc::new(DiskStore::new(dir.path(), writer));
        let compactor = Compactor {
            tokens: Arc::clone(&tokens),
            cancel: CancellationToken::new(),
            metrics: Arc::new(Metrics::default()),
            summary_calibrations: Default::default(),
            background: handoff::compaction::background::Background::new(0),
            summary_slots: Arc::new(tokio::sync::Semaphore::new(16)),
            pace: Arc::default(),
        };
        (Tracker::new(store, 100_000), compactor)
    });
    let mut config = Config::default();
    config.models.insert(
        "gpt-4o".into(),
        ModelConfig {
            context_window: 128_000,
            tokenizer: Tokenizer::O200k,
            default_output_reserve: None,
            reasoning_marker: false,
            compaction: None,
            api: None,
            native_compaction: None,
        },
    );
    let budget = RequestBudget::new(&config, &request, &tokens)
        .unwrap_or_else(|| unreachable!("gpt-4o has a window"));
    let client: Arc<dyn ModelClient> = Arc::new(NoModel);
    let chain: Chain = Arc::new([NamedStrategy {
        name: "extract".into(),
        strategy: Arc::new(Extract),
        timeout: None,
        summary_model: None,
        prune: None,
        handoff_tokens: None,
    }]);
    let warm = Tracked::compute(
        ConversationId::derived(TenantId::legacy(), &handoff::digest::bytes_digest(b"warm")),
        &request,
    );
    let total =
        project_view(&request, &warm, &Default::default()).estimate(&tokens, Tokenizer::O200k, 0);
    eprintln!(
        "history: {} messages, {total} tokens (o200k), {} bytes",
        request.messages.len(),
        body.len()
    );

    let serial = AtomicUsize::new(0);
    let compact = |runtime: &tokio::runtime::Runtime| {
        let n = serial.fetch_add(1, Ordering::Relaxed);
        let id = ConversationId::parse(TenantId::legacy(), &format!("bench-{n}"))
            .unwrap_or_else(|err| unreachable!("{err}"));
        let tracked = Tracked::compute(id.clone(), &request);
        let job = Job::new(
            &tracker,
            &request,
            &tracked,
            &config.compaction,
            &budget,
            Arc::clone(&client),
            Arc::clone(&chain),
        );
        runtime
            .block_on(compactor.compact(&job))
            .map(|view| view.live_start)
            .unwrap_or_else(|err| unreachable!("{err}"))
    };
    c.bench_function("compaction/extract_200k_tokens", |b| {
        b.iter(|| compact(&runtime))
    });
    // What a `workers = N` worker pays: the CPU time of the thread that awaits the
    // compaction (a current-thread runtime's), the rest being on the blocking pool.
    let worker = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap_or_else(|err| unreachable!("{err}"));
    // Without the kernel's per-thread counter a zero would read as a result: skipped.
    if thread_cpu().is_none() {
        eprintln!("/proc/thread-self/schedstat is unreadable: worker_thread_cpu skipped");
        return;
    }
    c.bench_function("compaction/extract_200k_tokens/worker_thread_cpu", |b| {
        b.iter_custom(|iters| {
            let before = thread_cpu().unwrap_or_default();
            for _ in 0..iters {
                compact(&worker);
            }
            thread_cpu().unwrap_or_default().saturating_sub(before)
        })
    });
}

/// The calling thread's CPU time so far, from `/proc/thread-self/schedstat` (ns).
fn thread_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    let nanos = stat.split_whitespace().next()?.parse().ok()?;
    Some(Duration::from_nanos(nanos))
}

criterion_group!(compaction, benches);
criterion_main!(compaction);
