//! The replies a served compaction answers with, as each API documents them: the
//! Responses API's `compaction` item, its response object (JSON or the event stream
//! a streamed create gets), and the `/v1/responses/compact` object.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{json, Value};

use crate::dialect::DialectKind;

/// Who `created_by` names on the items handoff mints.
const CREATOR: &str = "handoff";

/// An id of `kind` (`cmp`, `resp`) for the item or response carrying `handle`: the
/// same handle always gets the same id.
fn id_for(kind: &str, handle: &str) -> String {
    let digest = blake3::hash(format!("{kind}\0{handle}").as_bytes());
    format!("{kind}_{}", &digest.to_hex()[..32])
}

/// Seconds since the epoch, as `created_at`.
fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The Responses `compaction` item holding `handle`.
pub(crate) fn compaction_item(handle: &str) -> Value {
    json!({"id": id_for("cmp", handle), "type": "compaction",
           "encrypted_content": handle, "created_by": CREATOR})
}

/// The usage of the summary calls a served compaction made, in the Responses API's
/// shape: `calls` is their sum, in the chat shape every summary call's usage is
/// recorded in.
pub(crate) fn responses_usage(calls: &Value) -> Value {
    let billed = DialectKind::OpenAiChat
        .get()
        .billed(calls)
        .unwrap_or_default();
    let input = billed.input + billed.cache_read + billed.cache_write;
    json!({"input_tokens": input, "input_tokens_details": {"cached_tokens": billed.cache_read},
           "output_tokens": billed.output, "output_tokens_details": {"reasoning_tokens": 0},
           "total_tokens": input + billed.output})
}

/// The response a create answers with when its trailing `compaction_trigger` was
/// served: exactly one `compaction` item.
pub(crate) fn triggered(model: &str, handle: &str, usage: Value) -> Value {
    json!({"id": id_for("resp", handle), "object": "response", "created_at": now(),
           "status": "completed", "error": null, "incomplete_details": null,
           "model": model, "output": [compaction_item(handle)], "usage": usage})
}

/// The `/v1/responses/compact` answer: the input's user messages, as `message` items,
/// then the `compaction` item.
pub(crate) fn compacted(input: &[Value], handle: &str, usage: Value) -> Value {
    let mut output: Vec<Value> = (input.iter())
        .filter(|item| {
            item["role"] == "user" && item["type"].as_str().is_none_or(|t| t == "message")
        })
        .map(|item| json!({"type": "message", "role": "user", "content": item["content"]}))
        .collect();
    output.push(compaction_item(handle));
    json!({"id": id_for("resp", handle), "object": "response.compaction",
           "created_at": now(), "output": output, "usage": usage})
}

/// The readable text of a handoff message (a string, or its text blocks or parts).
pub(crate) fn text_of(message: &Value) -> String {
    match &message["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => (parts.iter())
            .filter_map(|part| part["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The Messages `compaction` block holding `handle`, with the handoff's `summary`
/// readable in its `content`.
pub(crate) fn compaction_block(summary: &str, handle: &str) -> Value {
    json!({"type": "compaction", "content": summary, "encrypted_content": handle})
}

/// The Messages reply that is the compaction alone (`pause_after_compaction`, an
/// on-demand `compaction`): it stops for it, and its usage is the compaction's.
pub(crate) fn paused(model: &str, block: Value, (input, output): (u64, u64)) -> Value {
    let id = format!(
        "msg_{}",
        &id_for("cmp", block["encrypted_content"].as_str().unwrap_or(""))[4..]
    );
    json!({"id": id, "type": "message", "role": "assistant", "model": model,
           "content": [block], "stop_reason": "compaction", "stop_sequence": null,
           "usage": {"input_tokens": 0, "output_tokens": 0,
                     "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                     "iterations": [{"type": "compaction", "input_tokens": input, "output_tokens": output}]}})
}

/// The event stream of a Messages reply whose blocks are compactions, as the API
/// streams one: `message_start`, each block as `compaction_delta`, `message_delta`
/// with the stop reason and usage, `message_stop`.
pub(crate) fn message_stream(message: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let mut event = |data: Value| {
        let kind = data["type"].as_str().unwrap_or("").to_owned();
        out.extend_from_slice(format!("event: {kind}\ndata: {data}\n\n").as_bytes());
    };
    let mut opening = message.clone();
    opening["content"] = json!([]);
    opening["stop_reason"] = Value::Null;
    event(json!({"type": "message_start", "message": opening}));
    let blocks = message["content"].as_array().cloned().unwrap_or_default();
    for (index, block) in blocks.iter().enumerate() {
        compaction_block_events(index, block)
            .into_iter()
            .for_each(&mut event);
    }
    event(json!({"type": "message_delta",
                 "delta": {"stop_reason": message["stop_reason"], "stop_sequence": null},
                 "usage": message["usage"]}));
    event(json!({"type": "message_stop"}));
    out
}

/// The events that stream a Messages `compaction` block at `index`, as the API
/// streams one: its start with no content, one `compaction_delta` carrying the whole
/// of it, its stop.
pub(crate) fn compaction_block_events(index: usize, block: &Value) -> [Value; 3] {
    let mut start = block.clone();
    start["content"] = Value::Null;
    if let Some(start) = start.as_object_mut() {
        start.remove("encrypted_content");
    }
    let mut delta = block.clone();
    delta["type"] = json!("compaction_delta");
    [
        json!({"type": "content_block_start", "index": index, "content_block": start}),
        json!({"type": "content_block_delta", "index": index, "delta": delta}),
        json!({"type": "content_block_stop", "index": index}),
    ]
}

/// The summary calls' usage (`calls`, in the chat shape) as input and output tokens.
pub(crate) fn summary_tokens(calls: &Value) -> (u64, u64) {
    let billed = DialectKind::OpenAiChat
        .get()
        .billed(calls)
        .unwrap_or_default();
    (
        billed.input + billed.cache_read + billed.cache_write,
        billed.output,
    )
}

/// The event stream of `response`, as a streamed create gets it: `response.created`
/// and `response.in_progress` with no output yet, each item's `output_item.added`
/// and `.done`, then `response.completed` with the whole response.
pub(crate) fn event_stream(response: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    let mut sequence = 0u64;
    let mut event = |mut data: Value| {
        let kind = data["type"].as_str().unwrap_or("").to_owned();
        data["sequence_number"] = json!(sequence);
        sequence += 1;
        out.extend_from_slice(format!("event: {kind}\ndata: {data}\n\n").as_bytes());
    };
    let mut opening = response.clone();
    opening["status"] = json!("in_progress");
    opening["output"] = json!([]);
    opening["usage"] = Value::Null;
    event(json!({"type": "response.created", "response": opening.clone()}));
    event(json!({"type": "response.in_progress", "response": opening}));
    let items = response["output"].as_array().cloned().unwrap_or_default();
    for (index, item) in items.into_iter().enumerate() {
        event(json!({"type": "response.output_item.added", "output_index": index, "item": item}));
        event(json!({"type": "response.output_item.done", "output_index": index, "item": item}));
    }
    event(json!({"type": "response.completed", "response": response}));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_served_trigger_streams_one_compaction_item_between_created_and_completed() {
        let usage = responses_usage(&json!({"prompt_tokens": 900, "completion_tokens": 120}));
        assert_eq!(usage["total_tokens"], 1020);
        let response = triggered("gpt-5", "handoff-compaction.v1.e30.x", usage);
        assert_eq!(response["output"].as_array().map(Vec::len), Some(1));
        assert_eq!(response["output"][0]["type"], "compaction");
        let stream = String::from_utf8(event_stream(&response)).unwrap();
        let kinds: Vec<&str> = (stream.lines())
            .filter_map(|line| line.strip_prefix("event: "))
            .collect();
        assert_eq!(
            kinds,
            [
                "response.created",
                "response.in_progress",
                "response.output_item.added",
                "response.output_item.done",
                "response.completed"
            ]
        );
        let last: Value = (stream.lines().rev())
            .find_map(|line| line.strip_prefix("data: "))
            .and_then(|data| serde_json::from_str(data).ok())
            .unwrap_or_default();
        assert_eq!(last["sequence_number"], 4);
        assert_eq!(last["response"]["usage"]["input_tokens"], 900);
    }

    #[test]
    fn the_compact_endpoint_keeps_the_users_words_as_message_items() {
        let input = [
            json!({"role": "user", "content": "fix the bug"}),
            json!({"type": "function_call", "call_id": "c", "name": "sh", "arguments": "{}"}),
            json!({"type": "message", "role": "assistant", "content": "done"}),
        ];
        let answer = compacted(&input, "handoff-compaction.v1.e30.x", json!({}));
        assert_eq!(answer["object"], "response.compaction");
        assert_eq!(
            answer["output"][0],
            json!({"type": "message", "role": "user", "content": "fix the bug"})
        );
        assert_eq!(answer["output"][1]["type"], "compaction");
        assert_eq!(answer["output"].as_array().map(Vec::len), Some(2));
    }
}
