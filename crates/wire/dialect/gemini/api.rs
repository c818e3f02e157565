//! Gemini: what the API is and where it lives: its name, paths, and the model a path names.

use super::*;
use crate::dialect::Api;

impl Api for Gemini {
    fn kind(&self) -> DialectKind {
        DialectKind::Gemini
    }

    fn name(&self) -> &'static str {
        "gemini"
    }

    fn api(&self) -> &'static str {
        API
    }

    /// The models collection: what a proxy key may use under it, and the root of
    /// [`crate::dialect::Api::call_path`].
    fn path(&self) -> &'static str {
        "/v1beta/models"
    }

    fn tracks(&self, path: &str) -> bool {
        path::generating(path).is_some()
    }

    /// Its own version prefixes, Vertex AI's Google models, and a model method under
    /// `/v1/models/` (OpenAI's fine-tuned model ids hold colons too, so only Gemini's
    /// methods count).
    fn answers_path(&self, path: &str) -> bool {
        path.starts_with("/v1beta/")
            || path.starts_with("/v1alpha/")
            || path.starts_with("/upload/v1beta/")
            || path.contains("/publishers/google/models/")
            || (path.starts_with("/v1/models/")
                && path
                    .rsplit_once(':')
                    .is_some_and(|(_, method)| path::METHODS.contains(&method)))
    }

    fn path_model(&self, path: &str) -> Option<String> {
        path::model(path).map(str::to_owned)
    }

    fn call_path(&self, model: &str, target: Option<&str>) -> String {
        path::call(model, target)
    }

    fn retarget(&self, target: &str, model: &str) -> Option<String> {
        path::retarget(target, model)
    }
}
