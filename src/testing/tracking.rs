//! Conversation tracking and the log of originals, on the in-process harness: a hundred
//! conversations at once kept apart, regenerations and edits as branches that replay,
//! and the admin API's pages of conversations; the audit read as functions.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use mock_upstream::{MockUpstream, Reply};
use serde_json::{json, Value};

use super::{Answer, Harness};

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

/// Posts a chat body with `headers` (no credential).
async fn post(proxy: &Harness, headers: &[(&str, &str)], body: &Value) -> Answer {
    let answer = proxy
        .post("/v1/chat/completions", headers, body.to_string().as_bytes())
        .await;
    assert_eq!(answer.status, 200, "{}", answer.text());
    answer
}

/// `audit list --json`: one summary per conversation.
async fn conversations(proxy: &Harness) -> Vec<Value> {
    let text = proxy
        .audit_all(|audit, out| audit.list(None, true, out))
        .await;
    text.lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect()
}

/// `audit replay ID [--branch TIP]`.
async fn replay(proxy: &Harness, id: &str, branch: Option<&str>) -> Vec<Value> {
    let branch = branch.map(str::to_owned);
    let text = proxy
        .audit(id, move |audit, id, tenant, out| {
            let sink = &mut std::io::sink();
            audit.replay(id, Some(tenant), branch.as_deref(), None, out, sink)
        })
        .await;
    serde_json::from_str(&text).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_parallel_conversations_are_kept_apart() {
    let mock = MockUpstream::with(|req| {
        let body = req.json();
        let last = body["messages"]
            .as_array()
            .and_then(|m| m.last())
            .cloned()
            .unwrap_or_default();
        Reply::chat_text(&format!("echo {}", last["content"].as_str().unwrap_or("")))
    })
    .await;
    let proxy = Harness::start(&mock.url(), "").await;

    let conversation = |n: usize| {
        let proxy = &proxy;
        async move {
            let header = format!("conv-{n}");
            let mut messages = vec![user(&format!("hello from {n}"))];
            for turn in 0..3 {
                // Half name their conversation; the other half are named by their opening.
                let headers: Vec<(&str, &str)> = match n % 2 {
                    0 => vec![("x-handoff-conversation-id", header.as_str())],
                    _ => vec![],
                };
                let body = json!({"model": "gpt-4o", "messages": messages});
                let got = post(proxy, &headers, &body).await;
                messages.push(got.json()["choices"][0]["message"].clone());
                messages.push(user(&format!("turn {turn} of {n}")));
            }
        }
    };
    futures_util::future::join_all((0..100).map(conversation)).await;

    let conversations = conversations(&proxy).await;
    assert_eq!(conversations.len(), 100);
    for summary in &conversations {
        assert_eq!(summary["requests"], 3, "{summary}");
        assert_eq!(summary["branches"], 1, "{summary}");
        let id = summary["id"].as_str().unwrap();
        let replay = replay(&proxy, id, None).await;
        // 3 requests: user, reply, user, reply, user, reply.
        assert_eq!(replay.len(), 6, "{id}");
        let owner = replay[0]["content"]
            .as_str()
            .unwrap()
            .trim_start_matches("hello from ")
            .to_owned();
        if let Some(n) = id.strip_prefix("conv-") {
            assert_eq!(n, owner);
        }
        for message in &replay {
            let text = message["content"].as_str().unwrap();
            assert!(
                text.ends_with(&format!(" {owner}")) || text.contains(&format!("of {owner}")),
                "{id}: {text}"
            );
        }
    }
    // A problem fails the audit, and the test with it.
    proxy
        .audit_all(|audit, out| audit.verify(None, None, out))
        .await;
}

#[tokio::test]
async fn regenerations_and_edits_become_branches_and_stay_replayable() {
    let serial = Arc::new(AtomicUsize::new(0));
    let mock = MockUpstream::with(move |_| {
        Reply::chat_text(&format!("reply {}", serial.fetch_add(1, Ordering::SeqCst)))
    })
    .await;
    let proxy = Harness::start(&mock.url(), "").await;
    let id = [("x-handoff-conversation-id", "branchy")];

    let first = vec![
        user("one"),
        json!({"role": "assistant", "content": "ok"}),
        user("two"),
    ];
    post(&proxy, &id, &json!({"model": "m", "messages": first})).await;
    // Regenerate: the very same request again gets a different reply.
    post(&proxy, &id, &json!({"model": "m", "messages": first})).await;
    // Edit the first message.
    let edited = vec![
        user("ONE (edited)"),
        json!({"role": "assistant", "content": "ok"}),
        user("two"),
    ];
    post(&proxy, &id, &json!({"model": "m", "messages": edited})).await;

    let summary = &conversations(&proxy).await[0];
    assert_eq!(summary["branches"], 3, "{summary}");
    assert_eq!(
        summary["messages"],
        3 + 1 + 1 + 3 + 1,
        "nothing may be logged twice: {summary}"
    );

    let detail = proxy.get("/handoff/conversations/branchy").await;
    assert_eq!(detail.status, 200);
    let tips: Vec<String> = detail.json()["branch_tips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["tip"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(tips.len(), 3);

    let contents = |replay: Vec<Value>| -> Vec<String> {
        replay
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_owned())
            .collect()
    };
    let on = |tip: Option<usize>| replay(&proxy, "branchy", tip.map(|t| tips[t].as_str()));
    assert_eq!(contents(on(Some(0)).await), ["one", "ok", "two", "reply 0"]);
    assert_eq!(contents(on(Some(1)).await), ["one", "ok", "two", "reply 1"]);
    assert_eq!(
        contents(on(Some(2)).await),
        ["ONE (edited)", "ok", "two", "reply 2"]
    );
    assert_eq!(
        contents(on(None).await),
        ["ONE (edited)", "ok", "two", "reply 2"]
    );
}

#[tokio::test]
async fn admin_lists_conversations_in_pages() {
    let mock = MockUpstream::replying(Reply::chat_text("ok")).await;
    let proxy = Harness::start(&mock.url(), "").await;
    for n in 0..5 {
        let id = format!("page-{n}");
        let headers = [("x-handoff-conversation-id", id.as_str())];
        post(
            &proxy,
            &headers,
            &json!({"model": "m", "messages": [user("x")]}),
        )
        .await;
    }
    let page = proxy.get("/handoff/conversations?limit=2").await;
    assert_eq!(page.status, 200);
    let page = page.json();
    assert_eq!(page["has_more"], true);
    let ids: Vec<&str> = page["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["page-0", "page-1"]);
    let rest = proxy
        .get("/handoff/conversations?limit=10&after=page-1")
        .await
        .json();
    assert_eq!(rest["data"].as_array().unwrap().len(), 3);
    assert_eq!(rest["has_more"], false);

    assert_eq!(proxy.get("/handoff/conversations/nope").await.status, 404);
    assert_eq!(proxy.get("/handoff/conversations/a%20b").await.status, 400);
}
