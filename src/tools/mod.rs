//! The operator's tools, beside the request path: the admin API ([`admin`]), the
//! embedded audit page ([`ui`]), retention, erasure and compression ([`upkeep`]), and
//! `handoff eval` ([`eval`]). They use the request path's state and phases; the request
//! path imports none of them (the layering check fails if it does).

pub(crate) mod admin;
pub(crate) mod eval;
pub(crate) mod ui;
pub(crate) mod upkeep;
