//! AnthropicMessages: what the API is and where it lives: its name, paths, and the model a path names.

use super::*;
use crate::dialect::Api;

impl Api for AnthropicMessages {
    fn kind(&self) -> DialectKind {
        DialectKind::Anthropic
    }

    fn path(&self) -> &'static str {
        "/v1/messages"
    }

    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn api(&self) -> &'static str {
        API
    }

    fn tracks(&self, path: &str) -> bool {
        path.ends_with("/v1/messages")
    }

    fn answers_path(&self, path: &str) -> bool {
        path.ends_with("/v1/messages") || path.contains("/v1/messages/")
    }
}
