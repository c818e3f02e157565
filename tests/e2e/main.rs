//! The end-to-end tests: the real `handoff` binary (and its CLI) between real or
//! scripted clients and the in-repo mock providers, one module per subject. They are
//! one test binary, so a change links one executable instead of one per file; the
//! real agents, the real model, the real-time zero-wait runs, PostgreSQL, the browser
//! and the fuzzers keep binaries of their own (`tests/*.rs`).
//!
//! `cargo test --test e2e` runs them all; `cargo test --test e2e tracking::` one subject.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../support/mod.rs"]
mod support;

mod anthropic;
mod attacks;
mod bill;
mod compaction;
mod config;
mod crash_loop;
mod decisions;
mod deterministic;
mod erasure;
mod eval_dialects;
mod faults;
mod folding;
mod forgery;
mod gemini;
mod held;
mod hook_stages;
mod hooks;
mod native_compaction;
mod plugins;
mod proxy;
mod replies;
mod responses;
mod retention;
mod sdk;
mod served_compaction;
mod stream_end;
mod team;
mod tenants;
mod tls;
mod tracking;
mod upkeep_crash;
