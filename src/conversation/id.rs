//! Conversation ids: the client's `x-handoff-conversation-id`, or one derived from the
//! first non-pinned message. An id is also a folder name, so it is checked strictly.

use std::fmt;

use crate::digest::Digest;

/// The header a client sends to name its conversation.
pub const CONVERSATION_HEADER: &str = "x-handoff-conversation-id";

/// Why an id was refused.
#[derive(Debug, thiserror::Error)]
pub enum IdError {
    /// Empty or longer than 128 characters.
    #[error("conversation id must be 1 to 128 characters, got {0}")]
    Length(usize),
    /// A character outside `[A-Za-z0-9._-]`.
    #[error("conversation id may only contain A-Z, a-z, 0-9, '.', '_' and '-'; found {0:?}")]
    Character(char),
    /// `.` or `..`, which would name a folder outside the conversation's own.
    #[error("conversation id must not consist of dots only")]
    DotsOnly,
}

/// A validated conversation id, safe to use as a folder name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConversationId(String);

impl ConversationId {
    /// Checks `text` against `[A-Za-z0-9._-]{1,128}`, dots-only names excluded.
    pub fn parse(text: &str) -> Result<Self, IdError> {
        let length = text.chars().count();
        if length == 0 || length > 128 {
            return Err(IdError::Length(length));
        }
        if let Some(bad) = text
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(IdError::Character(bad));
        }
        if text.chars().all(|c| c == '.') {
            return Err(IdError::DotsOnly);
        }
        Ok(Self(text.to_owned()))
    }

    /// The id a conversation gets from the digest of its first non-pinned message.
    pub fn derived(first: &Digest) -> Self {
        Self(format!("c-{}", first.short(32)))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ConversationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_could_escape_or_break_paths_are_refused() {
        for bad in ["", "../x", "a b", "..", ".", "a/b", "é", &"x".repeat(129)] {
            assert!(ConversationId::parse(bad).is_err(), "{bad:?} was accepted");
        }
        for good in ["a", "conv-1.2_3", &"x".repeat(128), "..a"] {
            assert!(ConversationId::parse(good).is_ok(), "{good:?} was refused");
        }
    }
}
