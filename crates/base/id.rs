//! Conversation ids: the client's `x-handoff-conversation-id`, or one derived from the
//! first non-pinned message, always within a tenant. An id is also a folder name, so
//! it is checked strictly.

use std::fmt;
use std::sync::Arc;

use super::digest::Digest;
use super::tenant::TenantId;

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

/// A validated conversation id within its tenant, safe to use as a folder name. Two
/// tenants' conversations of the same name are different conversations. Cloned by
/// reference count: a request hands it to the cache, the log and the reply's logger.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConversationId {
    tenant: TenantId,
    name: Arc<str>,
}

impl ConversationId {
    /// Checks `text` against `[A-Za-z0-9._-]{1,128}`, dots-only names excluded.
    pub fn parse(tenant: TenantId, text: &str) -> Result<Self, IdError> {
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
        Ok(Self {
            tenant,
            name: Arc::from(text),
        })
    }

    /// The id a conversation gets from the digest of its first non-pinned message.
    pub fn derived(tenant: TenantId, first: &Digest) -> Self {
        let mut name = String::with_capacity(34);
        name.push_str("c-");
        name.push_str(&first.hex()[..32]);
        Self {
            tenant,
            name: Arc::from(name),
        }
    }

    /// The id as text, without its tenant.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The tenant the conversation belongs to.
    pub fn tenant(&self) -> &TenantId {
        &self.tenant
    }
}

impl fmt::Display for ConversationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_that_could_escape_or_break_paths_are_refused() {
        let t = TenantId::legacy;
        for bad in ["", "../x", "a b", "..", ".", "a/b", "é", &"x".repeat(129)] {
            assert!(
                ConversationId::parse(t(), bad).is_err(),
                "{bad:?} was accepted"
            );
        }
        for good in ["a", "conv-1.2_3", &"x".repeat(128), "..a"] {
            assert!(
                ConversationId::parse(t(), good).is_ok(),
                "{good:?} was refused"
            );
        }
    }
}
