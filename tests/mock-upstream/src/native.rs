//! The Responses API's own compaction, as OpenAI documents it, for the scripted
//! model: a `compaction_trigger` input item, `context_management` with a
//! `compact_threshold`, and `POST /v1/responses/compact`. Each mints one `compaction`
//! item whose `encrypted_content` is opaque and sealed with the model's key; a later
//! request that carries one it did not mint is refused (`invalid_encrypted_content`),
//! and the items before a request's latest compaction item are dropped, as the API
//! drops them: the window is counted from it.
//!
//! And the Messages API's (`compact-2026-01-12`): a `compact_20260112` edit compacts
//! past its trigger into a `compaction` block that opens the reply, sealed the same
//! way, and a request is read from the message holding its latest compaction block.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use serde_json::{json, Value};

/// What a request asked of the provider's compaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// Nothing: an ordinary create.
    Nothing,
    /// A trailing `compaction_trigger`: answer with exactly one compaction item.
    Trigger,
    /// `context_management` compaction past this many input tokens: compact first.
    Threshold(u64),
    /// `POST /v1/responses/compact`: the input's user messages and one compaction item.
    Endpoint,
}

impl Asked {
    /// What `body`, posted to `path`, asked.
    pub fn of(path: &str, body: &Value, items: &[Value]) -> Self {
        if path.ends_with("/responses/compact") {
            return Asked::Endpoint;
        }
        if items
            .last()
            .is_some_and(|i| i["type"] == "compaction_trigger")
        {
            return Asked::Trigger;
        }
        let threshold = (body["context_management"].as_array().into_iter().flatten())
            .find(|entry| entry["type"] == "compaction")
            .map(|entry| entry["compact_threshold"].as_u64().unwrap_or(0));
        threshold.map_or(Asked::Nothing, Asked::Threshold)
    }
}

/// The compaction items a model minted, and what each stands for.
#[derive(Debug)]
pub struct Compactor {
    key: u64,
    serial: AtomicUsize,
    /// Each minted `encrypted_content`, to the task step it stands for.
    minted: Mutex<HashMap<String, usize>>,
    /// How many compactions it ran.
    pub compactions: AtomicUsize,
}

/// Why a request's compaction items were refused: the API's error body.
pub struct Refused(pub Value);

impl Compactor {
    /// A compactor sealing with `key`.
    pub fn new(key: u64) -> Self {
        Self {
            key,
            serial: AtomicUsize::new(0),
            minted: Mutex::new(HashMap::new()),
            compactions: AtomicUsize::new(0),
        }
    }

    /// The items the model reads of `items`: those from the latest compaction item on
    /// (it included), once every compaction item is found to be one this model minted;
    /// and the step the latest stands for (0 without one).
    pub fn window(&self, items: &[Value]) -> Result<(Vec<Value>, usize), Refused> {
        let minted = self.minted.lock().map(|m| m.clone()).unwrap_or_default();
        let mut latest = None;
        for (index, item) in items.iter().enumerate() {
            if item["type"] != "compaction" {
                continue;
            }
            let sealed = item["encrypted_content"].as_str().unwrap_or("");
            let Some(step) = minted.get(sealed) else {
                return Err(Refused(json!({"error": {
                    "message": format!("The encrypted content for item input[{index}] could not be verified. Reason: Encrypted content could not be decrypted or parsed."),
                    "type": "invalid_request_error", "param": format!("input[{index}].encrypted_content"),
                    "code": "invalid_encrypted_content"}})));
            };
            latest = Some((index, *step));
        }
        Ok(match latest {
            Some((index, step)) => (items[index..].to_vec(), step),
            None => (items.to_vec(), 0),
        })
    }

    /// One compaction item standing for the task up to `step`: its content sealed,
    /// opaque to anyone but this model.
    pub fn mint(&self, step: usize) -> Value {
        let serial = self.serial.fetch_add(1, Ordering::SeqCst);
        self.compactions.fetch_add(1, Ordering::SeqCst);
        let mut hasher = DefaultHasher::new();
        (self.key, serial, step).hash(&mut hasher);
        // Shaped like the real thing: a long Fernet-like token, not readable text.
        let sealed = format!("gAAAAAB{:016x}{}", hasher.finish(), "Qz9".repeat(200));
        if let Ok(mut minted) = self.minted.lock() {
            minted.insert(sealed.clone(), step);
        }
        json!({"id": format!("cmp_{serial:05}"), "type": "compaction", "encrypted_content": sealed,
               "created_by": "server"})
    }
}

impl Compactor {
    /// The messages the Messages API reads of `messages`: from the one holding the
    /// latest compaction block on, once every compaction block is found minted here.
    pub fn message_window(&self, messages: &[Value]) -> Result<Vec<Value>, Refused> {
        let minted = self.minted.lock().map(|m| m.clone()).unwrap_or_default();
        let mut latest = 0;
        for (index, message) in messages.iter().enumerate() {
            for block in compaction_blocks(message) {
                let sealed = block["encrypted_content"].as_str().unwrap_or("");
                if !minted.contains_key(sealed) {
                    return Err(Refused(
                        json!({"type": "error", "error": {"type": "invalid_request_error",
                        "message": format!("messages.{index}: the compaction block's encrypted_content could not be verified")}}),
                    ));
                }
                latest = index;
            }
        }
        Ok(messages[latest..].to_vec())
    }

    /// One compaction block summarising `summary`, sealed.
    pub fn mint_block(&self, summary: String) -> Value {
        let item = self.mint(0);
        json!({"type": "compaction", "content": summary, "encrypted_content": item["encrypted_content"]})
    }
}

/// The `compaction` blocks of a Messages message.
pub fn compaction_blocks(message: &Value) -> impl Iterator<Item = &Value> {
    (message["content"].as_array().into_iter().flatten()).filter(|b| b["type"] == "compaction")
}

/// How a Responses server without the API's own compaction refuses a request that
/// asks for it (`path`, `body`, its input `items`): the compaction endpoint is a 404,
/// a `context_management` field an unknown parameter, a `compaction_trigger` or
/// `compaction` item an invalid value naming it. Status, code and message.
pub fn unsupported(
    path: &str,
    body: &Value,
    items: &[Value],
) -> Option<(u16, Option<&'static str>, String)> {
    if path.ends_with("/responses/compact") {
        return Some((404, None, "Not Found".to_owned()));
    }
    if body.get("context_management").is_some() {
        let message = "Unrecognized request argument supplied: context_management";
        return Some((400, Some("unknown_parameter"), message.to_owned()));
    }
    let (index, kind) = items.iter().enumerate().find_map(|(index, item)| {
        let kind = item["type"].as_str()?;
        kind.starts_with("compaction")
            .then(|| (index, kind.to_owned()))
    })?;
    Some((400, Some("invalid_value"), format!(
        "Invalid value: '{kind}'. Supported values are: 'message', 'function_call', 'function_call_output' and 'reasoning' (input[{index}].type)."
    )))
}

/// The input-token trigger of a request's `compact_20260112` edit, when it has one.
pub fn compact_trigger(body: &Value) -> Option<u64> {
    edits(body)
        .find(|e| e["type"] == "compact_20260112")
        .map(|e| e["trigger"]["value"].as_u64().unwrap_or(150_000))
}

/// True when a request's `compact_20260112` edit pauses after the compaction.
pub fn pauses_after_compaction(body: &Value) -> bool {
    edits(body).any(|e| e["type"] == "compact_20260112" && e["pause_after_compaction"] == true)
}

/// The refusal of a `compact_20260112` trigger under the API's minimum, in its words.
pub fn trigger_refusal(body: &Value) -> Option<String> {
    let (at, edit) = edits(body)
        .enumerate()
        .find(|(_, e)| e["type"] == "compact_20260112")?;
    let value = edit["trigger"]["value"].as_u64()?;
    (value < 50_000).then(|| format!("context_management.edits.{at}.trigger.value: Input should be greater than or equal to 50000"))
}

/// True when a request's edits clear old thinking (`clear_thinking_20251015`).
pub fn clears_thinking(body: &Value) -> bool {
    edits(body).any(|e| e["type"] == "clear_thinking_20251015")
}

fn edits(body: &Value) -> impl Iterator<Item = &Value> {
    body["context_management"]["edits"]
        .as_array()
        .into_iter()
        .flatten()
}

/// The `/v1/responses/compact` output for `items`: their user messages, re-serialised
/// as `message` items, then `compaction`.
pub fn compacted_window(items: &[Value], compaction: Value) -> Vec<Value> {
    let mut output: Vec<Value> = (items.iter())
        .filter(|i| i["role"] == "user" && i["type"].as_str().is_none_or(|t| t == "message"))
        .map(|i| json!({"type": "message", "role": "user", "content": i["content"]}))
        .collect();
    output.push(compaction);
    output
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_it_minted_passes_and_the_window_starts_at_the_latest() {
        let compactor = Compactor::new(7);
        let first = compactor.mint(3);
        let second = compactor.mint(5);
        let user = json!({"role": "user", "content": "go"});
        let items = vec![
            user.clone(),
            first,
            user.clone(),
            second.clone(),
            user.clone(),
        ];
        let Ok((window, step)) = compactor.window(&items) else {
            panic!("minted items refused");
        };
        assert_eq!((window, step), (vec![second, user.clone()], 5));
        let forged = json!({"type": "compaction", "encrypted_content": "gAAAAAB-forged"});
        let Err(Refused(body)) = compactor.window(&[forged, user]) else {
            panic!("a forged item passed");
        };
        assert_eq!(body["error"]["code"], "invalid_encrypted_content");
    }
}
