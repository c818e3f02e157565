//! The handoff pair that replaces the history: a fixed user continuation message and
//! the assistant handoff message, each in the request's dialect.

use serde_json::Value;

#[cfg(test)]
use crate::dialect::pair::REASONING_MARKER;
use crate::dialect::{DialectKind, Message, Role};

/// The user continuation message.
pub(crate) fn continuation_message(dialect: DialectKind) -> Value {
    dialect.get().continuation()
}

/// The assistant handoff message, with the marker when `reasoning_marker` is set and
/// the dialect allows one.
pub(crate) fn handoff_message(dialect: DialectKind, text: &str, reasoning_marker: bool) -> Value {
    dialect.get().handoff(text, reasoning_marker)
}

/// True when the handoff needs the marker: configured for the model, or the request's
/// own assistant messages carry reasoning the upstream wants on each of them.
pub(crate) fn needs_reasoning_marker(
    configured: bool,
    dialect: DialectKind,
    messages: &[Message],
) -> bool {
    configured
        || messages
            .iter()
            .any(|m| m.role == Role::Assistant && dialect.get().carries_reasoning(m.value()))
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
        assert!(!needs_reasoning_marker(
            false,
            DialectKind::OpenAiChat,
            &plain.messages
        ));
        assert!(needs_reasoning_marker(
            true,
            DialectKind::OpenAiChat,
            &plain.messages
        ));
        assert!(needs_reasoning_marker(
            false,
            DialectKind::OpenAiChat,
            &reasoning.messages
        ));
        let with = handoff_message(DialectKind::OpenAiChat, "summary", true);
        assert_eq!(with["reasoning_content"], REASONING_MARKER);
        assert!(handoff_message(DialectKind::OpenAiChat, "summary", false)
            .get("reasoning_content")
            .is_none());
        assert!(handoff_message(DialectKind::Anthropic, "summary", true)
            .get("reasoning_content")
            .is_none());
    }
}
