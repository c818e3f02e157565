//! `compaction.pin`: messages a client re-sends before its history as standing context
//! (aider's files message and its acknowledgement) stay verbatim in every view, and an
//! edit of one in place continues the conversation. On the in-process harness.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use serde_json::{json, Value};

use super::compaction::{agent_requests, strict, user};
use crate::testing::Harness;

const PIN: &str = "[compaction.pin]\n[[compaction.pin.rules]]\nrole = \"user\"\npattern = \"^I have \\\\*added these files to the chat\\\\*\"\nwith_reply = true\n";

fn preamble(version: &str) -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "Act as an expert software developer."}),
        json!({"role": "user", "content": format!("I have *added these files to the chat* so you can go ahead and edit them.\n\nnotes.txt\n```\nFILES-{version} the answer is 42\n```")}),
        json!({"role": "assistant", "content": "Ok, any changes I propose will be to those files."}),
    ]
}

async fn ask(proxy: &Harness, messages: &[Value]) -> Value {
    // No conversation header: the id is derived, as for a client that sends none.
    let body = json!({"model": "strict", "messages": messages}).to_string();
    let got = proxy
        .post(
            "/v1/chat/completions",
            &[("authorization", "Bearer sk-x")],
            body.as_bytes(),
        )
        .await;
    assert_eq!(got.status, 200, "{}", got.text());
    got.json()["choices"][0]["message"].clone()
}

#[tokio::test]
async fn a_pinned_files_message_stays_in_every_view_and_its_edit_continues_the_conversation() {
    let (_strict, mock) = strict(Duration::ZERO).await;
    let models = "[models.\"strict\"]\ncontext_window = 4096\n";
    let proxy = Harness::start(&mock.url(), &format!("{models}{PIN}")).await;
    let mut history: Vec<Value> = Vec::new();
    for n in 0..14 {
        // Half-way, the user changes the file: the files message changes in place.
        let version = if n < 7 { "v1" } else { "v2" };
        history.push(user(n, 300));
        let mut messages = preamble(version);
        messages.extend(history.iter().cloned());
        let reply = ask(&proxy, &messages).await;
        history.push(
            json!({"role": "assistant", "content": reply["content"].as_str().unwrap_or("ok")}),
        );
        if reply["tool_calls"].is_array() {
            history.pop();
            history.push(reply.clone());
            let id = reply["tool_calls"][0]["id"].as_str().unwrap().to_owned();
            history.push(json!({"role": "tool", "tool_call_id": id, "content": "done"}));
        }
    }
    let conversations = proxy.conversations().await;
    assert_eq!(
        conversations.len(),
        1,
        "the edit continued it: {conversations:?}"
    );
    let id = conversations[0].as_str().to_owned();
    assert!(!proxy.records(&id).await.is_empty(), "it compacted");
    // Every view the model saw opens with the system message and the files pair.
    for sent in agent_requests(&mock) {
        let text = sent["messages"][1]["content"].as_str().unwrap_or("");
        assert!(text.starts_with("I have *added these files"), "{sent}");
        assert!(sent["messages"][2]["content"]
            .as_str()
            .unwrap()
            .starts_with("Ok,"));
    }
    // The handoff never summarised the files message.
    for record in proxy.records(&id).await {
        let handoff = record.handoff.to_string();
        assert!(!handoff.contains("FILES-v"), "{handoff}");
    }
    let last = agent_requests(&mock).pop().unwrap();
    assert!(
        last.to_string().contains("FILES-v2"),
        "the edited files are what the model sees"
    );
}
