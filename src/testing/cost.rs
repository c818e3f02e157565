//! What a long session costs, against a provider that caches and bills as the
//! providers document ([`mock_upstream::cache`]): a 40-turn tool-using agent on a 32k
//! window, run with no compaction on a 200k window (the reference), compacting itself
//! (one summary turn appended to its cached conversation, then a restart from the
//! summary), and through handoff. Both caching styles. `benches/cost.sh` prints the
//! table; the tests hold handoff's default config to the client's own compaction.
//! They run on the real clock (a session takes a few seconds): on paused time the
//! runtime jumps to its next timer whenever it waits for a socket.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use mock_upstream::anthropic::StrictAnthropic;
use mock_upstream::cache::{CacheStyle, PromptCache, GPT_4O, SONNET};
use mock_upstream::strict::{Strict, CONTINUED_MARKER, SUMMARY_PROMPT_START};
use mock_upstream::{AgentStyle, MockUpstream};
use serde_json::{json, Value};

use crate::testing::Harness;

/// User turns in a session.
const TURNS: usize = 40;

/// The model's window in the compacted runs.
pub(super) const WINDOW: u64 = 32_768;

/// The reference's window: the session never fills it.
const LARGE_WINDOW: u64 = 200_000;

/// Share of the window past which the client compacts itself, before a user turn: the
/// turn's tool round trip must still fit (Claude Code and Codex compact at 75-90% of
/// theirs, less a reserve for the turn).
const CLIENT_TRIGGER: f64 = 0.75;

/// How a session is run.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Run {
    /// No compaction on a window it never fills.
    Reference,
    /// The client compacts itself.
    ClientCompacts,
    /// Through handoff, with this config on top of the defaults.
    Handoff(&'static str),
}

/// What one session cost and did.
#[derive(Debug, Clone)]
pub(crate) struct Session {
    /// USD, every request.
    pub cost: f64,
    /// USD, the summary calls.
    pub summary_cost: f64,
    /// Summary calls made.
    pub summary_calls: usize,
    /// Compactions (handoff's records, or the client's restarts).
    pub compactions: usize,
    /// The provider's answers to the requests it refused.
    pub rejects: Vec<String>,
    /// Facts stated in the session that the last request no longer carried.
    pub lost: Vec<String>,
    /// Each summary call's body, with what it was billed.
    pub summaries: Vec<(Value, mock_upstream::cache::Billed)>,
}

impl Session {
    /// What a report shows of it.
    fn line(&self) -> String {
        format!(
            "${:.2}, {} summary calls (${:.2}), {} compactions, facts lost {:?}, refused {:?}",
            self.cost,
            self.summary_calls,
            self.summary_cost,
            self.compactions,
            self.lost,
            self.rejects
        )
    }
}

/// The agent's side: its conversation, in the API's shape.
pub(super) struct Agent {
    style: CacheStyle,
    system: String,
    tools: Vec<Value>,
    pub(super) messages: Vec<Value>,
}

impl Agent {
    pub(super) fn new(style: CacheStyle) -> Self {
        // About 1k tokens of system prompt and 3k of tool schemas, as a coding agent's.
        let tools = (0..8)
            .map(|n| {
                let description = format!("Tool {n}. {}", filler(n, 350));
                let schema = json!({"type": "object", "properties": {"query": {"type": "string"}}});
                match style {
                    CacheStyle::Automatic => json!({"type": "function", "function": {
                        "name": format!("tool_{n}"), "description": description, "parameters": schema}}),
                    CacheStyle::Breakpoints => json!({"name": format!("tool_{n}"),
                        "description": description, "input_schema": schema}),
                }
            })
            .collect();
        Self {
            style,
            system: format!("You are a coding agent. House rules: {}", filler(99, 1000)),
            tools,
            messages: Vec::new(),
        }
    }

    fn model(&self) -> &'static str {
        match self.style {
            CacheStyle::Automatic => "gpt-4o",
            CacheStyle::Breakpoints => "claude-sonnet-4-5",
        }
    }

    pub(super) fn path(&self) -> &'static str {
        match self.style {
            CacheStyle::Automatic => "/v1/chat/completions",
            CacheStyle::Breakpoints => "/v1/messages",
        }
    }

    /// The request body: Anthropic's marks on the system prompt and on the last
    /// block of the last message, as Claude Code places them.
    pub(super) fn body(&self, messages: &[Value]) -> Value {
        match self.style {
            CacheStyle::Automatic => {
                let mut all = vec![json!({"role": "system", "content": self.system})];
                all.extend(messages.iter().cloned());
                json!({"model": self.model(), "messages": all, "max_tokens": 1024, "tools": self.tools})
            }
            CacheStyle::Breakpoints => {
                let mut list = messages.to_vec();
                if let Some(block) = list
                    .last_mut()
                    .and_then(|m| m["content"].as_array_mut())
                    .and_then(|blocks| blocks.last_mut())
                {
                    block["cache_control"] = json!({"type": "ephemeral"});
                }
                json!({"model": self.model(), "max_tokens": 1024, "messages": list, "tools": self.tools,
                       "system": [{"type": "text", "text": self.system, "cache_control": {"type": "ephemeral"}}]})
            }
        }
    }

    pub(super) fn user(&self, text: String) -> Value {
        match self.style {
            CacheStyle::Automatic => json!({"role": "user", "content": text}),
            CacheStyle::Breakpoints => {
                json!({"role": "user", "content": [{"type": "text", "text": text}]})
            }
        }
    }

    /// The assistant message of `reply`, and the id of the tool it calls, if any.
    pub(super) fn answer(&self, reply: &Value) -> (Value, Option<String>) {
        match self.style {
            CacheStyle::Automatic => {
                let message = reply["choices"][0]["message"].clone();
                let call = message["tool_calls"][0]["id"].as_str().map(str::to_owned);
                (message, call)
            }
            CacheStyle::Breakpoints => {
                let content = reply["content"].clone();
                let call = content
                    .as_array()
                    .and_then(|blocks| blocks.iter().find(|b| b["type"] == "tool_use"))
                    .and_then(|b| b["id"].as_str())
                    .map(str::to_owned);
                (json!({"role": "assistant", "content": content}), call)
            }
        }
    }

    pub(super) fn tool_result(&self, id: &str, text: String) -> Value {
        match self.style {
            CacheStyle::Automatic => json!({"role": "tool", "tool_call_id": id, "content": text}),
            CacheStyle::Breakpoints => json!({"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": id, "content": text}]}),
        }
    }

    /// The summary a reply carries, whichever API answered.
    fn text_of(&self, reply: &Value) -> String {
        match self.style {
            CacheStyle::Automatic => reply["choices"][0]["message"]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
            CacheStyle::Breakpoints => reply["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        }
    }
}

/// Words of prose and tool output: no digits, so that the facts are the only
/// identifiers in a session, as in a real one most words are not.
const VOCABULARY: [&str; 32] = [
    "the", "build", "function", "returns", "error", "when", "file", "module", "test", "passes",
    "after", "change", "value", "config", "reads", "from", "path", "server", "request", "handler",
    "logs", "output", "with", "line", "check", "type", "field", "missing", "and", "then", "update",
    "call",
];

/// `words` words of text, varied by `seed`.
pub(super) fn filler(seed: usize, words: usize) -> String {
    (0..words)
        .map(|i| VOCABULARY[(i * 7 + seed * 13 + i / 5) % VOCABULARY.len()])
        .collect::<Vec<_>>()
        .join(" ")
}

/// Where the session's requests go: handoff, or the provider itself.
enum Route {
    Proxy(Harness),
    Direct(
        hyper_util::client::legacy::Client<
            hyper_util::client::legacy::connect::HttpConnector,
            http_body_util::Full<bytes::Bytes>,
        >,
        String,
    ),
}

impl Route {
    async fn post(&self, path: &str, body: &Value) -> (u16, Value) {
        let headers = [
            (crate::base::id::CONVERSATION_HEADER, "cost"),
            ("authorization", "Bearer sk-cost"),
            ("x-api-key", "sk-cost"),
            ("anthropic-version", "2023-06-01"),
        ];
        match self {
            Route::Proxy(harness) => {
                let got = harness
                    .post(path, &headers, body.to_string().as_bytes())
                    .await;
                (got.status.as_u16(), got.json())
            }
            Route::Direct(client, url) => {
                let request = http::Request::post(format!("{url}{path}"))
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(http_body_util::Full::new(bytes::Bytes::from(
                        body.to_string(),
                    )))
                    .unwrap();
                let response = client.request(request).await.unwrap();
                let status = response.status().as_u16();
                use http_body_util::BodyExt;
                let bytes = response.into_body().collect().await.unwrap().to_bytes();
                (
                    status,
                    serde_json::from_slice(&bytes).unwrap_or(Value::Null),
                )
            }
        }
    }
}

/// The provider: the agent (or summariser) of `style`, its window, its cache.
pub(super) async fn provider(style: CacheStyle, window: u64) -> (MockUpstream, Arc<PromptCache>) {
    let prices = match style {
        CacheStyle::Automatic => GPT_4O,
        CacheStyle::Breakpoints => SONNET,
    };
    let cache = PromptCache::new(style, prices);
    let billing = Arc::clone(&cache);
    let chat = Strict::new(window);
    chat.set_style(AgentStyle {
        brief_answers: true,
        ..AgentStyle::default()
    });
    let messages = StrictAnthropic::new(window);
    let mock = MockUpstream::with(move |request| {
        let body = request.json();
        let (reply, counted) = match style {
            CacheStyle::Automatic => (chat.answer(request), Strict::count(&body)),
            CacheStyle::Breakpoints => (
                messages.answer(request),
                mock_upstream::anthropic::count(&body),
            ),
        };
        let reply = if mock_upstream::strict::is_summary(&body) {
            written_out(reply)
        } else {
            reply
        };
        billing.bill_counted(request, reply, Some(counted))
    })
    .await;
    (mock, cache)
}

/// Words a summary is padded with: the mock's summaries list the facts and little
/// else, a real summariser writes about a thousand tokens, for the client's own
/// compaction as for handoff's.
const SUMMARY_WORDS: usize = 800;

/// A summary reply padded to a real summary's length, its usage with it.
fn written_out(reply: mock_upstream::Reply) -> mock_upstream::Reply {
    let mock_upstream::Reply::Json { status, mut body } = reply else {
        return reply;
    };
    let padding = format!("\n{}", filler(7, SUMMARY_WORDS));
    let tokens = mock_upstream::strict::text_tokens(&padding);
    let slots = [
        ("/choices/0/message/content", "/usage/completion_tokens"),
        ("/content/0/text", "/usage/output_tokens"),
    ];
    for (text, output) in slots {
        if let Some(Value::String(text)) = body.pointer_mut(text) {
            text.push_str(&padding);
            if let Some(count) = body.pointer_mut(output) {
                *count = json!(count.as_u64().unwrap_or(0) + tokens);
            }
        }
    }
    mock_upstream::Reply::Json { status, body }
}

/// One session of `turns` user turns in `style`, run as `run` says.
pub(crate) async fn session(style: CacheStyle, run: Run, turns: usize) -> Session {
    let window = match run {
        Run::Reference => LARGE_WINDOW,
        Run::ClientCompacts | Run::Handoff(_) => WINDOW,
    };
    let (mock, cache) = provider(style, window).await;
    let route = match run {
        Run::Handoff(extra) => {
            let models = format!(
                "[models.\"gpt-4o\"]\ncontext_window = {WINDOW}\n[models.\"claude-sonnet-4-5\"]\ncontext_window = {WINDOW}\n{extra}"
            );
            Route::Proxy(Harness::start(&mock.url(), &models).await)
        }
        _ => Route::Direct(
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
                .build_http(),
            mock.url(),
        ),
    };
    let mut agent = Agent::new(style);
    let mut facts = Vec::new();
    let mut restarts = 0;
    let mut last_prompt = 0u64;
    for turn in 0..turns {
        let fact = format!("FACT-U{turn:03}");
        facts.push(fact.clone());
        let question = format!("{fact} {}", filler(turn, 40));
        if matches!(run, Run::ClientCompacts) && last_prompt as f64 > CLIENT_TRIGGER * WINDOW as f64
        {
            compact_itself(&route, &mut agent).await;
            restarts += 1;
        }
        agent.messages.push(agent.user(question));
        // The agent's tool round trip, then its answer.
        for step in 0..2 {
            let body = agent.body(&agent.messages);
            let (status, reply) = route.post(agent.path(), &body).await;
            assert_eq!(status, 200, "turn {turn} step {step}: {reply}");
            last_prompt = prompt_tokens(&reply);
            let (message, call) = agent.answer(&reply);
            agent.messages.push(message);
            let Some(id) = call else { break };
            let fact = format!("FACT-T{turn:03}");
            facts.push(fact.clone());
            let result = format!("{fact} {}", filler(turn + 50, 2000));
            agent.messages.push(agent.tool_result(&id, result));
        }
    }
    let last = mock
        .requests()
        .iter()
        .rev()
        .map(|r| r.json())
        .find(|body| !mock_upstream::strict::is_summary(body))
        .unwrap_or(Value::Null)
        .to_string();
    let lost = facts
        .into_iter()
        .filter(|f| !last.contains(f.as_str()))
        .collect();
    let compactions = match &route {
        Route::Proxy(harness) => harness.records("cost").await.len(),
        Route::Direct(..) => restarts,
    };
    let (cost, summary_cost) = cache.cost();
    let bodies = mock.requests().into_iter().map(|r| r.json());
    let summaries: Vec<(Value, mock_upstream::cache::Billed)> = bodies
        .filter(mock_upstream::strict::is_summary)
        .zip(cache.bills().into_iter().filter(|b| b.summary))
        .map(|(body, bill)| (body, bill.billed))
        .collect();
    Session {
        cost,
        summary_cost,
        summary_calls: summaries.len(),
        compactions,
        rejects: cache.refused(),
        lost,
        summaries,
    }
}

/// The client's own compaction: one summary turn appended to its conversation (so
/// the provider reads it from the cache), then a restart from the summary.
async fn compact_itself(route: &Route, agent: &mut Agent) {
    let mut asking = agent.messages.clone();
    asking.push(agent.user(format!(
        "{CONTINUED_MARKER}\n{SUMMARY_PROMPT_START}: summarise the conversation so far."
    )));
    let (status, reply) = route.post(agent.path(), &agent.body(&asking)).await;
    assert_eq!(status, 200, "{reply}");
    let summary = agent.text_of(&reply);
    agent.messages = vec![
        agent.user(format!("The conversation so far, summarised:\n{summary}")),
        match agent.style {
            CacheStyle::Automatic => json!({"role": "assistant", "content": "Understood."}),
            CacheStyle::Breakpoints => {
                json!({"role": "assistant", "content": [{"type": "text", "text": "Understood."}]})
            }
        },
    ];
}

/// All input tokens a reply's usage reports.
fn prompt_tokens(reply: &Value) -> u64 {
    let usage = &reply["usage"];
    let field = |name: &str| usage[name].as_u64().unwrap_or(0);
    field("prompt_tokens")
        + field("input_tokens")
        + field("cache_read_input_tokens")
        + field("cache_creation_input_tokens")
}

impl Run {
    /// The config a run through handoff adds.
    fn extra(self) -> &'static str {
        match self {
            Run::Handoff(extra) => extra,
            _ => "",
        }
    }
}

/// The runs of the cost table, with their names.
pub(crate) const RUNS: [(&str, Run); 6] = [
    ("no compaction, 200k window (reference)", Run::Reference),
    ("the client compacts itself", Run::ClientCompacts),
    (
        "through handoff, inline summarize",
        Run::Handoff("[compaction]\nprepare_at = 0\nmax_wait = \"600s\"\n"),
    ),
    ("through handoff, default config", Run::Handoff("")),
    (
        "through handoff, extract only",
        Run::Handoff("[compaction]\nstrategy = \"extract\"\nprepare_at = 0\n"),
    ),
    (
        "through handoff, default config, keep_recent = 0.25",
        Run::Handoff("[compaction]\nkeep_recent = 0.25\n"),
    ),
];

// On the real clock: paused, the runtime jumps to the next timer whenever it waits
// for a socket, and a 30k-token body's reads then outlast limits.body_timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "the cost table: benches/cost.sh"]
async fn table() {
    for style in [CacheStyle::Breakpoints, CacheStyle::Automatic] {
        println!("\n{style:?}\n| run | cost | summary calls (cost) | compactions | facts lost | rejects |\n| --- | ---: | ---: | ---: | ---: | ---: |");
        for (name, run) in RUNS {
            let s = session(style, run, TURNS).await;
            println!(
                "| {name} | ${:.2} | {} (${:.2}) | {} | {} | {} |",
                s.cost,
                s.summary_calls,
                s.summary_cost,
                s.compactions,
                s.lost.len(),
                s.rejects.len()
            );
        }
    }
}

/// The messages of a summary call's body, each as its JSON text.
fn message_texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .map(Value::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_summary_call_reads_the_conversation_from_the_cache_and_shows_no_message_twice() {
    for style in [CacheStyle::Breakpoints, CacheStyle::Automatic] {
        let s = session(style, Run::Handoff(RUNS[2].1.extra()), 14).await;
        assert!(!s.summaries.is_empty(), "{style:?}: nothing was compacted");
        for (body, billed) in &s.summaries {
            // The conversation's own prefix, read from the cache: most of the call.
            assert!(
                billed.cache_read * 10 >= billed.prompt() * 8,
                "{style:?}: {billed:?}"
            );
            let texts = message_texts(body);
            let mut unique = texts.clone();
            unique.sort();
            unique.dedup();
            assert_eq!(unique.len(), texts.len(), "{style:?}: a message twice");
            // The tools and system prompt as the client sent them, and no rendering.
            assert_eq!(body["tools"].as_array().map(Vec::len), Some(8), "{style:?}");
            assert!(
                !body.to_string().contains("<history>\n"),
                "{style:?}: rendered"
            );
        }
        assert!(
            s.lost.is_empty() && s.rejects.is_empty(),
            "{style:?}: {}",
            s.line()
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forty_turns_through_the_default_config_cost_less_than_no_compaction_and_pace_like_inline()
{
    for style in [CacheStyle::Breakpoints, CacheStyle::Automatic] {
        let reference = session(style, Run::Reference, TURNS).await;
        let client = session(style, Run::ClientCompacts, TURNS).await;
        let inline = session(style, RUNS[2].1, TURNS).await;
        let default = session(style, Run::Handoff(""), TURNS).await;
        let report = format!(
            "{style:?}\nreference {}\nclient {}\ninline {}\ndefault {}",
            reference.line(),
            client.line(),
            inline.line(),
            default.line()
        );
        assert!(default.cost <= 1.2 * reference.cost, "{report}");
        assert!(
            default.lost.is_empty() && default.rejects.is_empty(),
            "{report}"
        );
        // A summariser that keeps pace is waited for at the trigger, as inline: the
        // default compacts as often as inline and costs as much. (The sessions run on
        // the real clock; on a loaded machine one more compaction may happen.)
        assert!(default.compactions <= inline.compactions + 1, "{report}");
        assert!(default.cost <= 1.05 * inline.cost, "{report}");
        for (_, billed) in &default.summaries {
            assert!(billed.cache_read * 2 >= billed.prompt(), "{report}");
        }
        // What handoff keeps that a client's own summary does not (the newest unit
        // verbatim, the ledger of exact facts) costs this much at most.
        assert!(default.cost <= 1.25 * client.cost, "{report}");
    }
}
