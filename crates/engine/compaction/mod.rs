//! Compaction: when a request would overflow the model's window, the old history
//! becomes a handoff and the recent units stay verbatim (`docs/architecture.md`,
//! "Compaction").
//!
//! - [`budget`]: when to compact, with the calibrated estimate;
//! - [`mod@unit`] and [`split`]: where to cut, never inside a unit;
//! - [`chain`]: the strategies tried in order, every attempt recorded;
//! - [`continued`]: summary calls over the conversation's own cached prefix;
//! - [`handoff`]: the continuation + handoff pair;
//! - the record and the rule that adopts it (record + boundary) live in
//!   [`crate::base::record`] and [`crate::adoption`], below this layer;
//! - [`decision`]: what a request's log records of the budget and the view sent;
//! - [`job`]: what one compaction works on, the parts it runs with, how it ends;
//! - [`plan`]: where a run cuts; [`run`]: one run's record;
//! - [`service`]: the entry points (fit, compact), single flight, the loop guard;
//! - [`prepare`], [`background`] and [`pace`]: compactions prepared in the background, and when;
//! - [`max_wait`]: waiting for a detached run, and the stand-in past it;
//! - [`blocking`]: a run's CPU work, off the worker threads;
//! - [`summary_count`]: the summary model's own counts, calibrated by what it reports;
//! - [`spend`]: what summary calls cost at the configured prices.
//!
//! Recognising an upstream context-length error is the dialects' job
//! ([`crate::dialect::overflow`]).
//!
//! It never destroys an original, never commits after cancellation, and never
//! produces a view that it has not validated.

pub mod background;
mod blocking;
pub mod budget;
pub mod chain;
pub mod continued;
pub mod decision;
mod handoff;
pub mod job;
mod ledger;
mod max_wait;
pub mod model_client;
pub mod pace;
mod plan;
pub mod prepare;
mod run;
pub mod service;
pub mod spend;
mod split;
mod summary_count;
mod summary_span;
mod traced;
pub mod unit;

pub use crate::adoption::{adopt, Adopted, Adoption};
pub use crate::base::record::{CompactionRecord, Reason};
