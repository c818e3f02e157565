//! The text of a message that the model reads, for counting: the fields every format
//! shares (`role`, `name`, `content` as a string or parts), then each registered
//! dialect's own. A message's count is cached by its digest alone, so the text is the
//! same whichever format it came in.

use serde_json::Value;

use super::DialectKind;

/// What a media part counts as: never its base64 bytes.
pub(crate) const MEDIA_TEXT: &str = "[non-text part: counted as 85 tokens] ";

/// How many times [`MEDIA_TEXT`] stands for one media part.
const MEDIA_REPEAT: usize = 8;

/// The text of a message that the model reads: role, content, calls, ids.
pub fn message_text(message: &Value) -> String {
    let mut text = String::new();
    let mut push = |part: &str| {
        if !part.is_empty() {
            text.push_str(part);
            text.push('\n');
        }
    };
    for key in ["role", "name"] {
        push(message.get(key).and_then(Value::as_str).unwrap_or(""));
    }
    for dialect in DialectKind::ALL {
        dialect.get().push_text(message, &mut push);
    }
    push_content(message.get("content"), &mut push);
    text
}

/// Pushes `content` when it is a string or a list of parts.
pub(crate) fn push_content(content: Option<&Value>, push: &mut dyn FnMut(&str)) {
    match content {
        Some(Value::String(content)) => push(content),
        Some(Value::Array(parts)) => {
            for part in parts {
                push_part(part, push);
            }
        }
        _ => {}
    }
}

/// One content part or block: its text, a dialect's own kind, a fixed allowance for
/// media, or else its JSON as sent (server tool results, kinds handoff does not know).
pub(crate) fn push_part(part: &Value, push: &mut dyn FnMut(&str)) {
    if let Some(text) = part.get("text").and_then(Value::as_str) {
        return push(text);
    }
    if DialectKind::ALL
        .iter()
        .any(|dialect| dialect.get().push_part(part, push))
    {
        return;
    }
    push(&part.to_string());
}

/// A block of a kind the neutral form has no shape for (a document, a search result,
/// an MCP call, a code-execution result…): its kind, then every text it carries, so
/// that a strategy and a hook read what the model will read. Media bytes, signatures
/// and ids are not text.
pub(crate) fn named_block(kind: &str, block: &Value) -> String {
    let mut out = format!("[{kind}]");
    push_leaves(block, &mut out);
    out
}

/// Keys whose strings are not text a model reads as such.
const NOT_TEXT: &[&str] = &[
    "type",
    "id",
    "data",
    "signature",
    "thoughtSignature",
    "thought_signature",
    "encrypted_content",
    "media_type",
    "mimeType",
    "mime_type",
    "cache_control",
];

fn push_leaves(value: &Value, out: &mut String) {
    match value {
        Value::String(text) => {
            out.push(' ');
            out.push_str(text);
        }
        Value::Array(items) => items.iter().for_each(|item| push_leaves(item, out)),
        Value::Object(map) => map
            .iter()
            .filter(|(key, _)| !NOT_TEXT.contains(&key.as_str()))
            .for_each(|(_, inner)| push_leaves(inner, out)),
        _ => {}
    }
}

/// Pushes the allowance for one media part.
pub(crate) fn push_media(push: &mut dyn FnMut(&str)) {
    push(MEDIA_TEXT.repeat(MEDIA_REPEAT).as_str());
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_format_s_calls_and_results_are_read_and_media_is_not() {
        let chat = json!({"role": "assistant", "tool_calls": [{"id": "c1", "function": {"name": "ls", "arguments": "{\"path\": \"/tmp\"}"}}]});
        assert_eq!(
            message_text(&chat),
            "assistant\nc1\nls\n{\"path\": \"/tmp\"}\n"
        );
        let blocks = json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": "r"}]},
            {"type": "image", "source": {"data": "AAAA"}}]});
        let text = message_text(&blocks);
        assert!(text.starts_with("user\nr\n[non-text part"), "{text}");
        assert!(!text.contains("AAAA"), "{text}");
        let item = json!({"type": "function_call_output", "call_id": "c", "output": "done"});
        assert_eq!(message_text(&item), "c\ndone\n");
        // A kind no format knows counts as its JSON.
        let odd = json!({"role": "user", "content": [{"type": "web_search_tool_result", "x": 1}]});
        assert!(message_text(&odd).contains("web_search_tool_result"));
    }
}
