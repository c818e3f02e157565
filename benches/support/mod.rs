//! What the benches share: their runtime, and tracking a conversation already seen.

// Each bench includes these helpers as its own module.
#![allow(unreachable_pub)]

use std::sync::Arc;

use criterion::measurement::WallTime;
use criterion::{BatchSize, BenchmarkGroup};
use handoff::config::FsyncPolicy;
use handoff::conversation::{ConversationId, Tracker};
use handoff::dialect::ChatRequest;
use handoff::store::{DiskStore, Store, Writer};

/// A two-thread runtime, as the proxy has on the benchmark machine.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap_or_else(|err| unreachable!("{err}"))
}

/// Benches `track_seen_conversation`: `request`, tracked once as `id` on a disk store
/// in `dir`, tracked again (only the request line is new).
pub fn bench_track_seen(
    group: &mut BenchmarkGroup<'_, WallTime>,
    runtime: &tokio::runtime::Runtime,
    dir: &std::path::Path,
    id: &ConversationId,
    request: &ChatRequest,
) {
    let tracker = runtime.block_on(async {
        let writer = Writer::start(FsyncPolicy::Never, Default::default(), dir.to_owned())
            .unwrap_or_else(|err| unreachable!("{err}"));
        let store: Arc<dyn Store> = Arc::new(DiskStore::new(dir, writer));
        Arc::new(Tracker::new(store, 1000))
    });
    runtime
        .block_on(tracker.track(id.clone(), request))
        .unwrap_or_else(|err| unreachable!("{err}"));
    group.bench_function("track_seen_conversation", |b| {
        b.iter_batched(
            || id.clone(),
            |id| {
                runtime
                    .block_on(tracker.track(id, request))
                    .map(|t| t.new_messages)
            },
            BatchSize::SmallInput,
        )
    });
}
