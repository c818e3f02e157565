//! Which worker thread this is, and how many there are: a process-wide fact, set once
//! by the server before anything is built, so that each worker keeps its own upstream
//! connections ([`crate::upstream`]).

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

static COUNT: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Sets how many workers serve requests (at least one).
pub fn set_count(count: usize) {
    COUNT.store(count.max(1), Ordering::Relaxed);
}

/// How many workers serve requests: 1 unless the server set it.
pub fn count() -> usize {
    COUNT.load(Ordering::Relaxed)
}

/// Marks the calling thread as worker `index`.
pub fn enter(index: usize) {
    INDEX.with(|cell| cell.set(index));
}

/// The calling thread's worker: 0 for any thread that is not one (blocking pools, tests).
pub fn index() -> usize {
    INDEX.with(Cell::get)
}
