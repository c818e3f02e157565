//! StubDialect: what the API is and where it lives: its name, paths, and the model a path names.

use super::*;
use crate::dialect::Api;

impl Api for StubDialect {
    fn kind(&self) -> DialectKind {
        DialectKind::Stub
    }

    fn name(&self) -> &'static str {
        "tally"
    }

    fn api(&self) -> &'static str {
        API
    }

    fn path(&self) -> &'static str {
        "/v1/tally/generate"
    }

    fn tracks(&self, path: &str) -> bool {
        path.ends_with("/v1/tally/generate")
    }

    fn answers_path(&self, path: &str) -> bool {
        path.contains("/v1/tally/")
    }
}
