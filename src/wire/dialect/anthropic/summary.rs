//! Summary calls for Anthropic conversations, translated: strategies write
//! chat-completions bodies, which go out as Messages requests (system messages become
//! the top-level `system`) with the client's own `x-api-key`, `anthropic-version` and
//! `anthropic-beta`; the answer comes back as a chat completion.

use handoff_plugin_api::content_text;
use serde_json::{json, Map, Value};

/// `max_tokens` is required by the Messages API; used when a strategy sent none.
const DEFAULT_MAX_TOKENS: u64 = 4096;

/// A chat-completions body as a Messages body.
pub(crate) fn to_messages(body: &Value) -> Value {
    let mut system = Vec::new();
    let mut messages: Vec<Value> = Vec::new();
    for message in body["messages"].as_array().into_iter().flatten() {
        let text = content_text(message);
        match message["role"].as_str().unwrap_or("user") {
            "system" | "developer" => system.push(text),
            role => {
                let role = if role == "assistant" {
                    "assistant"
                } else {
                    "user"
                };
                match messages.last_mut() {
                    // Roles must alternate: a second turn of one role joins the first.
                    Some(last) if last["role"] == role => {
                        let joined =
                            format!("{}\n\n{text}", last["content"].as_str().unwrap_or(""));
                        last["content"] = Value::String(joined);
                    }
                    _ => messages.push(json!({"role": role, "content": text})),
                }
            }
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), body["model"].clone());
    out.insert(
        "max_tokens".into(),
        json!(body["max_tokens"].as_u64().unwrap_or(DEFAULT_MAX_TOKENS)),
    );
    if !system.is_empty() {
        out.insert("system".into(), json!(system.join("\n\n")));
    }
    out.insert("messages".into(), Value::Array(messages));
    Value::Object(out)
}

/// A Messages answer as a chat completion; errors pass through as they are.
pub(crate) fn to_completion(status: u16, body: Value) -> Value {
    if !(200..300).contains(&status) || body.get("content").is_none() {
        return body;
    }
    let text = content_text(&body);
    let finish = match body["stop_reason"].as_str() {
        Some("end_turn" | "stop_sequence") => "stop",
        Some("max_tokens") => "length",
        Some(other) => other,
        None => "stop",
    };
    let usage = &body["usage"];
    let field = |name: &str| usage[name].as_u64().unwrap_or(0);
    let prompt = field("input_tokens")
        + field("cache_read_input_tokens")
        + field("cache_creation_input_tokens");
    json!({
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}],
        // The cache's share kept as OpenAI spells it (and Anthropic's writes as it
        // does), so the summary call is billed at its cache prices.
        "usage": {"prompt_tokens": prompt, "completion_tokens": field("output_tokens"), "total_tokens": prompt + field("output_tokens"),
                  "prompt_tokens_details": {"cached_tokens": field("cache_read_input_tokens")},
                  "cache_creation_input_tokens": field("cache_creation_input_tokens")},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_request_round_trips_through_the_messages_shape() {
        let chat = json!({"model": "claude", "max_tokens": 500, "stream": false, "messages": [
            {"role": "system", "content": "You write handoffs."},
            {"role": "user", "content": "history"}]});
        let messages = to_messages(&chat);
        assert_eq!(messages["system"], "You write handoffs.");
        assert_eq!(
            messages["messages"],
            json!([{"role": "user", "content": "history"}])
        );
        assert_eq!(messages["max_tokens"], 500);
        let answer = json!({"model": "claude", "content": [{"type": "text", "text": "## Goal"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 7, "output_tokens": 3, "cache_read_input_tokens": 2}});
        let completion = to_completion(200, answer);
        assert_eq!(completion["choices"][0]["message"]["content"], "## Goal");
        assert_eq!(completion["choices"][0]["finish_reason"], "stop");
        assert_eq!(completion["usage"]["prompt_tokens"], 9);
        let error =
            json!({"type": "error", "error": {"type": "overloaded_error", "message": "busy"}});
        assert_eq!(to_completion(529, error.clone()), error);
    }
}
