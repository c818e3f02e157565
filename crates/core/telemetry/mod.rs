//! Log setup: `tracing` to stderr, text or JSON, filtered by `RUST_LOG` or `log.level`.
//!
//! Lines are formatted on the thread that logs them and written by a writer thread
//! of their own, in batches ([`batch`]): a request never waits on a `write(2)` to
//! stderr, nor wakes a thread to make one.

mod access_format;
mod batch;
pub mod spans;

use std::io::IsTerminal;

use tracing_subscriber::EnvFilter;

use crate::config::{LogConfig, LogFormat};

pub use access_format::{Lean, ACCESS_TARGET};
pub use batch::Guard;

/// Installs the global subscriber; later calls are ignored. Keep the guard until
/// exit: dropping it writes what is still pending.
pub fn init(config: &LogConfig) -> Option<Guard> {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    match batch::batched(std::io::stderr()) {
        Ok((writer, guard)) => install(filter, config.format, writer).then_some(guard),
        Err(err) => {
            // Unbatched lines beat none.
            eprintln!("handoff: cannot start the log writer thread ({err}); writing to stderr");
            install(filter, config.format, std::io::stderr);
            None
        }
    }
}

/// Installs the subscriber writing to `writer`; false when one was already installed.
fn install<W>(filter: EnvFilter, format: LogFormat, writer: W) -> bool
where
    W: for<'a> tracing_subscriber::fmt::MakeWriter<'a> + Send + Sync + 'static,
{
    // Colour codes in a log file or journald make lines unreadable and ungreppable.
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(ansi)
        .with_target(true);
    let installed = match format {
        LogFormat::Text => builder.event_format(text_format(ansi)).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if installed.is_err() {
        tracing::debug!("a tracing subscriber was already installed");
    }
    installed.is_ok()
}

/// handoff's text format: tracing-subscriber's, with the access line written by [`Lean`].
pub fn text_format(
    ansi: bool,
) -> Lean<tracing_subscriber::fmt::format::Format<tracing_subscriber::fmt::format::Full>> {
    Lean::new(
        tracing_subscriber::fmt::format()
            .with_ansi(ansi)
            .with_target(true),
    )
}
