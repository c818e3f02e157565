//! Summary calls for Anthropic conversations, translated: strategies write
//! chat-completions bodies, which go out as Messages requests (system messages become
//! the top-level `system`) with the client's own `x-api-key`, `anthropic-version` and
//! `anthropic-beta`; the answer comes back as a chat completion.

use handoff_plugin_api::content_text;
use serde_json::{json, Map, Value};

use super::cache::{count_marks, room_for_one};

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

/// Appends `text` as a user turn: a block of the last message when that is the user's
/// (tool results), so roles still alternate and every block before it stays where the
/// cache has it; a new user message otherwise.
pub(crate) fn append_user_text(list: &mut Vec<Value>, text: &str) {
    let block = json!({"type": "text", "text": text});
    if let Some(last) = list.last_mut().filter(|m| m["role"] == "user") {
        match &mut last["content"] {
            Value::Array(blocks) => {
                blocks.push(block);
                return;
            }
            Value::String(first) => {
                let first = json!({"type": "text", "text": std::mem::take(first)});
                last["content"] = json!([first, block]);
                return;
            }
            _ => {}
        }
    }
    list.push(json!({"role": "user", "content": [block]}));
}

/// A continued conversation's body, its user turn appended, readied for one reply of
/// `max_tokens`: extended thinking keeps its budget on top. A client that caches gets
/// a breakpoint on the appended turn, where the provider looks back for the prefix its
/// own breakpoints wrote (and finds it unless the history's last unit alone spans more
/// blocks than the lookback).
pub(crate) fn settle_continued(body: &mut Map<String, Value>, max_tokens: u64) {
    crate::dialect::continued::not_streamed(body);
    let thinking = body
        .get("thinking")
        .filter(|t| t["type"] == "enabled")
        .and_then(|t| t["budget_tokens"].as_u64())
        .unwrap_or(0);
    body.insert("max_tokens".into(), (max_tokens + thinking).into());
    let mut marks = 0;
    for field in ["tools", "system", "messages"] {
        if let Some(value) = body.get(field) {
            count_marks(value, &mut marks);
        }
    }
    if !room_for_one(marks) {
        return;
    }
    let last = body
        .get_mut("messages")
        .and_then(Value::as_array_mut)
        .and_then(|list| list.last_mut())
        .and_then(|turn| turn.get_mut("content"))
        .and_then(Value::as_array_mut)
        .and_then(|blocks| blocks.last_mut())
        .and_then(Value::as_object_mut);
    if let Some(block) = last {
        block.insert("cache_control".into(), json!({"type": "ephemeral"}));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_continued_call_keeps_roles_alternating_and_marks_only_beside_the_clients_marks() {
        let mut list = vec![
            json!({"role": "user", "content": "q"}),
            json!({"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {}}]}),
            json!({"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "r"}]}),
        ];
        append_user_text(&mut list, "summarise");
        assert_eq!(list.len(), 3, "appended to the trailing user turn");
        assert_eq!(list[2]["content"][1]["text"], "summarise");
        list.push(json!({"role": "assistant", "content": "a"}));
        append_user_text(&mut list, "again");
        assert_eq!(
            list[4],
            json!({"role": "user", "content": [{"type": "text", "text": "again"}]})
        );

        let mark = json!({"type": "ephemeral"});
        let body = |system: Value| -> Map<String, Value> {
            let mut body = Map::new();
            body.insert("system".into(), system);
            body.insert("messages".into(), json!(list.clone()));
            body.insert("stream".into(), json!(true));
            body.insert(
                "thinking".into(),
                json!({"type": "enabled", "budget_tokens": 1000}),
            );
            body
        };
        // The client caches: the appended turn gets a mark; the limit keeps thinking's.
        let mut cached = body(json!([{"type": "text", "text": "s", "cache_control": mark}]));
        settle_continued(&mut cached, 800);
        assert_eq!(cached["stream"], false);
        assert_eq!(cached["max_tokens"], 1800);
        assert_eq!(cached["messages"][4]["content"][0]["cache_control"], mark);
        // A client that does not cache gets none, and one with four marks none more.
        let mut plain = body(json!("s"));
        settle_continued(&mut plain, 800);
        assert!(plain["messages"][4]["content"][0]
            .get("cache_control")
            .is_none());
        let four = (0..4)
            .map(|_| json!({"type": "text", "text": "s", "cache_control": mark}))
            .collect::<Vec<_>>();
        let mut full = body(json!(four));
        settle_continued(&mut full, 800);
        assert!(full["messages"][4]["content"][0]
            .get("cache_control")
            .is_none());
    }

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
