//! The fixed texts of the handoff pair, which every dialect shapes into its own
//! messages.

/// The continuation: tells the model how to read what follows.
pub const CONTINUATION: &str = "Continue from the compacted state. The earlier part of this conversation was compacted by handoff: the assistant message that follows is its handoff and the source of prior context, and the messages after it are the most recent ones, verbatim.";

/// The fixed reasoning marker for upstreams that require `reasoning_content` on
/// assistant messages; the summary model's own reasoning is never kept.
pub const REASONING_MARKER: &str =
    "[handoff: earlier reasoning was compacted; see the handoff text]";
