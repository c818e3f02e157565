//! Echo forms: how real clients re-send a logged message in another form than the one
//! logged, across the wire formats handoff knows.
//!
//! Some messages come back from clients in another form than the one logged, and no
//! single digest rule can keep every logged digest while merging them (`{"a": 1}` and
//! `{"a":1}` were each logged somewhere, with their own digests). So a message digest
//! never changes, and [`echo_digest`] names the class of forms that count as one
//! message; the tracker maps an unknown form onto the logged one through it. Its
//! rules, each forced by a real client:
//! - `content` that is `null`, `""` or absent on an assistant message with tool calls is
//!   one form: the openai SDK rebuilds a streamed tool-call reply with `content: null`
//!   where the stream opened with `"content": ""`, and `model_dump()` writes `null`.
//! - tool-call `arguments` that are valid JSON compare by their parsed value: agents
//!   such as opencode parse the model's `{"a": 1}` and send it back as `{"a":1}`.
//! - a tool call's `index` is left out: stream accumulators (the openai SDK's
//!   `ChatCompletionStreamState`, hand-written ones) keep the delta's index on the call.
//!   Its position in `tool_calls` still counts.
//! - `cache_control` on any content block is left out: Claude Code moves its cache
//!   breakpoint to the newest block on every request, so each message is sent with it
//!   once and without it afterwards. A conversation's identity ignores it too
//!   ([`identity_digest`]).
//! - content that is one plain text block is the same as that text as a string: the
//!   Messages API reads a string as one text block, and Claude Code sends its
//!   mid-conversation system message first as a block with a breakpoint, then as a
//!   string.
//! - text content is the same with or without whitespace around it: aider sends a
//!   reply back stripped of the newline or space it ended with.
//!
//! - a Responses item is the same without the fields the API adds to output items
//!   (`status` on every item, `annotations` and `logprobs` on `output_text` parts),
//!   and a message item is the same without `"type": "message"`: the Vercel AI SDK
//!   re-sends a `function_call` without `status`, and an assistant message as
//!   `{"role", "content": [{"type": "output_text", "text"}], "id"}`.
//! - an `item_reference` is the item it names ([`reference_digest`]): the AI SDK
//!   re-sends each earlier reasoning item as a reference when the API stores items.
//!
//! The turn being asked has forms of its own ([`turn_forms`]): a client may append a
//! transient reminder to the request's last user message and send that message
//! without it once it is history. aider adds its edit-format rules (or "Reply in
//! English.") after a blank line, on the last message only.

use serde_json::Value;

use crate::base::digest::{message_digest, tagged_digest, MessageDigest};
use crate::dialect::objects::REFERENCE_TYPE;

/// The digest of the forms of `message` that clients echo as the same message: for
/// an assistant message with tool calls, or any message with content blocks; `None`
/// for a message with only one form.
pub fn echo_digest(message: &Value) -> Option<MessageDigest> {
    let map = message.as_object()?;
    let kind = map.get("type").and_then(Value::as_str);
    if kind == Some(REFERENCE_TYPE) {
        return map.get("id").and_then(Value::as_str).and_then(id_digest);
    }
    if let Some(parts) = map.get("parts").and_then(Value::as_array) {
        return gemini_echo(map, parts);
    }
    let stripped = without_output_fields(map, kind);
    let map = stripped.as_ref().unwrap_or(map);
    if kind.is_some() && map.contains_key("type") {
        // A call, an output, reasoning: an item of its own kind.
        return Some(tagged_digest(
            b"handoff/echo/item/v1",
            &Value::Object(map.clone()),
        ));
    }
    let calls = map
        .get("tool_calls")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
        .filter(|_| map.get("role").and_then(Value::as_str) == Some("assistant"));
    let content = map
        .get("content")
        .is_some_and(|c| c.is_array() || c.is_string());
    if calls.is_none() && !content {
        return None;
    }
    let mut echo = map.clone();
    if let Some(calls) = calls {
        if echo.get("content").and_then(Value::as_str) == Some("") {
            echo.remove("content");
        }
        let calls = calls.iter().map(echo_tool_call).collect();
        echo.insert("tool_calls".into(), Value::Array(calls));
    }
    if let Some(content) = echo.get_mut("content") {
        strip_annotations(content);
        if let Some(text) = lone_text(content) {
            *content = Value::String(text);
        }
        if let Value::String(text) = content {
            let trimmed = text.trim();
            if trimmed.len() != text.len() {
                *content = Value::String(trimmed.to_owned());
            }
        }
    }
    Some(tagged_digest(b"handoff/echo/v3", &Value::Object(echo)))
}

/// The echo form of a Gemini content (`parts`): a `model` content is the same without
/// its thought parts, with adjacent text parts joined into the first (whose other
/// fields it keeps), with a text part's `thoughtSignature` left out, and with each
/// function call's `id` left out. Gemini CLI sends a streamed reply back so: it drops
/// thoughts, joins the text pieces and gives each call an id of its own.
fn gemini_echo(map: &serde_json::Map<String, Value>, parts: &[Value]) -> Option<MessageDigest> {
    // A user content comes back as it was sent: one form, no digest to take.
    if map.get("role").and_then(Value::as_str) != Some("model") {
        return None;
    }
    let text_only = |part: &Value| {
        part.as_object().is_some_and(|p| {
            p.get("text").is_some_and(Value::is_string)
                && p.keys()
                    .all(|k| matches!(k.as_str(), "text" | "thoughtSignature"))
        })
    };
    let mut echoed: Vec<Value> = Vec::with_capacity(parts.len());
    for part in parts {
        if part.get("thought").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        if text_only(part) {
            let piece = part.get("text").and_then(Value::as_str).unwrap_or("");
            if let Some(Value::String(text)) = echoed
                .last_mut()
                .filter(|last| last.get("functionCall").is_none())
                .and_then(|last| last.get_mut("text"))
            {
                text.push_str(piece);
                continue;
            }
            echoed.push(serde_json::json!({"text": piece}));
            continue;
        }
        let mut part = part.clone();
        if let Some(call) = part.get_mut("functionCall").and_then(Value::as_object_mut) {
            call.remove("id");
        }
        echoed.push(part);
    }
    let mut echo = map.clone();
    echo.insert("parts".into(), Value::Array(echoed));
    Some(tagged_digest(
        b"handoff/echo/gemini/v1",
        &Value::Object(echo),
    ))
}

/// The fields of a Responses item a client may leave out or add when it sends the
/// item back, and the item is still the one logged:
/// - `status`: output only ("populated when items are returned via API");
/// - `id`: always on an output item, optional on an input one (the Vercel AI SDK
///   re-sends a `function_call` without it);
/// - `created_by`: output only, on the items the server makes (`compaction`);
/// - `internal_chat_message_metadata_passthrough`: Codex's own bookkeeping, added to
///   the items it echoes (its turn id, the kinds of its content parts).
///
/// An item sent back by reference (`item_reference`) is matched by its id, apart.
const ITEM_OUTPUT_FIELDS: &[&str] = &[
    "status",
    "id",
    "created_by",
    "internal_chat_message_metadata_passthrough",
];

/// The output-only fields of an `output_text` part.
const TEXT_OUTPUT_FIELDS: &[&str] = &["annotations", "logprobs"];

/// A Responses item without its output-only fields, and a message item without its
/// `type`: `None` when it has none of them.
fn without_output_fields(
    map: &serde_json::Map<String, Value>,
    kind: Option<&str>,
) -> Option<serde_json::Map<String, Value>> {
    let message = kind == Some("message") && map.contains_key("role");
    let texts = |map: &serde_json::Map<String, Value>| {
        map.get("content")
            .and_then(Value::as_array)
            .is_some_and(|parts| {
                parts
                    .iter()
                    .any(|p| p.get("type").and_then(Value::as_str) == Some("output_text"))
            })
    };
    if !(message || texts(map) || ITEM_OUTPUT_FIELDS.iter().any(|f| map.contains_key(*f))) {
        return None;
    }
    let mut item = map.clone();
    for field in ITEM_OUTPUT_FIELDS {
        item.remove(*field);
    }
    if message {
        item.remove("type");
    }
    if let Some(Value::Array(parts)) = item.get_mut("content") {
        for part in parts.iter_mut().filter_map(Value::as_object_mut) {
            if part.get("type").and_then(Value::as_str) == Some("output_text") {
                for field in TEXT_OUTPUT_FIELDS {
                    part.remove(*field);
                }
            }
        }
    }
    Some(item)
}

/// The echo digest an `item_reference` to `message` has: for a Responses item with an
/// `id` (not itself a reference), that of a reference to it; else `None`.
pub fn reference_digest(message: &Value) -> Option<MessageDigest> {
    let map = message.as_object()?;
    let kind = map.get("type").and_then(Value::as_str)?;
    if kind == REFERENCE_TYPE {
        return None;
    }
    map.get("id").and_then(Value::as_str).and_then(id_digest)
}

/// The digest of a reference to the item with `id`; none for an empty or oversized id.
fn id_digest(id: &str) -> Option<MessageDigest> {
    (!id.is_empty() && id.len() <= 256)
        .then(|| tagged_digest(b"handoff/echo/reference/v1", &Value::String(id.to_owned())))
}

/// How many blank-line cuts of a turn are remembered: a reminder follows the user's
/// own text, so the cuts nearest the start are the ones that can end it.
const TURN_CUTS: usize = 16;

/// The echo digests of the shorter forms a client may re-send of `message` when it was
/// the turn being asked: a user message whose text (a string, or one plain text block)
/// is cut at each of its first blank lines, trailing whitespace dropped. Empty for any
/// other message.
pub fn turn_forms(message: &Value) -> Vec<MessageDigest> {
    let Some(map) = message.as_object() else {
        return Vec::new();
    };
    if map.get("role").and_then(Value::as_str) != Some("user") {
        return Vec::new();
    }
    let text = match map.get("content") {
        Some(Value::String(text)) => text.clone(),
        Some(content) => match lone_text(content) {
            Some(text) => text,
            None => return Vec::new(),
        },
        None => return Vec::new(),
    };
    let mut form = map.clone();
    text.match_indices("\n\n")
        .map(|(at, _)| text[..at].trim_end())
        .filter(|cut| !cut.is_empty())
        .take(TURN_CUTS)
        .filter_map(|cut| {
            form.insert("content".into(), Value::String(cut.to_owned()));
            echo_digest(&Value::Object(form.clone()))
        })
        .collect()
}

/// True when a content block of `message` (or of a block's own content) carries a
/// per-request annotation such as `cache_control`.
pub(crate) fn is_annotated(message: &Value) -> bool {
    fn any(content: &Value) -> bool {
        content.as_array().is_some_and(|blocks| {
            blocks.iter().any(|block| {
                block.get("cache_control").is_some() || block.get("content").is_some_and(any)
            })
        })
    }
    message.get("content").is_some_and(any)
}

/// The digest that names a conversation by its opening message: the digest of the
/// message without its annotations, so that moving a cache breakpoint never starts
/// another conversation. For an unannotated message that is its own digest, so
/// conversations keep the ids they always had.
pub fn identity_digest(message: &Value, digest: MessageDigest) -> MessageDigest {
    if !is_annotated(message) {
        return digest;
    }
    let mut plain = message.clone();
    if let Some(content) = plain.get_mut("content") {
        strip_annotations(content);
    }
    message_digest(&plain)
}

/// The text of content that is exactly one plain text block.
fn lone_text(content: &Value) -> Option<String> {
    let [block] = content.as_array()?.as_slice() else {
        return None;
    };
    let map = block.as_object()?;
    let plain = map.len() == 2 && map.get("type").and_then(Value::as_str) == Some("text");
    plain.then(|| map.get("text")?.as_str().map(str::to_owned))?
}

/// Removes `cache_control` from every block of `content`, nested contents included.
fn strip_annotations(content: &mut Value) {
    if let Value::Array(blocks) = content {
        for block in blocks {
            if let Value::Object(map) = block {
                map.remove("cache_control");
                if let Some(inner) = map.get_mut("content") {
                    strip_annotations(inner);
                }
            }
        }
    }
}

fn echo_tool_call(call: &Value) -> Value {
    let Some(map) = call.as_object() else {
        return call.clone();
    };
    let mut call = map.clone();
    call.remove("index");
    if let Some(Value::Object(function)) = call.get_mut("function") {
        let parsed = function
            .get("arguments")
            .and_then(Value::as_str)
            .and_then(|text| serde_json::from_str::<Value>(text).ok());
        if let Some(parsed) = parsed {
            // Tagged, so parsed arguments never equal a string that looks like them.
            function.insert("arguments".into(), serde_json::json!({"parsed": parsed}));
        }
    }
    Value::Object(call)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_turn_re_sent_without_its_reminder_is_one_of_its_forms() {
        let asked = serde_json::json!({"role": "user", "content": "Fix it.\n\nKeep tests.\n\nReply in English.\n"});
        let forms = super::turn_forms(&asked);
        for history in ["Fix it.", "Fix it.\n\nKeep tests."] {
            let plain = serde_json::json!({"role": "user", "content": history});
            let echo = echo_digest(&plain).unwrap();
            assert!(forms.contains(&echo), "{history:?}");
        }
        let block =
            serde_json::json!({"role": "user", "content": [{"type": "text", "text": "Fix it."}]});
        assert!(forms.contains(&echo_digest(&block).unwrap()));
        let other = serde_json::json!({"role": "user", "content": "Fix"});
        assert!(!forms.contains(&echo_digest(&other).unwrap()));
        // Only the user's turn has these forms.
        let reply = serde_json::json!({"role": "assistant", "content": "a\n\nb"});
        assert!(super::turn_forms(&reply).is_empty());
    }

    #[test]
    fn a_moved_cache_breakpoint_is_one_message_and_one_conversation() {
        let marked = serde_json::json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r", "cache_control": {"type": "ephemeral"}}]},
            {"type": "text", "text": "q", "cache_control": {"type": "ephemeral"}}]});
        let plain = serde_json::json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r"}]},
            {"type": "text", "text": "q"}]});
        // Logged digests never change; the echo class and the identity merge the forms.
        assert_ne!(message_digest(&marked), message_digest(&plain));
        assert_eq!(echo_digest(&marked), echo_digest(&plain));
        assert!(echo_digest(&plain).is_some());
        assert_eq!(
            identity_digest(&marked, message_digest(&marked)),
            identity_digest(&plain, message_digest(&plain))
        );
        // An unannotated opening keeps the identity it always had.
        assert_eq!(
            identity_digest(&plain, message_digest(&plain)),
            message_digest(&plain)
        );
        let other =
            serde_json::json!({"role": "user", "content": [{"type": "text", "text": "other"}]});
        assert_ne!(echo_digest(&other), echo_digest(&plain));
    }

    #[test]
    fn echoed_tool_call_forms_share_an_echo_digest_and_keep_their_own() {
        let logged = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1, \"b\": [1, 2]}"}}
        ]});
        let echoes = [
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"b\":[1,2],\"a\":1}"}}
            ]}),
            json!({"role": "assistant", "tool_calls": [
                {"index": 0, "id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1,\"b\":[1,2]}"}}
            ]}),
        ];
        for echo in &echoes {
            assert_eq!(echo_digest(&logged), echo_digest(echo), "{echo}");
            assert_ne!(message_digest(&logged), message_digest(echo));
        }
        let other = json!({"role": "assistant", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":2,\"b\":[1,2]}"}}
        ]});
        assert_ne!(echo_digest(&logged), echo_digest(&other));
        let text = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not json"}}
        ]});
        let spaced = json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "not  json"}}
        ]});
        assert_ne!(
            echo_digest(&text),
            echo_digest(&spaced),
            "invalid JSON compares as text"
        );
        // A string and the same text as one block are one form; other texts are not.
        assert_eq!(
            echo_digest(&json!({"role": "user", "content": "hi"})),
            echo_digest(&json!({"role": "user", "content": [{"type": "text", "text": "hi"}]}))
        );
        assert_ne!(
            echo_digest(&json!({"role": "user", "content": "hi"})),
            echo_digest(&json!({"role": "assistant", "content": "hi"}))
        );
        assert_eq!(echo_digest(&json!({"role": "user"})), None);
    }

    #[test]
    fn a_responses_item_sent_back_without_its_output_fields_or_with_a_clients_own_is_one_item() {
        let logged = json!({"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f",
                            "arguments": "{}", "status": "completed"});
        let echoes = [
            // The Vercel AI SDK: no id, no status.
            json!({"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}),
            // Codex: its own metadata added, keys in its own order.
            json!({"arguments": "{}", "name": "f", "call_id": "c1", "type": "function_call", "id": "fc_1",
                   "internal_chat_message_metadata_passthrough": {"turn_id": "t1"}}),
        ];
        for echo in &echoes {
            assert_eq!(echo_digest(&logged), echo_digest(echo), "{echo}");
        }
        let other =
            json!({"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"});
        assert_ne!(echo_digest(&logged), echo_digest(&other));
        // A provider's compaction item: its opaque content is the item.
        let compaction = json!({"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAA",
                                "created_by": "server"});
        let sent_back = json!({"type": "compaction", "encrypted_content": "gAAA"});
        assert_eq!(echo_digest(&compaction), echo_digest(&sent_back));
        let forged = json!({"type": "compaction", "encrypted_content": "gAAB"});
        assert_ne!(echo_digest(&compaction), echo_digest(&forged));
    }
}
