//! handoff's wire formats: everything that knows an API's bytes. [`dialect`] reads each
//! API's requests into neutral messages and owns the rest of the format (pairing, echo
//! forms, credentials, the providers' objects, errors, overflow, replies, usage);
//! [`tokens`] counts a message's text; [`upstream`] is the HTTP client to the
//! provider. It builds on the vocabulary and the core, and knows nothing of tracking,
//! compaction or the server.

#![forbid(unsafe_code)]

// The layers below, under the names every layer uses for them.
use handoff_base as base;
use handoff_core::{body, cache_scope, config, error, redact, rewrite, telemetry, worker};

pub mod dialect;
pub mod tokens;
pub mod upstream;
