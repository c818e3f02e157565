//! What a wire format implements, one trait per concern, each with its defaults;
//! [`Dialect`] is all of them, implemented for every type that implements each.

mod api;
mod credentials;
mod failures;
mod neutral;
mod pair;
mod parsing;
mod replies;

pub use api::Api;
pub use credentials::Credentials;
pub use failures::Failures;
pub use neutral::Neutral;
pub use pair::Pair;
pub use parsing::Parsing;
pub use replies::Replies;

/// One wire format: every concern of it. A dialect implements the concerns, one file
/// each in its folder, and is listed once in `DialectKind`'s registry.
pub trait Dialect: Api + Credentials + Parsing + Pair + Failures + Replies + Neutral {}

impl<T: Api + Credentials + Parsing + Pair + Failures + Replies + Neutral + ?Sized> Dialect for T {}
