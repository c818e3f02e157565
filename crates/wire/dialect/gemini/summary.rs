//! Summary calls for Gemini conversations, translated: strategies write
//! chat-completions bodies, which go out as `generateContent` requests (system
//! messages become `systemInstruction`, roles `user` and `model`) to the summary
//! model's own path, with the client's key; the answer comes back as a chat completion.

use handoff_plugin_api::content_text;
use serde_json::{json, Map, Value};

/// A chat-completions body as a `generateContent` body (the model is in the path).
pub(crate) fn to_gemini(body: &Value) -> Value {
    let mut system = Vec::new();
    let mut contents: Vec<Value> = Vec::new();
    for message in body["messages"].as_array().into_iter().flatten() {
        let text = content_text(message);
        match message["role"].as_str().unwrap_or("user") {
            "system" | "developer" => system.push(text),
            role => {
                let role = if role == "assistant" { "model" } else { "user" };
                match contents.last_mut() {
                    // One turn per role: a second message of a role joins the first.
                    Some(last) if last["role"] == role => {
                        if let Some(parts) = last["parts"].as_array_mut() {
                            parts.push(json!({"text": text}));
                        }
                    }
                    _ => contents.push(json!({"role": role, "parts": [{"text": text}]})),
                }
            }
        }
    }
    let mut out = Map::new();
    out.insert("contents".into(), Value::Array(contents));
    if !system.is_empty() {
        out.insert(
            "systemInstruction".into(),
            json!({"parts": [{"text": system.join("\n\n")}]}),
        );
    }
    let mut config = Map::new();
    if let Some(most) = body["max_tokens"]
        .as_u64()
        .or(body["max_completion_tokens"].as_u64())
    {
        config.insert("maxOutputTokens".into(), json!(most));
    }
    if let Some(temperature) = body.get("temperature").filter(|t| t.is_number()) {
        config.insert("temperature".into(), temperature.clone());
    }
    if !config.is_empty() {
        out.insert("generationConfig".into(), Value::Object(config));
    }
    Value::Object(out)
}

/// A `generateContent` answer as a chat completion; errors pass through as they are.
pub(crate) fn to_completion(status: u16, body: Value) -> Value {
    let Some(candidate) = body["candidates"]
        .get(0)
        .filter(|_| (200..300).contains(&status))
    else {
        return body;
    };
    let text: Vec<&str> = candidate["content"]["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|part| part["thought"] != true)
        .filter_map(|part| part["text"].as_str())
        .collect();
    let finish = match candidate["finishReason"].as_str() {
        Some("MAX_TOKENS") => "length",
        Some("SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT") => "content_filter",
        _ => "stop",
    };
    let usage = &body["usageMetadata"];
    let field = |name: &str| usage[name].as_u64().unwrap_or(0);
    let completion = field("candidatesTokenCount") + field("thoughtsTokenCount");
    json!({
        "object": "chat.completion",
        "model": body["modelVersion"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text.concat()}, "finish_reason": finish}],
        "usage": {"prompt_tokens": field("promptTokenCount"), "completion_tokens": completion,
                  "total_tokens": field("promptTokenCount") + completion,
                  "prompt_tokens_details": {"cached_tokens": field("cachedContentTokenCount")}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_request_round_trips_through_the_gemini_shape() {
        let chat = json!({"model": "gemini-2.5-flash", "max_tokens": 500, "messages": [
            {"role": "system", "content": "You write handoffs."},
            {"role": "user", "content": "history"},
            {"role": "user", "content": "more"}]});
        let body = to_gemini(&chat);
        assert_eq!(
            body,
            json!({"contents": [{"role": "user", "parts": [{"text": "history"}, {"text": "more"}]}],
                "systemInstruction": {"parts": [{"text": "You write handoffs."}]},
                "generationConfig": {"maxOutputTokens": 500}})
        );
        let answer = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "weighing", "thought": true}, {"text": "## Goal"}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 7, "candidatesTokenCount": 3}, "modelVersion": "gemini-2.5-flash"});
        let completion = to_completion(200, answer);
        assert_eq!(completion["choices"][0]["message"]["content"], "## Goal");
        assert_eq!(completion["usage"]["prompt_tokens"], 7);
        let error =
            json!({"error": {"code": 429, "message": "busy", "status": "RESOURCE_EXHAUSTED"}});
        assert_eq!(to_completion(429, error.clone()), error);
    }
}
