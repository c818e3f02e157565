//! The leaf vocabulary every layer of handoff shares: tenant and conversation ids,
//! digests, a body as the frames it arrived in, the lexing of JSON text, the lines of
//! the message log, how a reply ended, compaction records and calibration. It is its
//! own crate, so Cargo enforces that it imports nothing of handoff's, and `store`,
//! `conversation` and `compaction` can all build on it without importing each other.

pub mod calibration;
pub mod chunks;
pub mod digest;
pub mod frame;
pub mod id;
pub mod json_lex;
pub mod ledger;
pub mod line;
pub mod outcome;
pub mod record;
pub mod reply;
pub mod tenant;
pub mod version;
