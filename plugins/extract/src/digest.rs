//! A long JSON tool result as one line of its fields: every scalar field whole, each long
//! string and long array shortened where it stands, with its size said. Cutting the raw
//! text head and tail keeps the first field and the end of the last one; a tool's facts
//! (a price, an id, a status) sit in the short fields between.

use serde_json::{Map, Value};

/// Characters of a string value kept, head and tail, before it is shortened.
const STRING_CHARS: usize = 48;

/// Items of a long array shown: its first ones and its last.
const ARRAY_HEAD: usize = 3;

/// Arrays up to this many items are shown whole (each item digested).
const ARRAY_WHOLE: usize = 6;

/// How deep nested objects are opened; deeper ones are sized, not shown.
const DEPTH: usize = 2;

/// `text` digested when it is a JSON object or array; `None` for anything else.
pub(crate) fn digest(text: &str) -> Option<String> {
    let value: Value = serde_json::from_str(text.trim()).ok()?;
    matches!(value, Value::Object(_) | Value::Array(_)).then(|| render(&value, 0))
}

fn render(value: &Value, depth: usize) -> String {
    match value {
        Value::String(text) => string(text),
        Value::Array(items) => array(items, depth),
        Value::Object(fields) => object(fields, depth),
        scalar => scalar.to_string(),
    }
}

fn string(text: &str) -> String {
    let chars = text.chars().count();
    if chars <= STRING_CHARS {
        return Value::from(text).to_string();
    }
    let head: String = text.chars().take(STRING_CHARS * 2 / 3).collect();
    let tail: String = text.chars().skip(chars - STRING_CHARS / 3).collect();
    let cut = format!("{head}…{tail}");
    format!("{} ({chars} chars)", Value::from(cut))
}

fn array(items: &[Value], depth: usize) -> String {
    if items.len() <= ARRAY_WHOLE {
        let shown: Vec<String> = items.iter().map(|v| render(v, depth + 1)).collect();
        return format!("[{}]", shown.join(", "));
    }
    let mut shown: Vec<String> = items[..ARRAY_HEAD]
        .iter()
        .map(|v| render(v, depth + 1))
        .collect();
    shown.push("…".into());
    if let Some(last) = items.last() {
        shown.push(render(last, depth + 1));
    }
    format!("[{} items: {}]", items.len(), shown.join(", "))
}

fn object(fields: &Map<String, Value>, depth: usize) -> String {
    if depth >= DEPTH && !fields.is_empty() {
        let plural = if fields.len() == 1 { "" } else { "s" };
        return format!("{{{} field{plural}}}", fields.len());
    }
    let shown: Vec<String> = fields
        .iter()
        .map(|(key, value)| {
            format!(
                "{}: {}",
                Value::from(key.as_str()),
                render(value, depth + 1)
            )
        })
        .collect();
    format!("{{{}}}", shown.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalars_stay_whole_and_long_parts_are_sized_where_they_stand() {
        let cities: Vec<String> = (0..400).map(|i| format!("City {i}")).collect();
        let text = serde_json::json!({
            "distance": 750.0,
            "intermediaryCities": cities,
            "note": "x".repeat(500),
            "ok": true,
            "order": {"id": 12446, "meta": {"deep": {"deeper": 1}}},
        })
        .to_string();
        let line = digest(&text).unwrap();
        assert!(line.contains("\"distance\": 750.0"), "{line}");
        assert!(
            line.contains("[400 items: \"City 0\", \"City 1\", \"City 2\", …, \"City 399\"]"),
            "{line}"
        );
        assert!(line.contains("(500 chars)"), "{line}");
        assert!(line.contains("\"ok\": true"), "{line}");
        assert!(line.contains("\"id\": 12446"), "{line}");
        assert!(line.contains("\"meta\": {1 field}"), "{line}");
        assert!(line.len() < 400, "{line}");
    }

    #[test]
    fn text_that_is_not_json_is_not_digested() {
        assert_eq!(digest("total 42\nfile.rs"), None);
        assert_eq!(digest("17"), None);
    }
}
