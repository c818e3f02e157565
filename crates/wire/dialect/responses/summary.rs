//! Summary calls for Responses conversations, translated: strategies write
//! chat-completions bodies, which go to the Responses API (system messages become
//! `instructions`, nothing is stored); the answer comes back as a chat completion.

use handoff_plugin_api::content_text;
use serde_json::{json, Map, Value};

/// A chat-completions body as a Responses body.
pub(crate) fn to_responses(body: &Value) -> Value {
    let mut instructions = Vec::new();
    let mut input = Vec::new();
    for message in body["messages"].as_array().into_iter().flatten() {
        let text = content_text(message);
        match message["role"].as_str().unwrap_or("user") {
            "system" | "developer" => instructions.push(text),
            "assistant" => input.push(json!({"role": "assistant", "content": [{"type": "output_text", "text": text, "annotations": []}]})),
            _ => input.push(json!({"role": "user", "content": text})),
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), body["model"].clone());
    if !instructions.is_empty() {
        out.insert("instructions".into(), json!(instructions.join("\n\n")));
    }
    out.insert("input".into(), Value::Array(input));
    if let Some(max) = body["max_tokens"].as_u64() {
        out.insert("max_output_tokens".into(), json!(max));
    }
    out.insert("store".into(), json!(false));
    Value::Object(out)
}

/// The text of a response's output messages.
fn output_text(body: &Value) -> String {
    body["output"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|item| item["type"] == "message")
        .flat_map(|item| item["content"].as_array().into_iter().flatten())
        .filter_map(|part| part["text"].as_str())
        .collect::<Vec<_>>()
        .join("")
}

/// A response as a chat completion; errors pass through as they are.
pub(crate) fn to_completion(status: u16, body: Value) -> Value {
    if !(200..300).contains(&status) || body.get("output").is_none() {
        return body;
    }
    let finish = match body["status"].as_str() {
        Some("incomplete") => match body
            .pointer("/incomplete_details/reason")
            .and_then(Value::as_str)
        {
            Some("max_output_tokens") => "length",
            Some(other) => other,
            None => "length",
        },
        Some("completed") | None => "stop",
        Some(other) => other,
    };
    let usage = &body["usage"];
    let prompt = usage["input_tokens"].as_u64().unwrap_or(0);
    let completion = usage["output_tokens"].as_u64().unwrap_or(0);
    json!({
        "object": "chat.completion",
        "model": body["model"],
        "choices": [{"index": 0, "message": {"role": "assistant", "content": output_text(&body)}, "finish_reason": finish}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
                  "prompt_tokens_details": {"cached_tokens": usage["input_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0)}},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_summary_request_round_trips_through_the_responses_shape() {
        let chat = json!({"model": "gpt-5", "max_tokens": 700, "messages": [
            {"role": "system", "content": "You write handoffs."},
            {"role": "user", "content": "history"}]});
        let request = to_responses(&chat);
        assert_eq!(request["instructions"], "You write handoffs.");
        assert_eq!(
            request["input"],
            json!([{"role": "user", "content": "history"}])
        );
        assert_eq!(request["max_output_tokens"], 700);
        assert_eq!(request["store"], false);
        let answer = json!({"model": "gpt-5", "status": "completed", "output": [
            {"type": "reasoning", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "## Goal"}]}],
            "usage": {"input_tokens": 11, "output_tokens": 4}});
        let completion = to_completion(200, answer);
        assert_eq!(completion["choices"][0]["message"]["content"], "## Goal");
        assert_eq!(completion["choices"][0]["finish_reason"], "stop");
        assert_eq!(completion["usage"]["prompt_tokens"], 11);
        let cut = json!({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}, "output": []});
        assert_eq!(
            to_completion(200, cut)["choices"][0]["finish_reason"],
            "length"
        );
    }
}
