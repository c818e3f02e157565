//! A log writer that hands lines to its thread in batches. A logging thread appends
//! the formatted line to a shared buffer under a short lock. It wakes the writer thread
//! only when that thread is idle (so a quiet server's lines appear at once) or the
//! batch passed [`EAGER`] bytes. After each write the writer gathers for [`INTERVAL`]
//! before the next: under load, one `write(2)` and one wake-up per interval, not per
//! line.
//!
//! `tracing-appender`'s non-blocking writer wakes its thread once per line; under load
//! that thread's park and unpark cost more CPU than the lines themselves (one access
//! line per request), which is what this avoids.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use tracing_subscriber::fmt::MakeWriter;

/// How long a busy writer gathers lines before its next write.
const INTERVAL: Duration = Duration::from_millis(10);
/// A batch this big is written without waiting for the interval.
const EAGER: usize = 256 * 1024;
/// Past this, a logging thread writes the batch itself rather than let it grow:
/// no line is dropped, and memory stays bounded when stderr is slow.
const CAP: usize = 8 * 1024 * 1024;

/// Where batches go; its lock is taken while `pending`'s is held, so batches are
/// written in the order they were taken, whichever thread writes them.
type Out = Mutex<Box<dyn Write + Send>>;

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    out: Out,
}

#[derive(Default)]
struct Pending {
    bytes: Vec<u8>,
    closed: bool,
    /// The writer waits for a line, with nothing to write: the next line wakes it.
    idle: bool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        self.pending
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn out(&self) -> MutexGuard<'_, Box<dyn Write + Send>> {
        self.out
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The `MakeWriter` handed to the fmt layer.
#[derive(Clone)]
pub(crate) struct Batched {
    shared: Arc<Shared>,
}

/// Writes what is still pending, then stops the writer thread, when dropped.
pub struct Guard {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// Starts the writer thread over `out`.
pub(crate) fn batched<W: Write + Send + 'static>(out: W) -> std::io::Result<(Batched, Guard)> {
    let shared = Arc::new(Shared {
        pending: Mutex::default(),
        wake: Condvar::new(),
        out: Mutex::new(Box::new(out)),
    });
    let theirs = Arc::clone(&shared);
    let thread = std::thread::Builder::new()
        .name("handoff-log".into())
        .spawn(move || {
            let mut batch = Vec::new();
            loop {
                let (closed, mut out) = {
                    let mut pending = theirs.lock();
                    while pending.bytes.is_empty() && !pending.closed {
                        pending.idle = true;
                        pending = theirs
                            .wake
                            .wait(pending)
                            .unwrap_or_else(|poisoned| poisoned.into_inner());
                    }
                    pending.idle = false;
                    std::mem::swap(&mut batch, &mut pending.bytes);
                    (pending.closed, theirs.out())
                };
                // Nowhere to report a failed write to stderr but stderr.
                let _ = out.write_all(&batch).and_then(|()| out.flush());
                drop(out);
                batch.clear();
                if closed {
                    return;
                }
                // Gather the next batch; lines arriving meanwhile wake no one.
                let pending = theirs.lock();
                if pending.bytes.len() < EAGER && !pending.closed {
                    drop(
                        theirs
                            .wake
                            .wait_timeout(pending, INTERVAL)
                            .map_or_else(|poisoned| poisoned.into_inner().0, |(guard, _)| guard),
                    );
                }
            }
        })?;
    Ok((
        Batched {
            shared: Arc::clone(&shared),
        },
        Guard {
            shared,
            thread: Some(thread),
        },
    ))
}

impl Drop for Guard {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.wake.notify_one();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl<'a> MakeWriter<'a> for Batched {
    type Writer = Line<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        Line {
            shared: &self.shared,
        }
    }
}

/// One event's writer: the fmt layer writes each formatted line to it whole.
pub(crate) struct Line<'a> {
    shared: &'a Shared,
}

impl Write for Line<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let mut pending = self.shared.lock();
        if pending.closed {
            let mut out = self.shared.out();
            drop(pending);
            return out.write(bytes);
        }
        pending.bytes.extend_from_slice(bytes);
        let size = pending.bytes.len();
        if size >= CAP {
            let overflow = std::mem::take(&mut pending.bytes);
            let mut out = self.shared.out();
            drop(pending);
            out.write_all(&overflow)?;
        } else if pending.idle || size >= EAGER {
            pending.idle = false;
            self.shared.wake.notify_one();
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `Write` whose bytes a test can read back.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0
                .lock()
                .map_err(|_| std::io::ErrorKind::Other)?
                .extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn written(sink: &Sink) -> String {
        String::from_utf8(sink.0.lock().map(|b| b.clone()).unwrap_or_default()).unwrap_or_default()
    }

    #[test]
    fn lines_arrive_in_order_within_the_interval_and_all_on_drop() {
        let sink = Sink::default();
        let Ok((writer, guard)) = batched(sink.clone()) else {
            unreachable!("the writer thread starts")
        };
        for n in 0..1000 {
            let _ = writeln!(writer.make_writer(), "line {n}");
        }
        // Within a few intervals, with no flush asked for.
        let mut waited = Duration::ZERO;
        while !written(&sink).contains("line 999") && waited < Duration::from_secs(5) {
            std::thread::sleep(INTERVAL);
            waited += INTERVAL;
        }
        assert!(
            written(&sink).contains("line 999\n"),
            "pending lines are written without a flush"
        );
        let _ = writeln!(writer.make_writer(), "the last line");
        drop(guard);
        let text = written(&sink);
        let expected: String =
            (0..1000).map(|n| format!("line {n}\n")).collect::<String>() + "the last line\n";
        assert_eq!(
            text, expected,
            "every line, in order, the last one written on drop"
        );
    }

    #[test]
    fn a_backlog_past_the_cap_goes_to_the_same_output_in_order() {
        let sink = Sink::default();
        let Ok((writer, guard)) = batched(sink.clone()) else {
            unreachable!("the writer thread starts")
        };
        // Far more than CAP, faster than one writer thread drains it.
        let line = "x".repeat(1000);
        let lines = 2 * CAP / line.len();
        for n in 0..lines {
            let _ = writeln!(writer.make_writer(), "{n} {line}");
        }
        drop(guard);
        let text = written(&sink);
        let numbers: Vec<usize> = text
            .lines()
            .filter_map(|l| l.split(' ').next()?.parse().ok())
            .collect();
        assert_eq!(
            numbers,
            (0..lines).collect::<Vec<_>>(),
            "every line, once, in order"
        );
    }
}
