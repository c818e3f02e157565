//! The handoff pair that replaces the history: a fixed user continuation message and
//! the assistant handoff message.

use serde_json::{json, Value};

use crate::dialect::{Message, Role};

/// The continuation: tells the model how to read what follows.
pub const CONTINUATION: &str = "Continue from the compacted state. The earlier part of this conversation was compacted by handoff: the assistant message that follows is its handoff and the source of prior context, and the messages after it are the most recent ones, verbatim.";

/// The fixed reasoning marker for upstreams that require `reasoning_content` on
/// assistant messages; the summary model's own reasoning is never kept.
pub const REASONING_MARKER: &str =
    "[handoff: earlier reasoning was compacted; see the handoff text]";

/// The user continuation message.
pub fn continuation_message() -> Value {
    json!({"role": "user", "content": CONTINUATION})
}

/// The assistant handoff message, with the marker when `reasoning_marker` is set.
pub fn handoff_message(text: &str, reasoning_marker: bool) -> Value {
    if reasoning_marker {
        json!({"role": "assistant", "content": text, "reasoning_content": REASONING_MARKER})
    } else {
        json!({"role": "assistant", "content": text})
    }
}

/// True when the handoff needs the marker: configured for the model, or the request's
/// own assistant messages carry `reasoning_content`.
pub fn needs_reasoning_marker(configured: bool, messages: &[Message]) -> bool {
    configured
        || messages.iter().any(|m| {
            m.role == Role::Assistant
                && m.value
                    .get("reasoning_content")
                    .is_some_and(|r| !r.is_null())
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dialect::ChatRequest;

    #[test]
    fn the_marker_follows_config_or_the_request() {
        let plain =
            ChatRequest::parse(br#"{"messages":[{"role":"assistant","content":"x"}]}"#).unwrap();
        let reasoning = ChatRequest::parse(
            br#"{"messages":[{"role":"assistant","content":"x","reasoning_content":"r"}]}"#,
        )
        .unwrap();
        assert!(!needs_reasoning_marker(false, &plain.messages));
        assert!(needs_reasoning_marker(true, &plain.messages));
        assert!(needs_reasoning_marker(false, &reasoning.messages));
        let with = handoff_message("summary", true);
        assert_eq!(with["reasoning_content"], REASONING_MARKER);
        assert!(handoff_message("summary", false)
            .get("reasoning_content")
            .is_none());
    }
}
