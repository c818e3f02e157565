//! How a response body ended: what the access log reports and what an incomplete
//! reply line records.

/// How a response body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Every byte reached the client.
    Complete,
    /// The upstream closed or broke the stream before its end.
    UpstreamCut,
    /// The upstream went silent for longer than `upstream.read_timeout`.
    Timeout,
    /// The client went away before the last byte.
    ClientGone,
    /// handoff cut the body itself, e.g. because the reply could not be logged.
    Error,
}

impl Outcome {
    /// The name written in logs and on incomplete reply lines.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Complete => "complete",
            Outcome::UpstreamCut => "upstream_cut",
            Outcome::Timeout => "timeout",
            Outcome::ClientGone => "client_gone",
            Outcome::Error => "error",
        }
    }
}
