//! Tenant names: who a conversation belongs to, checked to be safe as folder names.

use std::fmt;
use std::sync::Arc;

/// The tenant that conversations logged before tenants existed are moved to.
pub const LEGACY: &str = "legacy";

/// Why a tenant name was refused.
#[derive(Debug, thiserror::Error)]
pub enum TenantError {
    /// Not 1 to 64 characters of `[A-Za-z0-9._-]`, or dots only.
    #[error("tenant must be 1 to 64 characters of A-Z, a-z, 0-9, '.', '_' and '-', not dots only; got {0:?}")]
    Invalid(String),
}

/// A validated tenant name, safe to use as a folder name. Shared, not copied: every
/// request's conversation id and log line carries it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantId(Arc<str>);

impl TenantId {
    /// Checks `text` against `[A-Za-z0-9._-]{1,64}`, dots-only names excluded.
    pub fn parse(text: &str) -> Result<Self, TenantError> {
        let valid = (1..=64).contains(&text.len())
            && text
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
            && !text.chars().all(|c| c == '.');
        if valid {
            Ok(Self(Arc::from(text)))
        } else {
            Err(TenantError::Invalid(text.chars().take(80).collect()))
        }
    }

    /// The tenant named by the hex digits of a keyed hash's leading bytes: `t-<hex>`.
    pub fn derived(hash: &[u8]) -> Self {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut name = String::with_capacity(2 + 2 * hash.len());
        name.push_str("t-");
        for byte in hash {
            name.push(char::from(DIGITS[usize::from(byte >> 4)]));
            name.push(char::from(DIGITS[usize::from(byte & 0xf)]));
        }
        Self(Arc::from(name))
    }

    /// The tenant of conversations logged before tenants existed.
    pub fn legacy() -> Self {
        Self(Arc::from(LEGACY))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for TenantId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tenant_names_that_could_escape_paths_are_refused() {
        for bad in ["", "..", "a/b", "a b", &"x".repeat(65)] {
            assert!(TenantId::parse(bad).is_err(), "{bad:?}");
        }
        assert!(TenantId::parse("team-a").is_ok());
    }
}
