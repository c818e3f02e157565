//! The format versions of the log's lines: each line carries one, and a reader reports
//! a line newer than it knows instead of reading it as nothing.

/// Version written on every line but a run of messages.
pub const FORMAT_VERSION: u32 = 1;

/// Version of a `messages` run line: an older build reports a run as too new rather
/// than reading it as nothing.
pub const RUN_VERSION: u32 = 2;

/// Version of a `form` line.
pub const FORM_VERSION: u32 = 3;

/// Version of a `decision` line.
pub const DECISION_VERSION: u32 = 4;

/// Version of a `pinned` line whose messages are stored once for the tenant, by
/// digest ([`crate::line::PinnedLine::block`]): an older build reports it as too new rather than
/// reading an empty set.
pub const BLOCK_VERSION: u32 = 5;

/// Version of an `escaped` line, which carries a line that holds a line break as a
/// string ([`crate::frame`]): an older build reports it rather than reading the line
/// it carries as lines of their own.
pub const ESCAPED_VERSION: u32 = 6;

/// Version of a `request` line with `inline_forms`: an older build reports it rather
/// than rebuilding the request with the forms it carried left out.
pub const INLINE_FORMS_VERSION: u32 = 7;

/// The newest version a reader accepts.
pub const NEWEST_VERSION: u32 = INLINE_FORMS_VERSION;
