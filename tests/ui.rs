//! The web audit view in a real browser: headless Chromium, driven over WebDriver
//! (Debian's chromium-driver) by `tests/clients/ui_check.py`, after a compacting
//! conversation. Screenshots of both views are saved under `target/ui-screenshots/`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod support;

use std::path::PathBuf;

use serde_json::Value;
use support::client::{self, request};
use support::scenario::{
    big_user, chat, drive_until_compaction, options, python, records, strict_mock,
};

const SUMMARY: &str = "[compaction]\nsummary_model = \"strict-16k\"\nsummary_timeout = \"10s\"\n";

/// Prices for the strict model, so a page shows a bill and what compactions saved.
const PRICED: &str = "[prices.\"strict\"]\ninput = 3.0\ncache_read = 0.3\noutput = 15.0\n";

fn words(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_audit_page_shows_conversations_compactions_and_the_token_curve() {
    let (_strict, mock) = strict_mock(4096).await;
    let proxy =
        support::Proxy::start_with(&mock.url(), options(4096, &format!("{SUMMARY}{PRICED}")));
    let mut history = drive_until_compaction(&proxy, "ui-long", 300, 30).await;
    // A few turns after the compaction, so the curve drops and climbs again.
    for n in 100..103 {
        history.push(big_user(n, 200));
        let got = chat(&proxy, "ui-long", &history).await;
        assert_eq!(got.status, 200);
        history.push(got.json()["choices"][0]["message"].clone());
        if let Some(call) = history.last().unwrap()["tool_calls"][0]["id"].as_str() {
            let call = call.to_owned();
            history
                .push(serde_json::json!({"role": "tool", "tool_call_id": call, "content": "ok"}));
            let got = chat(&proxy, "ui-long", &history).await;
            history.push(got.json()["choices"][0]["message"].clone());
        }
    }
    let short = chat(
        &proxy,
        "ui-short",
        &[serde_json::json!({"role": "user", "content": "hello"})],
    )
    .await;
    assert_eq!(short.status, 200);

    // The curve plots what was sent: the request that triggered the compaction is
    // drawn with the compacted view it was sent with, under the window.
    let timeline = support::client::send(support::client::request(
        "GET",
        &format!("{}/handoff/conversations/ui-long/timeline", proxy.url()),
        &[],
        "",
    ))
    .await
    .json();
    let requests: Vec<&Value> = timeline["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "request")
        .collect();
    // A preparation the crossing request waited for is drawn at that request, not
    // after it.
    for span in timeline["prepared"].as_array().unwrap() {
        if let Some(adopted) = span["adopted_at"].as_u64() {
            assert!(span["waiting_from"].as_u64().unwrap() <= adopted, "{span}");
            assert_eq!(
                requests[adopted as usize - 1]["compaction"],
                span["id"],
                "{span}"
            );
        }
    }
    let first_compacted = requests
        .iter()
        .position(|r| !r["compaction"].is_null())
        .unwrap();
    // Small turns: every view sent was under the trigger, the triggering one included,
    // but one sent while its compaction was being prepared, which is under the input
    // budget and says so.
    let trigger = timeline["trigger_tokens"].as_u64().unwrap();
    for r in &requests {
        let limit = match r["over"].as_str() {
            Some("sent_while_preparing") => r["input_budget"].as_u64().unwrap(),
            _ => trigger,
        };
        assert!(
            r["estimated_tokens"].as_u64().unwrap() <= limit,
            "a request plotted above what it was sent with: {r}"
        );
    }
    assert!(
        requests[first_compacted]["estimated_tokens"].as_u64()
            < requests[first_compacted - 1]["estimated_tokens"].as_u64(),
        "the triggering request is drawn with its compacted view"
    );

    let shots = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/ui_check.py");
    let (url, dir) = (proxy.url(), shots.clone());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python())
            .arg(script)
            .arg(&url)
            .arg("ui-long")
            .arg(&dir)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "the browser run failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    println!(
        "screenshots: {} and {}",
        shots.join("ui-list.png").display(),
        shots.join("ui-conversation.png").display()
    );

    // The list shows every conversation `audit list` shows.
    let mut listed: Vec<String> = seen["listed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let mut audited: Vec<String> = proxy
        .conversations()
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_owned())
        .collect();
    listed.sort();
    audited.sort();
    assert_eq!(listed, audited);
    let text = seen["list_text"].as_str().unwrap();
    assert!(
        !text.contains("null") && !text.contains("undefined"),
        "{text}"
    );

    // Under the chart, the bill and what the compactions saved, as the admin API says.
    let saved = timeline["bill"]["saved_cached_usd"].as_f64().unwrap();
    assert!(saved > 0.0, "{}", timeline["bill"]);
    assert_eq!(
        seen["saved"],
        serde_json::json!([format!("{saved:.6}")]),
        "{seen}"
    );
    let bill = seen["bill"][0].as_str().unwrap();
    assert!(
        bill.contains("Compactions kept") && bill.contains("saved at least"),
        "{bill}"
    );

    // Each compaction with its numbers and its handoff.
    let records = records(&proxy, "ui-long");
    let shown = seen["compactions"].as_array().unwrap();
    assert_eq!(shown.len(), records.len(), "{seen}");
    for (record, shown) in records.iter().zip(shown) {
        assert_eq!(shown["id"], record["id"]);
        assert_eq!(shown["strategy"], record["strategy"]);
        assert_eq!(shown["tokens_before"], record["tokens_before"].to_string());
        assert_eq!(shown["tokens_after"], record["tokens_after"].to_string());
        assert_eq!(
            shown["attempts"],
            record["attempts"].as_array().unwrap().len()
        );
        assert_eq!(
            words(shown["handoff"].as_str().unwrap()),
            words(record["handoff"]["content"].as_str().unwrap())
        );
    }

    // A point per request, the window and trigger lines, a mark where it compacted.
    let summary = proxy
        .conversations()
        .into_iter()
        .find(|c| c["id"] == "ui-long")
        .unwrap();
    assert_eq!(seen["chart_points"], summary["requests"], "{seen}");
    let lines: Vec<&str> = seen["chart_lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        lines.contains(&"window") && lines.contains(&"trigger"),
        "{lines:?}"
    );
    assert!(seen["chart_markers"].as_u64().unwrap() >= 1);
    assert_eq!(seen["messages"], summary["messages"]);

    // Every view has a URL; the view tab matches `audit view`.
    assert!(
        seen["url"]
            .as_str()
            .unwrap()
            .contains("#/c/ui-long?tenant="),
        "{seen}"
    );
    assert!(seen["view_url"].as_str().unwrap().ends_with("&tab=view"));
    let view: Vec<Value> =
        serde_json::from_slice(&proxy.audit(&["view", "ui-long"]).stdout).unwrap();
    assert_eq!(seen["view_messages"].as_u64().unwrap() as usize, view.len());
    // The last request opened in the page is the one `audit replay` gives.
    assert_eq!(seen["as_sent_number"], summary["requests"], "{seen}");
    let replay = proxy.replay("ui-long", None);
    let shown = &seen["as_sent"];
    let shown: Vec<Value> = shown["messages"]
        .as_array()
        .unwrap()
        .iter()
        .chain(shown["reply"].as_array().unwrap())
        .cloned()
        .collect();
    assert_eq!(
        shown, replay,
        "the page shows the request as the client sent it"
    );

    // The page made no request to any other host.
    let requests = seen["requests"].as_array().unwrap();
    assert!(!requests.is_empty());
    for url in requests {
        let url = url.as_str().unwrap();
        assert!(
            url.starts_with(&format!("{}/", proxy.url())),
            "a request to another host: {url}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_follows_the_admin_rules() {
    let (_strict, mock) = strict_mock(4096).await;
    let proxy = support::Proxy::start(&mock.url());
    let page = |headers: &'static [(&'static str, &'static str)]| {
        client::send(request(
            "GET",
            &format!("{}/handoff/ui", proxy.url()),
            headers,
            "",
        ))
    };
    let local = page(&[]).await;
    assert_eq!(local.status, 200);
    assert!(local.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    assert!(
        local.text().contains("data-chart"),
        "the page is served whole"
    );
    for external in ["src=\"http", "href=\"http", "url(http", "@import"] {
        assert!(
            !local.text().contains(external),
            "an external asset: {external}"
        );
    }
    assert_eq!(
        page(&[("host", "evil.example")]).await.status,
        403,
        "a foreign Host"
    );
    assert_eq!(
        page(&[("origin", "http://evil.example")]).await.status,
        403,
        "a foreign Origin"
    );
    let timeline = client::send(request(
        "GET",
        &format!("{}/handoff/conversations/x/timeline", proxy.url()),
        &[("origin", "http://evil.example")],
        "",
    ))
    .await;
    assert_eq!(timeline.status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_timeline_puts_an_edited_message_in_its_own_lane() {
    let mock = mock_upstream::MockUpstream::replying(mock_upstream::Reply::chat_text("fine")).await;
    let proxy = support::Proxy::start(&mock.url());
    let user = |text: &str| serde_json::json!({"role": "user", "content": text});
    let reply = serde_json::json!({"role": "assistant", "content": "fine"});
    for messages in [
        vec![user("one")],
        vec![user("one"), reply.clone(), user("two")],
        // The second question edited: a branch from the first reply.
        vec![user("one"), reply.clone(), user("two, edited")],
    ] {
        let got = chat(&proxy, "edits", &messages).await;
        assert_eq!(got.status, 200);
    }
    let timeline = client::send(request(
        "GET",
        &format!("{}/handoff/conversations/edits/timeline", proxy.url()),
        &[],
        "",
    ))
    .await;
    assert_eq!(timeline.status, 200, "{}", timeline.text());
    let value = timeline.json();
    let lanes: Vec<(String, u64)> = value["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "message")
        .map(|e| {
            (
                e["message"]["content"].as_str().unwrap().to_owned(),
                e["lane"].as_u64().unwrap(),
            )
        })
        .collect();
    let lane = |text: &str| lanes.iter().find(|(t, _)| t == text).unwrap().1;
    assert_eq!(lane("one"), 0);
    assert_eq!(lane("two"), 0);
    assert!(lane("two, edited") > 0, "{lanes:?}");
    assert_eq!(value["branch_tips"].as_array().unwrap().len(), 2);
    let requests: Vec<&Value> = value["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["type"] == "request")
        .collect();
    assert_eq!(requests.len(), 3);
    assert!(requests
        .iter()
        .all(|r| r["estimated_tokens"].as_u64().unwrap() > 0));
}

/// What the timeline of conversation `id` shows in Chromium (`ui_odd_events.py`).
async fn timeline_seen(proxy: &support::Proxy, id: &str) -> Value {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/clients/ui_odd_events.py");
    let (url, id) = (proxy.url(), id.to_owned());
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python())
            .arg(script)
            .arg(&url)
            .arg(&id)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_odd_message_never_hides_the_rest_of_the_timeline() {
    let mock = mock_upstream::MockUpstream::replying(mock_upstream::Reply::chat_text("fine")).await;
    let proxy = support::Proxy::start(&mock.url());
    let messages = vec![
        serde_json::json!({"role": "user", "content": "the first question"}),
        serde_json::json!({"role": "assistant", "content": [null]}),
        serde_json::json!({"role": "assistant", "content": "odd", "tool_calls": "zzz"}),
        serde_json::json!({"role": "user", "content": "<img src=x onerror=\"window.__pwned=1\"> \"><script>window.__pwned=2</script>"}),
        serde_json::json!({"role": "assistant", "content": "noted", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "<img src=y onerror=\"window.__pwned=3\">", "arguments": "{}"}}]}),
        serde_json::json!({"role": "tool", "tool_call_id": "c1", "content": "<iframe src=javascript:window.__pwned=4></iframe>"}),
        serde_json::json!({"role": "user", "content": "the last question"}),
    ];
    let got = chat(&proxy, "odd-one", &messages).await;
    assert_eq!(got.status, 200, "{}", got.text());
    let seen = timeline_seen(&proxy, "odd-one").await;
    let text = seen["text"].as_str().unwrap();
    assert!(!text.contains("Cannot load"), "{text}");
    assert!(
        text.contains("the first question") && text.contains("the last question"),
        "{text}"
    );
    assert!(seen["messages"].as_u64().unwrap() >= 4, "{seen}");
    assert_eq!(
        seen["injected"], 0,
        "an element of the client's making: {seen}"
    );
    assert_eq!(
        seen["pwned"], 0,
        "a script of the client's making ran: {seen}"
    );
    assert!(
        text.contains("<script>window.__pwned=2</script>"),
        "shown as text: {text}"
    );
}

/// A log that does not verify (here an old log torn by a line break a client planted)
/// says so at the top of its page, with the lines, before anything it shows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_that_does_not_verify_says_so_first() {
    let mock = mock_upstream::MockUpstream::replying(mock_upstream::Reply::chat_text("fine")).await;
    let proxy = support::Proxy::start(&mock.url());
    let messages = [serde_json::json!({"role": "user", "content": "hello"})];
    assert_eq!(chat(&proxy, "torn-ui", &messages).await.status, 200);
    let seen = timeline_seen(&proxy, "torn-ui").await;
    assert!(seen["problems"].as_array().unwrap().is_empty());
    // The bill says the reply's model has no price, not that it was free.
    let bill = seen["bill"][0].as_str().unwrap_or_default();
    assert!(bill.contains("1 unpriced (no price for strict)"), "{seen}");
    let log = proxy.conversation_dir("torn-ui").join("messages.jsonl");
    let mut text = std::fs::read_to_string(&log).unwrap();
    text.push_str("{\"v\":1,\"at\":\"t\",\"kind\":\"message\",\"pad\":[\n\"x\"]}\n");
    std::fs::write(&log, text).unwrap();
    let seen = timeline_seen(&proxy, "torn-ui").await;
    let alerts = seen["problems"].as_array().unwrap();
    assert_eq!(alerts.len(), 1, "{seen}");
    let alert = alerts[0].as_str().unwrap();
    assert!(alert.contains("does not verify: 2 problems"), "{alert}");
    assert!(
        alert.contains("line 4:") && alert.contains("line 5:"),
        "{alert}"
    );
}

/// A Gemini conversation's texts are in `parts`: the timeline shows them, its calls and
/// its results, without the model's thoughts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_conversation_shows_its_parts() {
    let work = tempfile::tempdir().unwrap();
    let model = mock_upstream::scripted::ScriptedCoder::new(
        1_000_000,
        3,
        work.path().to_owned(),
        mock_upstream::scripted::Thinking::Some,
    );
    let answer = std::sync::Arc::clone(&model);
    let mock = mock_upstream::MockUpstream::with(move |r| answer.answer(r)).await;
    let proxy = support::Proxy::start(&mock.url());
    let body = serde_json::json!({
        "systemInstruction": {"parts": [{"text": "the gemini instruction"}]},
        "contents": [
            {"role": "user", "parts": [{"text": "the gemini question"}]},
            {"role": "model", "parts": [{"text": "weighing", "thought": true},
                {"functionCall": {"name": "read_file", "args": {"file_path": "a"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "read_file", "response": {"output": "the file"}}}]}]});
    let got = client::send(request(
        "POST",
        &format!("{}/v1beta/models/gemini-ui:generateContent", proxy.url()),
        &[
            ("content-type", "application/json"),
            ("x-goog-api-key", "AIza-ui"),
            ("x-handoff-conversation-id", "gemini-ui"),
        ],
        body.to_string(),
    ))
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let seen = timeline_seen(&proxy, "gemini-ui").await;
    let text = seen["text"].as_str().unwrap();
    for shown in [
        "the gemini question",
        "[calls read_file]",
        "[result of read_file]",
        "Reading notes",
    ] {
        assert!(text.contains(shown), "{shown}: {text}");
    }
    assert!(
        !text.contains("weighing"),
        "thoughts are the model's: {text}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_timeline_is_read_a_page_at_a_time_with_every_request_charted() {
    let mock = mock_upstream::MockUpstream::replying(mock_upstream::Reply::chat_text("fine")).await;
    let proxy = support::Proxy::start(&mock.url());
    let mut messages = Vec::new();
    for n in 0..20 {
        messages.push(serde_json::json!({"role": "user", "content": format!("question {n}")}));
        let got = chat(&proxy, "long-one", &messages).await;
        assert_eq!(got.status, 200);
        messages.push(got.json()["choices"][0]["message"].clone());
    }
    let page = |query: &str| {
        client::send(request(
            "GET",
            &format!(
                "{}/handoff/conversations/long-one/timeline?{query}",
                proxy.url()
            ),
            &[],
            "",
        ))
    };
    let newest = page("limit=10").await.json();
    let total = newest["events_total"].as_u64().unwrap();
    assert!(total > 40, "{total}");
    assert_eq!(newest["events"].as_array().unwrap().len(), 10);
    assert_eq!(newest["events_offset"].as_u64().unwrap(), total - 10);
    assert_eq!(
        newest["chart"].as_array().unwrap().len(),
        20,
        "every request charted"
    );
    let first = page("limit=10&offset=0").await.json();
    assert_eq!(first["events"][0]["message"]["content"], "question 0");
    assert_eq!(page("limit=0").await.status, 400);
    assert_eq!(page("offset=x").await.status, 400);
}

/// Where the provider compacted (a reply carrying its compaction item), the chart says
/// so with a mark of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_marks_where_the_provider_compacted() {
    let reply = |output: serde_json::Value| {
        mock_upstream::Reply::json(serde_json::json!({"id": "resp_ui", "object": "response",
            "status": "completed", "model": "gpt-ui", "output": output,
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15}}))
    };
    let turn = std::sync::atomic::AtomicUsize::new(0);
    let mock = mock_upstream::MockUpstream::with(move |_| {
        let text = serde_json::json!({"type": "message", "role": "assistant",
            "content": [{"type": "output_text", "text": "done"}]});
        // The second reply carries the provider's compaction item.
        match turn.fetch_add(1, std::sync::atomic::Ordering::SeqCst) {
            1 => reply(serde_json::json!([
                {"type": "compaction", "id": "cmp_ui", "encrypted_content": "gAAAA-ui"}, text])),
            _ => reply(serde_json::json!([text])),
        }
    })
    .await;
    let proxy = support::Proxy::start(&mock.url());
    let mut input = vec![serde_json::json!({"role": "user", "content": "first"})];
    for (n, next) in ["second", "third"].iter().enumerate() {
        let body = serde_json::json!({"model": "gpt-ui", "input": input,
            "context_management": [{"type": "compaction", "compact_threshold": 100000}]});
        let got = client::send(request(
            "POST",
            &format!("{}/v1/responses", proxy.url()),
            &[
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-ui"),
                ("x-handoff-conversation-id", "native-ui"),
            ],
            body.to_string(),
        ))
        .await;
        assert_eq!(got.status, 200, "request {n}: {}", got.text());
        input.extend(got.json()["output"].as_array().unwrap().iter().cloned());
        input.push(serde_json::json!({"role": "user", "content": next}));
    }
    let seen = timeline_seen(&proxy, "native-ui").await;
    assert_eq!(seen["provider_marks"], serde_json::json!(["2"]), "{seen}");
}
