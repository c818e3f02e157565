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
        // The text format's timestamp (RFC 3339, microseconds, UTC), without its
        // field-by-field `write!`s.
        write!(
            writer,
            "{}",
            humantime::format_rfc3339_micros(std::time::SystemTime::now())
        )?;
        write!(writer, " {:>5} {ACCESS_TARGET}: ", meta.level().as_str())?;
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
