//! What a Gemini content carries in its parts: text, thoughts, function calls and
//! responses, media; and the neutral (chat-completions) form strategies read.

use serde_json::{json, Value};

use super::names::{
    self, CODE_EXECUTION_RESULT, EXECUTABLE_CODE, FILE_DATA, FUNCTION_CALL, FUNCTION_RESPONSE,
    INLINE_DATA, THOUGHT_SIGNATURE,
};
use crate::dialect::text::{named_block, push_media};
use crate::dialect::Markers;

/// The raw-JSON markers of Gemini contents. A model content with calls or thoughts
/// comes back in another form (Gemini CLI gives calls ids and drops thoughts), so a
/// restarted tracker keeps its text to know it again.
pub(crate) const MARKERS: Markers = Markers {
    paired: &[
        "\"functionCall\"",
        "\"functionResponse\"",
        "\"function_call\"",
        "\"function_response\"",
    ],
    echoed: &["\"parts\""],
    indexed: &["\"functionCall\"", "\"function_call\"", "\"thought\""],
};

/// The parts of a content, or of the `content` a pinned `systemInstruction` stands in.
pub(super) fn parts(message: &Value) -> &[Value] {
    message
        .get("parts")
        .or_else(|| message.get("content").and_then(|c| c.get("parts")))
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The text of each part the model reads; media by allowance.
pub(super) fn push_text(message: &Value, push: &mut dyn FnMut(&str)) {
    for part in parts(message) {
        push_part(part, push);
    }
}

/// One part's text, for counting.
pub(super) fn push_part(part: &Value, push: &mut dyn FnMut(&str)) -> bool {
    if let Some(text) = part.get("text").and_then(Value::as_str) {
        push(text);
    } else if let Some(call) = names::get(part, FUNCTION_CALL) {
        push(call.get("name").and_then(Value::as_str).unwrap_or(""));
        push(&call.get("args").map_or_else(String::new, Value::to_string));
    } else if let Some(answer) = names::get(part, FUNCTION_RESPONSE) {
        push(answer.get("name").and_then(Value::as_str).unwrap_or(""));
        push(
            &answer
                .get("response")
                .map_or_else(String::new, Value::to_string),
        );
    } else if names::get(part, INLINE_DATA).is_some() || names::get(part, FILE_DATA).is_some() {
        push_media(push);
    } else if let Some(code) =
        names::get(part, EXECUTABLE_CODE).or(names::get(part, CODE_EXECUTION_RESULT))
    {
        push(&code.to_string());
    } else {
        return false;
    }
    true
}

/// Each `functionResponse`'s `response`, as a JSON string or its `output`/`content`.
pub(super) fn shorten_tool_results(
    message: &mut Value,
    shorten: &mut dyn FnMut(&mut Value) -> bool,
) -> bool {
    let Some(parts) = message.get_mut("parts").and_then(Value::as_array_mut) else {
        return false;
    };
    let mut changed = false;
    for response in parts
        .iter_mut()
        .filter_map(|part| names::get_mut(part, FUNCTION_RESPONSE))
        .filter_map(|answer| answer.get_mut("response"))
        .filter_map(Value::as_object_mut)
    {
        // Gemini CLI puts a tool's text in `output`; others in `content` or `result`.
        for key in ["output", "content", "result"] {
            if let Some(slot) = response.get_mut(key) {
                changed |= shorten(slot);
            }
        }
    }
    changed
}

/// True for a content with a `functionCall` part.
pub(super) fn calls_tools(message: &Value) -> bool {
    parts(message)
        .iter()
        .any(|part| names::get(part, FUNCTION_CALL).is_some())
}

/// The text of a function response for the neutral form.
fn response_text(response: &Value) -> String {
    for key in ["output", "content", "result"] {
        if let Some(text) = response.get(key).and_then(Value::as_str) {
            return text.to_owned();
        }
    }
    response.to_string()
}

/// A Gemini content in the chat shape strategies read: text joined, `functionCall`s as
/// `tool_calls` and each `functionResponse` as a `tool` message, both named by the
/// function (the ids are the client's own, and a call may have none); thoughts are the
/// model's, not the conversation's, and are left out.
pub(super) fn neutral(message: &Value) -> Vec<Value> {
    let role = match message.get("role").and_then(Value::as_str) {
        Some("model") => "assistant",
        Some("system") => "system",
        _ => "user",
    };
    let mut out = Vec::new();
    let mut text: Vec<String> = Vec::new();
    let mut calls = Vec::new();
    for part in parts(message) {
        if part.get("thought").and_then(Value::as_bool) == Some(true) {
            continue;
        }
        if let Some(piece) = part.get("text").and_then(Value::as_str) {
            text.push(piece.to_owned());
        } else if let Some(call) = names::get(part, FUNCTION_CALL) {
            let name = call.get("name").cloned().unwrap_or(Value::Null);
            calls.push(json!({
                "id": name,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": call.get("args").map_or_else(|| "{}".to_owned(), Value::to_string),
                },
            }));
        } else if let Some(answer) = names::get(part, FUNCTION_RESPONSE) {
            out.push(json!({
                "role": "tool",
                "tool_call_id": answer.get("name").cloned().unwrap_or(Value::Null),
                "content": answer.get("response").map_or_else(String::new, response_text),
            }));
        } else if let Some((kind, block)) = part
            .as_object()
            .and_then(|map| map.iter().find(|(k, _)| !names::is(k, THOUGHT_SIGNATURE)))
        {
            // Media is bytes; the rest (code, its output…) is text a model reads.
            if names::is(kind, INLINE_DATA) || names::is(kind, FILE_DATA) {
                text.push(format!("[{kind}]"));
            } else {
                text.push(named_block(kind, block));
            }
        }
    }
    if role == "assistant" {
        let mut neutral = json!({"role": "assistant", "content": text.join("\n")});
        if !calls.is_empty() {
            neutral["tool_calls"] = Value::Array(calls);
        }
        out.push(neutral);
    } else if !text.is_empty() {
        out.push(json!({"role": role, "content": text.join("\n")}));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neutral_form_names_calls_and_results_by_function() {
        let model = json!({"role": "model", "parts": [
            {"text": "thinking it over", "thought": true},
            {"text": "checking"},
            {"functionCall": {"name": "read_file", "args": {"path": "a"}}, "thoughtSignature": "c2ln"}]});
        let out = neutral(&model);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["content"], "checking");
        assert_eq!(out[0]["tool_calls"][0]["id"], "read_file");
        assert_eq!(
            out[0]["tool_calls"][0]["function"]["arguments"],
            r#"{"path":"a"}"#
        );
        let user = json!({"role": "user", "parts": [
            {"functionResponse": {"id": "x1", "name": "read_file", "response": {"output": "found"}}},
            {"text": "thanks"}]});
        let out = neutral(&user);
        assert_eq!(
            out[0],
            json!({"role": "tool", "tool_call_id": "read_file", "content": "found"})
        );
        assert_eq!(out[1], json!({"role": "user", "content": "thanks"}));
    }

    #[test]
    fn counting_reads_calls_results_and_the_system_instruction() {
        let mut text = Vec::new();
        let system = json!({"role": "system", "content": {"parts": [{"text": "be brief"}]}});
        push_text(&system, &mut |t| text.push(t.to_owned()));
        let call = json!({"role": "model", "parts": [{"functionCall": {"name": "ls", "args": {"d": "/"}}}]});
        push_text(&call, &mut |t| text.push(t.to_owned()));
        assert_eq!(text, ["be brief", "ls", r#"{"d":"/"}"#]);
    }
}
