//! A wire format's what the API is and where it lives: its name, paths, and the model a path names.

use crate::dialect::DialectKind;

/// One wire format's what the API is and where it lives.
pub trait Api: Send + Sync {
    /// Which one this is.
    fn kind(&self) -> DialectKind;

    /// The name used in logs, records and the exec protocol (`openai`, `anthropic`).
    fn name(&self) -> &'static str;

    /// The API's name in error messages.
    fn api(&self) -> &'static str;

    /// The path a request of this dialect is posted to, for calls handoff makes itself.
    fn path(&self) -> &'static str;

    /// True when this dialect tracks `POST path`.
    fn tracks(&self, path: &str) -> bool;

    /// True when handoff's own errors for `path` (any method) take this dialect's
    /// shape; OpenAI's shape answers every path no dialect claims.
    fn answers_path(&self, _path: &str) -> bool {
        false
    }

    /// The path and query of a non-streamed call handoff makes itself to `model` (a
    /// summary, an eval), given the client's request `target` when there is one: that
    /// target where the model is in the body, else [`crate::dialect::Api::path`].
    fn call_path(&self, model: &str, target: Option<&str>) -> String {
        let _ = model;
        target.unwrap_or(self.path()).to_owned()
    }

    /// `target` sending its request to `model` instead, where the path names the
    /// model; `None` where the body does (its top-level `model` is rewritten then).
    fn retarget(&self, target: &str, model: &str) -> Option<String> {
        let _ = (target, model);
        None
    }

    /// The model a path names (Gemini's `…/models/{model}:countTokens`), which a proxy
    /// key's allow-list checks on every request, tracked or passed through; `None` where
    /// the body names it.
    fn path_model(&self, path: &str) -> Option<String> {
        let _ = path;
        None
    }
}
