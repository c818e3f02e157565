//! A compaction handle handoff minted, carried to another process: a Codex-like
//! session asks a Responses upstream without the API's own compaction to compact
//! (handoff serves it), then goes on from the handle, on whichever proxy is asked.

use serde_json::{json, Value};

use super::client::{request, send, Whole};
use super::Proxy;

/// The config of a proxy that serves the Responses API's compaction for `gpt-mock`
/// (a 6,000-token window counted as bytes/4).
pub const SERVED: &str = "[upstream]\nnative_compaction = \"serve\"\n\
    [models.\"gpt-mock\"]\ncontext_window = 6000\ntokenizer = \"estimate\"\n\
    [compaction]\nprepare_at = 0\n";

const KEY: &str = "Bearer sk-handle-replicas";

fn user(text: &str) -> Value {
    json!({"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
}

async fn post(proxy: &Proxy, input: Vec<Value>) -> Whole {
    let body = json!({"model": "gpt-mock", "instructions": "You are Codex.", "input": input, "store": false});
    send(request(
        "POST",
        &format!("{}/v1/responses", proxy.url()),
        &[("authorization", KEY), ("content-type", "application/json")],
        body.to_string(),
    ))
    .await
}

/// Plants four facts, then asks `proxy` to compact: the `compaction` item it answered.
pub async fn mint(proxy: &Proxy) -> Value {
    let filler: String = (0..300).map(|i| format!("w{i} ")).collect();
    let mut input = vec![user("fix the failing test")];
    for turn in 0..4 {
        input.push(user(&format!("FACT-{turn:03} {filler}")));
        input.push(json!({"type": "message", "role": "assistant",
                          "content": [{"type": "output_text", "text": "noted"}]}));
    }
    input.push(json!({"type": "compaction_trigger"}));
    let got = post(proxy, input).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let item = got.json()["output"][0].clone();
    assert_eq!(item["type"], "compaction", "{item}");
    item
}

/// Goes on from `item` on `proxy`, as Codex does after a compaction.
pub async fn go_on(proxy: &Proxy, item: &Value) -> Whole {
    let mut item = item.clone();
    if let Some(fields) = item.as_object_mut() {
        fields.remove("id");
        fields.remove("created_by");
    }
    post(
        proxy,
        vec![
            user("fix the failing test"),
            item,
            user("what were the facts?"),
        ],
    )
    .await
}
