//! Google's Gemini API as strictly as the real one checks a conversation, with its own
//! error texts: roles, non-empty parts, function-call turns answered by the very next
//! turn with as many responses, and (for thinking models) the signature of each step's
//! first function call in the current turn. What the real API takes passes: unknown
//! part fields, consecutive turns of one role, responses with ids of the client's own.

use serde_json::{json, Value};

use crate::Reply;

/// The path of a generating call: the model, and whether it streams.
pub fn generating(path: &str) -> Option<(&str, bool)> {
    let (rest, stream) = match path.strip_suffix(":generateContent") {
        Some(rest) => (rest, false),
        None => (path.strip_suffix(":streamGenerateContent")?, true),
    };
    let at = rest.rfind("/models/")? + "/models/".len();
    Some((&rest[at..], stream))
}

/// The API's error answer.
pub fn error(code: u16, status: &str, message: &str) -> Reply {
    Reply::Json {
        status: http::StatusCode::from_u16(code).unwrap_or(http::StatusCode::BAD_REQUEST),
        body: json!({"error": {"code": code, "message": message, "status": status}}),
    }
}

/// The overflow answer, as the API words it.
pub fn overflow(input: u64, window: u64) -> Reply {
    error(
        400,
        "INVALID_ARGUMENT",
        &format!("The input token count ({input}) exceeds the maximum number of tokens allowed ({window})."),
    )
}

fn parts(content: &Value) -> &[Value] {
    content["parts"].as_array().map_or(&[], Vec::as_slice)
}

/// True for a user turn of the person, not only of function responses.
pub fn is_person_turn(content: &Value) -> bool {
    content["role"] != "model"
        && parts(content)
            .iter()
            .any(|p| p.get("functionResponse").is_none())
}

/// Checks `contents` as the API does; `signed(name, args)` is the signature the model
/// gave that call, if it gave one.
pub fn check(contents: &[Value], signed: &dyn Fn(&Value) -> Option<String>) -> Result<(), String> {
    if contents.is_empty() {
        return Err("* GenerateContentRequest.contents: contents is not specified".into());
    }
    let mut pending = 0usize;
    for (index, content) in contents.iter().enumerate() {
        let role = content["role"].as_str().unwrap_or("user");
        if !matches!(role, "user" | "model") {
            return Err(format!(
                "Please use a valid role: user, model. (contents[{index}].role: {role})"
            ));
        }
        if parts(content).is_empty() {
            return Err(format!("* GenerateContentRequest.contents[{index}].parts: contents.parts must not be empty."));
        }
        let calls = parts(content)
            .iter()
            .filter(|p| p.get("functionCall").is_some())
            .count();
        let responses = parts(content)
            .iter()
            .filter(|p| p.get("functionResponse").is_some())
            .count();
        if pending > 0 && (role != "user" || responses != pending) {
            return Err("Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.".into());
        }
        if pending == 0 && responses > 0 {
            return Err("Please ensure that function response turn comes immediately after a function call turn.".into());
        }
        pending = if role == "model" { calls } else { 0 };
    }
    if pending > 0 {
        return Err("Please ensure that function call turn comes immediately after a user turn or after a function response turn.".into());
    }
    // The current turn: after the last turn of the person.
    let start = contents
        .iter()
        .rposition(is_person_turn)
        .map_or(0, |at| at + 1);
    for (index, content) in contents.iter().enumerate().skip(start) {
        let Some((position, first)) = parts(content)
            .iter()
            .enumerate()
            .find(|(_, p)| p.get("functionCall").is_some())
        else {
            continue;
        };
        let Some(want) = signed(&first["functionCall"]) else {
            continue;
        };
        if first["thoughtSignature"].as_str() != Some(want.as_str()) {
            let name = first["functionCall"]["name"].as_str().unwrap_or("");
            return Err(format!("Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call `default_api:{name}` , position {}. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details. (contents[{index}])", position + 1));
        }
    }
    Ok(())
}

/// A reply's chunks, in order, as the streamed API sends them (and the whole reply as
/// its last chunk's fields for `generateContent`).
pub fn chunks(model: &str, parts: &[Value], input: u64, serial: usize) -> Vec<Value> {
    let usage = json!({"promptTokenCount": input, "candidatesTokenCount": 30, "totalTokenCount": input + 30});
    let id = format!("resp-{serial:05}");
    let last = parts.len().saturating_sub(1);
    parts
        .iter()
        .enumerate()
        .map(|(at, part)| {
            let mut candidate = json!({"content": {"parts": [part], "role": "model"}, "index": 0});
            let mut chunk = json!({"candidates": [], "modelVersion": model, "responseId": id});
            if at == last {
                candidate["finishReason"] = json!("STOP");
            }
            chunk["candidates"] = json!([candidate]);
            chunk["usageMetadata"] = if at == last {
                usage.clone()
            } else {
                json!({"promptTokenCount": input, "totalTokenCount": input})
            };
            chunk
        })
        .collect()
}

/// The whole reply of `generateContent`.
pub fn whole(model: &str, parts: &[Value], input: u64, serial: usize) -> Value {
    json!({
        "candidates": [{"content": {"parts": parts, "role": "model"}, "finishReason": "STOP", "index": 0}],
        "usageMetadata": {"promptTokenCount": input, "candidatesTokenCount": 30, "totalTokenCount": input + 30},
        "modelVersion": model, "responseId": format!("resp-{serial:05}"),
    })
}

/// SSE events (`alt=sse`), as the API frames them.
pub fn sse_events(chunks: &[Value]) -> Vec<String> {
    chunks
        .iter()
        .map(|chunk| format!("data: {chunk}\r\n\r\n"))
        .collect()
}

/// The JSON-array stream (no `alt=sse`).
pub fn array_stream(chunks: &[Value]) -> String {
    let items: Vec<String> = chunks.iter().map(Value::to_string).collect();
    format!("[{}]", items.join(",\r\n"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_checks_follow_the_api() {
        let call = json!({"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {}}, "thoughtSignature": "s1"}]});
        let answer = json!({"role": "user", "parts": [{"functionResponse": {"id": "c1", "name": "read_file", "response": {"output": "x"}}}]});
        let ask = json!({"role": "user", "parts": [{"text": "go"}]});
        let signed = |_: &Value| Some("s1".to_owned());
        check(&[ask.clone(), call.clone(), answer.clone()], &signed).unwrap();
        assert!(check(&[ask.clone(), call.clone(), ask.clone()], &signed).is_err());
        assert!(check(&[ask.clone(), answer.clone()], &signed).is_err());
        let mut unsigned = call.clone();
        unsigned["parts"][0]
            .as_object_mut()
            .unwrap()
            .remove("thoughtSignature");
        assert!(check(&[ask.clone(), unsigned.clone(), answer.clone()], &signed).is_err());
        // An earlier turn's calls need no signature.
        check(&[ask.clone(), unsigned, answer, ask.clone()], &signed).unwrap();
    }
}
