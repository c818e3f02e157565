//! A response's output as the log keeps it: each output item, byte for byte, as the
//! next original after the one before (clients send the items back as they got them).
//! A stream is read from its final `response.completed` (or `incomplete`/`failed`)
//! event, or, when it was cut, from the items it finished.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;

use crate::base::reply::{Assembled, CapturedReply};
use crate::dialect::StreamReply;

#[derive(Deserialize)]
struct Response<'a> {
    #[serde(default)]
    id: Option<String>,
    #[serde(default, borrow)]
    output: Vec<&'a RawValue>,
    #[serde(default)]
    usage: Option<Value>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    incomplete_details: Option<Value>,
}

/// Why the response stopped: its status, or the reason it is incomplete.
fn stop_reason(status: Option<String>, details: Option<&Value>) -> Option<String> {
    details
        .and_then(|d| d.get("reason"))
        .and_then(Value::as_str)
        .map(str::to_owned)
        .or(status)
}

/// The output items of a non-streamed response.
pub(super) fn replies_from_json(body: &[u8]) -> Result<Assembled, serde_json::Error> {
    let response: Response<'_> = crate::dialect::json_body(body)?;
    let finish = stop_reason(response.status, response.incomplete_details.as_ref());
    let count = response.output.len();
    let replies = response
        .output
        .into_iter()
        .enumerate()
        .map(|(index, item)| CapturedReply {
            message: item.to_owned(),
            // The stop reason belongs to the response: it goes on its last item.
            finish_reason: (index + 1 == count).then(|| finish.clone()).flatten(),
            choice: 0,
        })
        .collect();
    Ok(Assembled {
        replies,
        usage: response.usage,
        sequence: true,
        response_id: response.id,
        edited_upstream: false,
    })
}

/// Watches a Responses stream for its final response, and the items it finished.
#[derive(Default)]
pub(crate) struct ResponseAssembler {
    /// The `response` of the final event, re-serialised.
    last: Option<String>,
    done: BTreeMap<u64, Value>,
}

impl StreamReply for ResponseAssembler {
    fn push(&mut self, _event: &str, data: &str) {
        let Ok(event) = serde_json::from_str::<Value>(data) else {
            return;
        };
        match event.get("type").and_then(Value::as_str).unwrap_or("") {
            "response.completed" | "response.incomplete" | "response.failed" => {
                if let Some(response) = event.get("response") {
                    self.last = Some(response.to_string());
                }
            }
            "response.output_item.done" => {
                let index = event
                    .get("output_index")
                    .and_then(Value::as_u64)
                    .unwrap_or(0);
                if let Some(item) = event.get("item") {
                    self.done.insert(index, item.clone());
                }
            }
            _ => {}
        }
    }

    fn finish(self: Box<Self>) -> Assembled {
        if let Some(assembled) = self
            .last
            .as_deref()
            .and_then(|last| replies_from_json(last.as_bytes()).ok())
        {
            return assembled;
        }
        let replies = self
            .done
            .into_values()
            .filter_map(|item| serde_json::value::to_raw_value(&item).ok())
            .map(|message| CapturedReply {
                message,
                finish_reason: None,
                choice: 0,
            })
            .collect();
        Assembled {
            replies,
            sequence: true,
            ..Assembled::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn output_items_are_logged_in_order_with_the_response_id() {
        let body = br#"{"id":"resp_1","status":"completed","output":[{"type":"reasoning","id":"rs_1","summary":[]},{"type":"function_call","call_id":"c1","name":"f","arguments":"{}"}],"usage":{"input_tokens":9}}"#;
        let assembled = replies_from_json(body).unwrap();
        assert!(assembled.sequence);
        assert_eq!(assembled.response_id.as_deref(), Some("resp_1"));
        assert_eq!(assembled.replies.len(), 2);
        assert_eq!(
            assembled.replies[0].message.get(),
            r#"{"type":"reasoning","id":"rs_1","summary":[]}"#
        );
        assert_eq!(
            assembled.replies[1].finish_reason.as_deref(),
            Some("completed")
        );
    }

    #[test]
    fn a_stream_is_read_from_its_final_event_or_its_finished_items() {
        let item = json!({"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "hi"}]});
        let mut cut: Box<dyn StreamReply> = Box::<ResponseAssembler>::default();
        cut.push(
            "",
            &json!({"type": "response.output_item.done", "output_index": 0, "item": item})
                .to_string(),
        );
        let partial = cut.finish();
        assert_eq!(partial.replies.len(), 1);
        let mut whole: Box<dyn StreamReply> = Box::<ResponseAssembler>::default();
        whole.push("", &json!({"type": "response.completed", "response": {"id": "resp_2", "status": "completed", "output": [item], "usage": {"input_tokens": 5}}}).to_string());
        let done = whole.finish();
        assert_eq!(done.response_id.as_deref(), Some("resp_2"));
        assert_eq!(done.usage.unwrap()["input_tokens"], 5);
    }
}
