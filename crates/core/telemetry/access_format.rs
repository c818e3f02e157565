//! The access line, written without `fmt`'s general machinery: one line per request
//! is the one log event on the hot path, and tracing-subscriber's text format spends
//! most of its time there in `dyn Debug` calls, padding and style wrappers for each
//! of the line's ten fields. [`Lean`] writes that event byte for byte as the text
//! format would, and hands every other event to it.

use std::fmt;

use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The target of the access line.
pub const ACCESS_TARGET: &str = "handoff::access";

/// The text format, with the access line written directly.
pub struct Lean<F> {
    inner: F,
}

impl<F> Lean<F> {
    /// Wraps `inner`, the text format every other event (and a coloured line) takes.
    pub fn new(inner: F) -> Self {
        Self { inner }
    }
}

impl<S, N, F> FormatEvent<S, N> for Lean<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        // Colours, or a span around the line, are the general format's to write.
        if meta.target() != ACCESS_TARGET
            || writer.has_ansi_escapes()
            || ctx.lookup_current().is_some()
        {
            return self.inner.format_event(ctx, writer, event);
        }
        write_timestamp(&mut writer, std::time::SystemTime::now())?;
        writer.write_str(level_and_target(*meta.level()))?;
        let mut fields = Fields {
            writer: writer.by_ref(),
            first: true,
            result: Ok(()),
        };
        event.record(&mut fields);
        fields.result?;
        writer.write_char('\n')
    }
}

/// Writes the text format's timestamp (RFC 3339, microseconds, UTC). Its date and
/// time to the second are formatted once per second per thread, not per line.
fn write_timestamp(writer: &mut Writer<'_>, now: std::time::SystemTime) -> fmt::Result {
    thread_local! {
        /// The second last formatted, and its `YYYY-MM-DDTHH:MM:SS`.
        static SECOND: std::cell::RefCell<(u64, String)> =
            const { std::cell::RefCell::new((u64::MAX, String::new())) };
    }
    let since = now
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let mut fraction = *b".000000Z";
    let mut micros = since.subsec_micros();
    for digit in fraction[1..7].iter_mut().rev() {
        *digit = b'0' + (micros % 10) as u8;
        micros /= 10;
    }
    SECOND.with_borrow_mut(|(kept, text)| {
        if *kept != since.as_secs() {
            // From the whole seconds since the epoch, not `now`: humantime panics on a
            // clock set before 1970, and this runs in a request's drop.
            let second = std::time::UNIX_EPOCH + std::time::Duration::from_secs(since.as_secs());
            *text = humantime::format_rfc3339_seconds(second).to_string();
            text.pop(); // its `Z`: the fraction comes first
            *kept = since.as_secs();
        }
        writer.write_str(text)
    })?;
    writer.write_str(std::str::from_utf8(&fraction).unwrap_or(".000000Z"))
}

/// The text format's level, right-aligned in five columns, and the access target.
fn level_and_target(level: tracing::Level) -> &'static str {
    match level {
        tracing::Level::TRACE => " TRACE handoff::access: ",
        tracing::Level::DEBUG => " DEBUG handoff::access: ",
        tracing::Level::INFO => "  INFO handoff::access: ",
        tracing::Level::WARN => "  WARN handoff::access: ",
        tracing::Level::ERROR => " ERROR handoff::access: ",
    }
}

/// Writes fields as the text format's default visitor does: `message` bare, others
/// `name=value` with strings quoted as `Debug` quotes them, one space apart.
struct Fields<'w> {
    writer: Writer<'w>,
    first: bool,
    result: fmt::Result,
}

impl Fields<'_> {
    fn pad(&mut self) -> fmt::Result {
        if std::mem::take(&mut self.first) {
            Ok(())
        } else {
            self.writer.write_char(' ')
        }
    }

    fn named(&mut self, field: &Field, value: impl FnOnce(&mut Writer<'_>) -> fmt::Result) {
        if self.result.is_err() {
            return;
        }
        self.result = self.pad().and_then(|()| {
            if field.name() != "message" {
                self.writer.write_str(field.name())?;
                self.writer.write_char('=')?;
            }
            value(&mut self.writer)
        });
    }
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        let message = field.name() == "message";
        self.named(field, |writer| {
            // `Debug` quotes and escapes; a string with nothing to escape (every id,
            // path and outcome the line carries) is copied between the quotes.
            let plain = value
                .bytes()
                .all(|b| (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\');
            match (message, plain) {
                (true, _) => writer.write_str(value),
                (false, true) => {
                    writer.write_char('"')?;
                    writer.write_str(value)?;
                    writer.write_char('"')
                }
                (false, false) => write!(writer, "{value:?}"),
            }
        });
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.named(field, |writer| {
            writer.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.named(field, |writer| {
            writer.write_str(itoa::Buffer::new().format(value))
        });
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.named(field, |writer| write!(writer, "{value:?}"));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::MakeWriter;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Self::Writer {
            self.clone()
        }
    }

    /// The lines `emit` logs, with the general text format or the lean one.
    fn lines(lean: bool, emit: impl Fn()) -> String {
        let out = Captured::default();
        let builder = tracing_subscriber::fmt()
            .with_writer(out.clone())
            .with_ansi(false)
            .with_target(true);
        if lean {
            let format = tracing_subscriber::fmt::format()
                .with_ansi(false)
                .with_target(true);
            let subscriber = builder.event_format(Lean::new(format)).finish();
            tracing::subscriber::with_default(subscriber, emit);
        } else {
            tracing::subscriber::with_default(builder.finish(), emit);
        }
        let bytes = out.0.lock().unwrap().clone();
        String::from_utf8(bytes).unwrap()
    }

    /// Everything but the timestamps, which differ between the two runs.
    fn untimed(text: &str) -> Vec<&str> {
        text.lines()
            .map(|line| line.split_once(' ').unwrap().1)
            .collect()
    }

    #[test]
    fn the_access_line_is_written_as_the_text_format_writes_it() {
        let emit = || {
            let total_ms = 0.231;
            tracing::info!(
                target: "handoff::access",
                method = %http::Method::POST,
                path = %"/v1/chat/completions?key=***",
                status = Some(200u16),
                total_ms = format_args!("{total_ms:.2}"),
                upstream_ms = Some(format!("{:.2}", 0.14)),
                bytes = 285u64,
                outcome = "complete",
                tenant = Some("t-a1116d50c5ad8342"),
                conversation = None::<&str>,
                "request"
            );
            // Strings that need escaping, negative numbers, a bool, and another target.
            tracing::warn!(target: "handoff::access", path = "/a\"b\\c\u{7}", delta = -3i64, ok = true, "odd");
            tracing::info!(target: "handoff::other", id = "x", "not the access line");
        };
        let (general, lean) = (lines(false, emit), lines(true, emit));
        assert_eq!(untimed(&lean), untimed(&general));
        assert_eq!(untimed(&lean).len(), 3);
        assert!(lean.contains(r#"status=200 total_ms=0.23 upstream_ms="0.14" bytes=285 outcome="complete" tenant="t-a1116d50c5ad8342""#), "{lean}");
        // The timestamp has the text format's own shape: digits where it has digits,
        // its separators where it has them (`2026-12-02T18:56:48.123456Z`).
        let shape = |line: &str| -> String {
            let stamp = line.split(' ').next().unwrap();
            stamp
                .chars()
                .map(|c| if c.is_ascii_digit() { '9' } else { c })
                .collect()
        };
        assert_eq!(shape(&lean), shape(&general), "{lean}\n{general}");
        assert_eq!(shape(&lean), "9999-99-99T99:99:99.999999Z");
    }

    #[test]
    fn the_timestamp_is_humantimes_at_every_instant() {
        use std::time::{Duration, UNIX_EPOCH};
        // Within one second, across a second, a minute and a year, and fractions with
        // leading zeros: the second kept from the line before must never be reused.
        for micros in [
            1_764_720_000_000_000_u64,
            1_764_720_000_000_007,
            1_764_720_000_999_999,
            1_764_720_001_000_000,
            1_764_720_059_123_456,
            1_764_720_060_010_000,
            1_767_225_599_999_999,
            1_767_225_600_000_001,
        ] {
            let now = UNIX_EPOCH + Duration::from_micros(micros);
            let mut line = String::new();
            write_timestamp(&mut Writer::new(&mut line), now).unwrap();
            assert_eq!(line, humantime::format_rfc3339_micros(now).to_string());
        }
    }

    #[test]
    fn a_clock_before_the_epoch_writes_the_epoch() {
        let now = std::time::UNIX_EPOCH - std::time::Duration::from_secs(5);
        let mut line = String::new();
        write_timestamp(&mut Writer::new(&mut line), now).unwrap();
        assert_eq!(line, "1970-01-01T00:00:00.000000Z");
    }

    #[test]
    fn every_level_is_padded_as_the_text_format_pads_it() {
        use tracing::Level;
        for level in [
            Level::TRACE,
            Level::DEBUG,
            Level::INFO,
            Level::WARN,
            Level::ERROR,
        ] {
            let general = format!(" {:>5} {ACCESS_TARGET}: ", level.as_str());
            assert_eq!(level_and_target(level), general);
        }
    }

    #[test]
    fn an_access_line_inside_a_span_keeps_the_spans() {
        let emit = || {
            let span = tracing::info_span!("conn", peer = "127.0.0.1");
            let _entered = span.enter();
            tracing::info!(target: "handoff::access", outcome = "complete", "request");
        };
        let lean = lines(true, emit);
        assert!(
            lean.contains(
                "conn{peer=\"127.0.0.1\"}: handoff::access: request outcome=\"complete\""
            ),
            "{lean}"
        );
        assert_eq!(untimed(&lean), untimed(&lines(false, emit)));
    }
}
