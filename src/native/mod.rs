//! The APIs' own compaction, served by handoff where the upstream lacks it
//! (`upstream.native_compaction`): which requests ask for it, whether this upstream and
//! model are served or passed, the handle handoff answers with, and the replies each
//! API documents.

pub(crate) mod asks;
pub(crate) mod handle;
pub(crate) mod prepend;
pub(crate) mod reply;
pub(crate) mod strip;

use std::collections::HashSet;
use std::sync::Mutex;

use serde_json::Value;

/// The counter of native compactions, by how they were served.
pub(crate) const SERVED: &str = "handoff_native_compaction_total";

/// The upstreams and models found to refuse the APIs' own compaction: `auto` serves
/// their asks at once from then on. Kept for the life of the process (a restart asks
/// again, once).
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    known: Mutex<HashSet<(String, String)>>,
}

impl Refusals {
    /// True when `upstream` was found to refuse `model`'s asks.
    pub(crate) fn known(&self, upstream: &str, model: &str) -> bool {
        self.known
            .lock()
            .is_ok_and(|known| known.contains(&(upstream.to_owned(), model.to_owned())))
    }

    /// Remembers that `upstream` refused `model`'s ask; true when it was news.
    pub(crate) fn remember(&self, upstream: &str, model: &str) -> bool {
        self.known
            .lock()
            .is_ok_and(|mut known| known.insert((upstream.to_owned(), model.to_owned())))
    }
}

/// The words an upstream's refusal of each ask names: the field, the item type, the
/// edit. A refusal that names none of them is about something else.
const ASKS: &[&str] = &[
    "compaction_trigger",
    "context_management",
    "compact_20260112",
    "clear_thinking",
    "clear_tool_uses",
    "compaction",
];

/// True when an upstream's answer (`status`, `body`) to a request that asked the API
/// to compact refuses the ask itself, in the API's own error shape: a 404 or 405 for
/// the compaction endpoint, a 400 or 422 that names the field, item or edit (as
/// "Extra inputs are not permitted", "Invalid value", "Unrecognized request argument"
/// do). A sealed item the provider could not read is no refusal of the feature.
pub(crate) fn refuses_the_ask(status: u16, body: &[u8], endpoint: bool) -> bool {
    if endpoint && matches!(status, 404 | 405 | 501) {
        return true;
    }
    if !matches!(status, 400 | 422) {
        return false;
    }
    let value: Value = serde_json::from_slice(body).unwrap_or_default();
    let code = (value.pointer("/error/code")).and_then(Value::as_str);
    if code == Some("invalid_encrypted_content") {
        return false;
    }
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    ASKS.iter().any(|ask| text.contains(ask))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_ask_in_the_apis_error_shape() {
        let vllm = br#"{"object":"error","message":"[{'type': 'extra_forbidden', 'loc': ('body', 'context_management'), 'msg': 'Extra inputs are not permitted'}]","type":"BadRequestError","code":400}"#;
        assert!(refuses_the_ask(400, vllm, false));
        let item = br#"{"error":{"message":"Invalid value: 'compaction_trigger'. Supported values are: 'message', 'function_call'.","type":"invalid_request_error","param":"input[3].type","code":"invalid_value"}}"#;
        assert!(refuses_the_ask(400, item, false));
        assert!(refuses_the_ask(404, b"Not Found", true));
        assert!(!refuses_the_ask(404, b"Not Found", false));
        let sealed = br#"{"error":{"message":"The encrypted content for item input[0] could not be verified (compaction).","code":"invalid_encrypted_content"}}"#;
        assert!(!refuses_the_ask(400, sealed, false));
        let other = br#"{"error":{"message":"Invalid 'max_output_tokens': integer below minimum value.","code":"integer_below_min_value"}}"#;
        assert!(!refuses_the_ask(400, other, false));
        assert!(!refuses_the_ask(500, item, false));
        let refusals = Refusals::default();
        assert!(refusals.remember("http://u", "m"));
        assert!(!refusals.remember("http://u", "m"));
        assert!(refusals.known("http://u", "m") && !refusals.known("http://u", "n"));
    }
}
