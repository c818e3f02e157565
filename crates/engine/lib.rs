//! handoff's engine: what it does to a conversation, with no HTTP server. [`conversation`]
//! names conversations within their tenant, maps echoes and keeps replies; [`pins`] is
//! the standing context; [`projection`] builds the model view from adopted compactions;
//! [`compaction`] shrinks a view that would not fit (budget, units, the service's single
//! flight and loop, one run from plan to record) with the chain [`strategies`] selects;
//! [`audit`] reads the log back for people (verify, replay, branches, timelines).
//!
//! It builds on the store and the wire formats; the request path drives it.

#![forbid(unsafe_code)]

// The layers below, under the names every layer uses for them.
use handoff_base as base;
use handoff_core::{body, cache_scope, config, metrics, redact, telemetry, worker};
use handoff_store::{self as store, adoption, tenant};
use handoff_wire::{dialect, tokens, upstream};

pub mod audit;
pub mod compaction;
pub mod conversation;
pub mod pins;
pub mod projection;
pub mod strategies;
