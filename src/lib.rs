//! handoff: a proxy in front of four LLM APIs (OpenAI chat completions, Anthropic
//! Messages, OpenAI Responses, Google Gemini) that keeps long conversations alive by
//! compacting them before they overflow the context window, and keeps every original
//! for audit.
//!
//! A request travels through the modules in this order:
//! - [`server`] accepts the connection (HTTP/1.1 or h2, `TCP_NODELAY`);
//! - [`router`] sends `/handoff/*` to [`tools::admin`]; every other request is admitted by
//!   [`auth`] as a tenant ([`tenant`]) and runs through the phases of [`pipeline`]: a
//!   `POST` a [`dialect`] tracks takes them all, any other request only those that
//!   read, check and forward its body;
//! - [`pipeline`] reads the body and parses it with its [`dialect`], keeping every
//!   unknown field;
//! - [`conversation`] names the conversation within its tenant, chains the [`digest`]s of
//!   its messages and appends the new originals to the [`store`] before anything goes
//!   upstream;
//! - [`projection`] builds the model view from the compactions [`adoption`] accepts;
//!   [`tokens`] and [`compaction`] shrink it when it would not fit, with the chain that
//!   [`strategies`] selects (built-in, exec and Rust kinds);
//! - [`forward`] sends it through [`upstream`] and [`relay`] hands the answer to the
//!   client frame by frame, while [`capture`] logs the reply on the side and
//!   [`access_log`] writes one line per request.
//!
//! The layers below the request path are crates of their own, re-exported here under
//! the paths above: [`base`] (`handoff-base`, the vocabulary: ids, digests, log lines,
//! records); `handoff-core` ([`body`], [`headers`], [`error`], the one place where a
//! failure becomes an answer in the API's own error shape, [`metrics`], [`redact`],
//! [`config`], [`telemetry`], …); `handoff-store` ([`store`], [`tenant`],
//! [`adoption`]); `handoff-wire` ([`dialect`], [`tokens`], [`upstream`]);
//! `handoff-engine` ([`conversation`], [`pins`], [`projection`], [`compaction`],
//! [`strategies`], [`audit`]). This crate is the request path and the tools: [`state`]
//! holds the config snapshot that [`reload`] swaps; [`tools`] holds the operator's tools:
//! [`tools::upkeep`] prunes, erases and compresses the log, [`tools::eval`] replays recorded conversations offline to compare
//! strategies; [`cli`] is the command line.
//!
//! Of this crate's own modules only [`cli`] (what the binary runs) and [`access_log`]
//! (the line format a log reader parses) are public; the request path is internal.

#![forbid(unsafe_code)]

/// Digests live in [`base`]; this path is kept for users of the library.
pub use base::digest;

/// The vocabulary every layer shares, its own crate (`crates/base`): it can import
/// nothing of handoff's.
pub use handoff_base as base;
/// Primitives and settings, their own crate (`crates/core`): bodies, headers, errors,
/// counters, secret scrubbing, the config, logging.
pub use handoff_core::{
    body, cache_scope, config, error, finish, headers, metrics, peers, redact, rewrite, telemetry,
    worker,
};
/// The engine, its own crate (`crates/engine`): conversations, pins, the model view,
/// compaction and its strategies, audit.
pub use handoff_engine::{audit, compaction, conversation, pins, projection, strategies};
/// The plugin registry, its own crate (`crates/registry`): the strategy and hook kinds
/// this build has, and where a binary registers its own
/// ([`plugins::register_strategy`], [`plugins::register_hook`]).
pub use handoff_registry as plugins;
/// The store, its own crate (`crates/store`): the message log on disk or in PostgreSQL;
/// tenants; which compaction records count.
pub use handoff_store::{self as store, adoption, tenant};
/// The wire formats, their own crate (`crates/wire`): dialects, token counting, the HTTP
/// client to the provider.
pub use handoff_wire::{dialect, tokens, upstream};

pub mod access_log;
mod auth;
mod body_read;
mod browser_guard;
mod capture;
pub mod cli;
mod forward;
mod gate;
mod named_model;
mod native;
mod neutral_forms;
mod otel;
mod ownership;
mod path;
mod pipeline;
mod relay;
mod reload;
mod rescue;
mod router;
mod server;
mod settings;
mod socket;
mod state;
#[cfg(test)]
mod testing;
mod tools;
mod upstream_socket;
