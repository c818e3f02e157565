//! Hooks at their stages through the real binary: a `tag` hook sends a request to a
//! second upstream and tags it, in the record and the metrics, at the request and at
//! the reply; a view-stage `redact` hook keeps a text from the upstream and the summary
//! calls while the log keeps it, and the decision line says what it took out.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use sha2::Digest;

use crate::hooks::post;
use crate::support::client::{self, request};
use crate::support::scenario::{big_user, options, strict_mock};
use crate::support::{read_tree, Proxy};

/// The log's lines of `kind` in conversation `id`, as written.
fn lines(proxy: &Proxy, id: &str, kind: &str) -> Vec<Value> {
    let path = proxy.conversation_dir(id).join("messages.jsonl");
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|line| line["kind"] == kind)
        .collect()
}

/// The metrics once every one of `lines` is among them, or after 10 s: the reply-stage
/// hooks run after the client has its answer, so their counts land a little later.
async fn metrics_with(proxy: &Proxy, lines: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let metrics = proxy.metrics().await;
        if lines.iter().all(|line| metrics.contains(line)) || Instant::now() > deadline {
            return metrics;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A provider of all three APIs, each as strict as the real one.
async fn three_apis(window: u64) -> mock_upstream::MockUpstream {
    let chat = mock_upstream::strict::Strict::new(window);
    let messages = mock_upstream::anthropic::StrictAnthropic::new(window);
    let responses = mock_upstream::responses::StrictResponses::new(window);
    mock_upstream::MockUpstream::with(move |req| {
        if req.target.starts_with("/v1/messages") {
            messages.answer(req)
        } else if req.target.starts_with("/v1/responses") {
            responses.answer(req)
        } else {
            chat.answer(req)
        }
    })
    .await
}

fn bodies(text: &str) -> [(&'static str, Value); 3] {
    [
        (
            "/v1/chat/completions",
            json!({"model": "strict", "messages": [{"role": "user", "content": text}]}),
        ),
        (
            "/v1/messages",
            json!({"model": "strict", "max_tokens": 50,
                   "messages": [{"role": "user", "content": [{"type": "text", "text": text}]}]}),
        ),
        (
            "/v1/responses",
            json!({"model": "strict", "input": [{"role": "user", "content": text}]}),
        ),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tag_hook_reroutes_to_a_second_upstream_and_tags_the_record_and_the_metrics() {
    let main = three_apis(16_384).await;
    let cheap = three_apis(16_384).await;
    let extra = format!(
        "[middleware]\nchain = [\"router\"]\nmetric_tags = [\"task\", \"answered_by\"]\n\
         [middleware.hooks.router]\nkind = \"tag\"\nstages = [\"request\", \"reply\"]\n\
         [[middleware.hooks.router.rules]]\ncontent = \"(?i)translate\"\ntags = {{ task = \"translation\", team = \"docs\" }}\nreroute = \"cheap-1\"\n\
         [[middleware.hooks.router.rules]]\nmodel = \"cheap-*\"\ntags = {{ answered_by = \"cheap\" }}\n\
         [[routes]]\nmatch = \"cheap-*\"\nupstream = \"{}\"\n",
        cheap.url()
    );
    let proxy = Proxy::start_with(&main.url(), options(16_384, &extra));
    for (n, (path, body)) in bodies("Translate 'good morning' into French")
        .iter()
        .enumerate()
    {
        let got = post(&proxy, path, &format!("translate-{n}"), body).await;
        assert_eq!(got.status, 200, "{path}: {}", got.text());
    }
    for (n, (path, body)) in bodies("What is the capital of France?").iter().enumerate() {
        let got = post(&proxy, path, &format!("plain-{n}"), body).await;
        assert_eq!(got.status, 200, "{path}: {}", got.text());
    }
    // The translations went to the second upstream, as the model the hook chose.
    let rerouted = cheap.requests();
    assert_eq!(rerouted.len(), 3, "{rerouted:?}");
    for request in &rerouted {
        assert_eq!(request.json()["model"], "cheap-1", "{}", request.json());
    }
    let stayed = main.requests();
    assert_eq!(stayed.len(), 3);
    for request in &stayed {
        assert_eq!(request.json()["model"], "strict");
        assert!(!request.json().to_string().contains("Translate"));
    }
    // The record says what the hook did: its tags, and the model the client asked for.
    for n in 0..3 {
        let requests = lines(&proxy, &format!("translate-{n}"), "request");
        assert_eq!(requests.len(), 1, "{requests:?}");
        let line = &requests[0];
        assert_eq!(line["model"], "cheap-1", "{line}");
        assert_eq!(line["hooks"]["model_from"], "strict", "{line}");
        assert_eq!(
            line["hooks"]["tags"],
            json!({"task": "translation", "team": "docs"})
        );
        let plain = lines(&proxy, &format!("plain-{n}"), "request");
        assert!(plain[0].get("hooks").is_none(), "{}", plain[0]);
    }
    // Metrics carry the tags metric_tags names; the reply's come after the reply.
    let expected = [
        "handoff_hook_tags_total{tag=\"task\",value=\"translation\"} 3",
        "handoff_hook_tags_total{tag=\"answered_by\",value=\"cheap\"} 3",
        "handoff_hook_calls_total{hook=\"router\",stage=\"request\",outcome=\"rerouted\"} 3",
        "handoff_hook_calls_total{hook=\"router\",stage=\"reply\",outcome=\"passed\"} 6",
    ];
    let metrics = metrics_with(&proxy, &expected).await;
    for line in expected {
        assert!(metrics.contains(line), "{line} in {metrics}");
    }
    assert!(
        !metrics.contains("tag=\"team\""),
        "team is not a metric tag"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chain_of_reply_hooks_alone_tags_every_reply() {
    let upstream = three_apis(16_384).await;
    let extra = "[middleware]\nchain = [\"late\"]\nmetric_tags = [\"replied\"]\n\
         [middleware.hooks.late]\nkind = \"tag\"\nstages = [\"reply\"]\n\
         [[middleware.hooks.late.rules]]\nmodel = \"*\"\ntags = { replied = \"yes\" }\n";
    let proxy = Proxy::start_with(&upstream.url(), options(16_384, extra));
    for (n, (path, body)) in bodies("Hello").iter().enumerate() {
        let got = post(&proxy, path, &format!("late-{n}"), body).await;
        assert_eq!(got.status, 200, "{path}: {}", got.text());
    }
    let line = "handoff_hook_tags_total{tag=\"replied\",value=\"yes\"} 3";
    let metrics = metrics_with(&proxy, &[line]).await;
    assert!(metrics.contains(line), "{metrics}");
    assert!(!metrics.contains("stage=\"request\""), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_may_not_be_rerouted_to_a_model_it_is_not_allowed() {
    let (_main, main) = strict_mock(16_384).await;
    let key_hash: String = sha2::Sha256::digest(b"sk-proxy-stages")
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let extra = format!(
        "[middleware]\nchain = [\"router\"]\n\
         [middleware.hooks.router]\nkind = \"tag\"\n\
         [[middleware.hooks.router.rules]]\ncontent = \"(?i)translate\"\nreroute = \"forbidden-1\"\n\
         [[auth.keys]]\nname = \"team-a\"\nsha256 = \"{key_hash}\"\nmodels = [\"strict\"]\n"
    );
    let proxy = Proxy::start_with(&main.url(), options(16_384, &extra));
    let ask = |text: &str| {
        client::send(request(
            "POST",
            &format!("{}/v1/chat/completions", proxy.url()),
            &[
                ("content-type", "application/json"),
                ("authorization", "Bearer sk-proxy-stages"),
            ],
            json!({"model": "strict", "messages": [{"role": "user", "content": text}]}).to_string(),
        ))
    };
    let got = ask("Translate this").await;
    assert_eq!(got.status, 403, "{}", got.text());
    assert!(got.text().contains("forbidden-1"), "{}", got.text());
    assert!(main.requests().is_empty());
    let got = ask("Hello").await;
    assert_eq!(got.status, 200, "{}", got.text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_view_hook_keeps_a_text_from_the_upstream_and_summaries_while_the_log_keeps_it() {
    let (_strict, mock) = strict_mock(4096).await;
    let extra = "[middleware]\nchain = [\"outbound\"]\n\
         [middleware.hooks.outbound]\nkind = \"redact\"\nstages = [\"view\"]\n\
         patterns = { ticket = \"TCK-[0-9]{6}\" }\n";
    let proxy = Proxy::start_with(&mock.url(), options(4096, extra));
    let mut messages = vec![
        json!({"role": "user", "content": "Track TCK-123456 for me."}),
        json!({"role": "assistant", "content": "Noted."}),
    ];
    for n in 0..12 {
        messages.push(big_user(n, 600));
        messages.push(json!({"role": "assistant", "content": format!("ok {n}")}));
    }
    messages.push(json!({"role": "user", "content": "Which ticket, TCK-123456?"}));
    let got = post(
        &proxy,
        "/v1/chat/completions",
        "view",
        &json!({"model": "strict", "messages": messages}),
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let seen: Vec<String> = mock
        .requests()
        .iter()
        .map(|r| r.json().to_string())
        .collect();
    assert!(
        seen.iter()
            .any(|t| t.contains(mock_upstream::strict::SUMMARY_PROMPT_START)),
        "the conversation was compacted by a summary"
    );
    for text in &seen {
        assert!(
            !text.contains("TCK-123456"),
            "the ticket went upstream: {text}"
        );
    }
    assert!(seen.iter().any(|t| t.contains("[redacted:ticket:")));
    // The log keeps the text; the decision line says what the view lost.
    let on_disk: String = read_tree(&proxy.data_dir())
        .iter()
        .map(|(_, bytes)| String::from_utf8_lossy(bytes).into_owned())
        .collect();
    assert!(on_disk.contains("TCK-123456"), "the log keeps the original");
    let decisions = lines(&proxy, "view", "decision");
    let noted = decisions
        .iter()
        .flat_map(|d| d["redacted"].as_array().cloned().unwrap_or_default())
        .collect::<Vec<_>>();
    assert!(
        noted.iter().any(|n| n["hook"] == "outbound"
            && n["label"] == "ticket"
            && n["count"].as_u64() >= Some(1)),
        "{decisions:?}"
    );
    assert!(
        !serde_json::to_string(&noted)
            .unwrap()
            .contains("TCK-123456"),
        "a note never holds the text"
    );
}

/// An upstream that answers with the marker it was sent, in chat completions, streamed
/// in 3-character deltas when asked to stream.
async fn marker_echo() -> mock_upstream::MockUpstream {
    mock_upstream::MockUpstream::with(|req| {
        let text = req.json()["messages"].to_string();
        let marker = text
            .find("[redacted:")
            .and_then(|at| {
                text[at..]
                    .find(']')
                    .map(|end| text[at..=at + end].to_owned())
            })
            .unwrap_or_default();
        let answer = format!("I will write to {marker} today.");
        if req.json()["stream"] == true {
            let pieces: Vec<String> = answer
                .chars()
                .collect::<Vec<_>>()
                .chunks(3)
                .map(|c| c.iter().collect())
                .collect();
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            mock_upstream::Reply::Sse {
                frames: mock_upstream::chat_stream_frames(&pieces),
                gap: Duration::ZERO,
                cut_after: None,
            }
        } else {
            mock_upstream::Reply::chat_text(&answer)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reversible_hook_s_markers_become_their_texts_in_the_client_s_reply_only() {
    let mock = marker_echo().await;
    let extra = "[middleware]\nchain = [\"secrets\"]\n\
         [middleware.hooks.secrets]\nkind = \"redact\"\ndetectors = [\"emails\"]\nreversible = true\n";
    let proxy = Proxy::start_with(&mock.url(), options(16_384, extra));
    let email = "ana.lopez@example.org";
    for stream in [false, true] {
        let id = format!("reverse-{stream}");
        let body = json!({"model": "strict", "stream": stream,
            "messages": [{"role": "user", "content": format!("Mail {email} the report.")}]});
        let got = post(&proxy, "/v1/chat/completions", &id, &body).await;
        assert_eq!(got.status, 200, "{}", got.text());
        let text = got.text();
        let said: String = if stream {
            text.lines()
                .filter_map(|line| line.strip_prefix("data: "))
                .filter_map(|data| serde_json::from_str::<Value>(data).ok())
                .filter_map(|e| {
                    e["choices"][0]["delta"]["content"]
                        .as_str()
                        .map(str::to_owned)
                })
                .collect()
        } else {
            got.json()["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        };
        assert_eq!(said, format!("I will write to {email} today."), "{text}");
        // The upstream saw the marker, and the log keeps the reply as it sent it.
        let replies = lines(&proxy, &id, "message");
        let logged = serde_json::to_string(&replies).unwrap();
        assert!(!logged.contains(email), "{logged}");
        assert!(
            logged.contains("I will write to [redacted:email:"),
            "{logged}"
        );
    }
    for request in mock.requests() {
        assert!(!String::from_utf8_lossy(&request.body).contains(email));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_compaction_s_summary_call_goes_through_the_view_hooks_too() {
    let (strict, mock) = strict_mock(16_384).await;
    let extra = "[middleware]\nchain = [\"outbound\"]\n\
         [middleware.hooks.outbound]\nkind = \"redact\"\nstages = [\"view\"]\n\
         patterns = { ticket = \"TCK-[0-9]{6}\" }\n";
    let proxy = Proxy::start_with(&mock.url(), options(16_384, extra));
    let mut messages = vec![json!({"role": "user", "content": "Track TCK-123456 for me."})];
    for n in 0..3 {
        messages.push(json!({"role": "assistant", "content": format!("noted {n}")}));
        messages.push(big_user(n, 60));
    }
    let got = post(
        &proxy,
        "/v1/chat/completions",
        "manual",
        &json!({"model": "strict", "messages": messages}),
    )
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    let got = client::send(request(
        "POST",
        &format!("{}/handoff/conversations/manual/compact", proxy.url()),
        &[("x-handoff-upstream-authorization", "Bearer sk-x")],
        "",
    ))
    .await;
    assert_eq!(got.status, 200, "{}", got.text());
    assert_eq!(
        strict.summaries.load(std::sync::atomic::Ordering::SeqCst),
        1
    );
    let summary = mock.requests().pop().unwrap();
    let summary = String::from_utf8_lossy(&summary.body);
    assert!(
        summary.contains(mock_upstream::strict::SUMMARY_PROMPT_START),
        "{summary}"
    );
    assert!(!summary.contains("TCK-123456"), "{summary}");
    assert!(summary.contains("[redacted:ticket:"), "{summary}");
}
