//! Which worker thread this is, and how many there are: a process-wide fact, set once
//! by the server before anything is built, so that each worker keeps its own upstream
//! connections (`upstream`, in handoff-wire).

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static COUNT: AtomicUsize = AtomicUsize::new(1);

/// Whether more than one thread serves requests: N workers, or a work-stealing runtime
/// on more than one core (which has one set of upstream pools, so `COUNT` is 1).
static PARALLEL: AtomicBool = AtomicBool::new(false);

thread_local! {
    static INDEX: Cell<usize> = const { Cell::new(0) };
}

/// Sets how many workers serve requests (at least one).
pub fn set_count(count: usize) {
    COUNT.store(count.max(1), Ordering::Relaxed);
    PARALLEL.store(count > 1, Ordering::Relaxed);
}

/// Says that requests are served by a work-stealing runtime of `threads` threads.
pub fn set_stealing(threads: usize) {
    PARALLEL.store(threads > 1, Ordering::Relaxed);
}

/// True when requests may run on more than one thread at once: a lock another request
/// holds may then be let go while this one waits, without this thread's help.
pub fn parallel() -> bool {
    PARALLEL.load(Ordering::Relaxed)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_work_stealing_runtime_on_several_cores_runs_requests_in_parallel() {
        set_stealing(1);
        assert!(!parallel(), "one thread runs one request at a time");
        set_stealing(4);
        assert!(parallel());
        // Left as the default: nothing else in the tests sets it.
        set_stealing(1);
    }
}
