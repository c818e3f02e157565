//! OpenAiResponses: what the API is and where it lives: its name, paths, and the model a path names.

use super::*;
use crate::dialect::Api;

impl Api for OpenAiResponses {
    fn kind(&self) -> DialectKind {
        DialectKind::Responses
    }

    fn path(&self) -> &'static str {
        "/v1/responses"
    }

    fn name(&self) -> &'static str {
        "responses"
    }

    fn api(&self) -> &'static str {
        API
    }

    fn tracks(&self, path: &str) -> bool {
        path.ends_with("/v1/responses") || path.ends_with(COMPACT_PATH)
    }

    /// The API's own path for handoff's calls, never its compaction endpoint.
    fn call_path(&self, _model: &str, target: Option<&str>) -> String {
        let Some(target) = target else {
            return self.path().to_owned();
        };
        let (path, query) = target.split_at(target.find('?').unwrap_or(target.len()));
        match path.strip_suffix("/compact") {
            Some(own) => format!("{own}{query}"),
            None => target.to_owned(),
        }
    }
}
