//! OpenAiChat: what the API is and where it lives: its name, paths, and the model a path names.

use super::*;
use crate::dialect::Api;

impl Api for OpenAiChat {
    fn kind(&self) -> DialectKind {
        DialectKind::OpenAiChat
    }

    fn path(&self) -> &'static str {
        "/v1/chat/completions"
    }

    fn name(&self) -> &'static str {
        "openai"
    }

    fn api(&self) -> &'static str {
        API
    }

    fn tracks(&self, path: &str) -> bool {
        path.ends_with("/chat/completions")
    }
}
