//! Anthropic's prompt cache is marked by the client: a `cache_control` on a block is a
//! breakpoint, the provider caches the prefix through it, and a request may carry at
//! most four. handoff adds one of its own in two places, beside the client's and never
//! instead of them: on the turn it appends to a continued summary call, and after the
//! handoff pair of a compacted view.

use serde_json::{json, Value};

/// Cache breakpoints a request may carry.
pub(crate) const MAX_BREAKPOINTS: usize = 4;

/// The key of a breakpoint, quoted as it appears in a body. Inside a JSON string the
/// quotes would be escaped, so message text that names the field is not counted.
const MARK: &str = "\"cache_control\"";

/// Breakpoints in `raw` (a message or a list, as JSON text). A `"cache_control": null`
/// counts too: an overcount only ever leaves handoff's own mark out.
pub(crate) fn marks_in(raw: &str) -> usize {
    raw.matches(MARK).count()
}

/// Adds the breakpoints inside `value` to `marks`.
pub(crate) fn count_marks(value: &Value, marks: &mut usize) {
    match value {
        Value::Object(fields) => {
            if fields.get("cache_control").is_some_and(|c| !c.is_null()) {
                *marks += 1;
            }
            fields.values().for_each(|v| count_marks(v, marks));
        }
        Value::Array(items) => items.iter().for_each(|v| count_marks(v, marks)),
        _ => {}
    }
}

/// True when a request whose client placed `marks` breakpoints takes one of
/// handoff's: the client caches (one at least), and the limit leaves room.
pub(crate) fn room_for_one(marks: usize) -> bool {
    (1..MAX_BREAKPOINTS).contains(&marks)
}

/// `message` with a breakpoint on its last content block (string content becomes one
/// text block); `None` when it has no content to mark.
pub(crate) fn marked(message: &Value) -> Option<Value> {
    let mut message = message.clone();
    let content = message.get_mut("content")?;
    if let Value::String(text) = content {
        *content = json!([{"type": "text", "text": std::mem::take(text)}]);
    }
    let block = content.as_array_mut()?.last_mut()?.as_object_mut()?;
    block.insert("cache_control".into(), json!({"type": "ephemeral"}));
    Some(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_are_counted_by_key_and_never_inside_text() {
        let raw = r#"{"role":"user","content":[{"type":"text","text":"set \"cache_control\" here","cache_control":{"type":"ephemeral"}}]}"#;
        assert_eq!(marks_in(raw), 1);
        let value: Value = serde_json::from_str(raw).unwrap();
        let mut marks = 0;
        count_marks(&value, &mut marks);
        assert_eq!(marks, 1);
    }

    #[test]
    fn a_mark_goes_on_the_last_block_and_only_beside_the_clients_own() {
        let handoff = json!({"role": "assistant", "content": "## Goal\nShip it."});
        let with = marked(&handoff).unwrap();
        assert_eq!(
            with["content"],
            json!([{"type": "text", "text": "## Goal\nShip it.", "cache_control": {"type": "ephemeral"}}])
        );
        let blocks = json!({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        let with = marked(&blocks).unwrap();
        assert!(with["content"][0].get("cache_control").is_none());
        assert_eq!(with["content"][1]["cache_control"]["type"], "ephemeral");
        assert!(marked(&json!({"role": "user"})).is_none());
        assert!(!room_for_one(0), "a client that does not cache gets none");
        assert!(room_for_one(1) && room_for_one(3));
        assert!(!room_for_one(4), "the limit is the API's");
    }
}
