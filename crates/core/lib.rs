//! handoff's primitives and settings, the layer every other one builds on: the body
//! type and its helpers, which headers cross the proxy, handoff's own error and its
//! shapes, counters, secret scrubbing, byte rewriting of a streamed body, per-peer
//! limits, which worker thread this is, work that runs to its end in place; the typed
//! configuration and logging. It imports only the vocabulary ([`base`]) and the
//! plugin API the registered strategy kinds implement.

#![forbid(unsafe_code)]

// The vocabulary under the name every layer uses for it.
use handoff_base as base;

pub mod body;
pub mod cache_scope;
pub mod config;
pub mod error;
pub mod finish;
pub mod headers;
pub mod metrics;
pub mod peers;
pub mod redact;
pub mod rewrite;
pub mod telemetry;
pub mod worker;
