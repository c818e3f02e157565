//! A scripted model for clients that edit by text rather than by tool (aider): it
//! answers OpenAI chat completions as the real API does (usage in a stream only when
//! `stream_options.include_usage` asks, then `"usage":null` on every other chunk), with
//! a strict window counted by its own tokenizer (UTF-8 bytes / 5, not tiktoken).
//!
//! Its task: turn `N` asks about the files in the chat. Every third turn it edits
//! `counter.py` with a SEARCH/REPLACE block built from the `COUNT = k` it reads in the
//! request, so it must see the file's current contents. It answers the client's own
//! history summaries (aider's "*Briefly* summarize") and handoff's summary prompt, and
//! records what each request held.

use std::sync::{Arc, Mutex};

use regex::Regex;
use serde_json::{json, Value};

use crate::scripted::chat_reply;
use crate::strict::{fact_summary, SUMMARY_PROMPT_START};
use crate::{Recorded, Reply};

/// The opening of aider's history-summary prompt.
pub const CLIENT_SUMMARY_START: &str = "*Briefly* summarize this partial conversation";

/// One request, as the model saw it.
#[derive(Debug, Clone, Default)]
pub struct Turn {
    /// The turn number the last user message asked, if it was a task turn.
    pub turn: Option<u64>,
    /// The model's own token count of the request.
    pub tokens: u64,
    /// Refused for the window.
    pub over_window: bool,
    /// The client's own history summary (not a task turn).
    pub client_summary: bool,
    /// handoff's summary call.
    pub handoff_summary: bool,
    /// The request asked for usage in its stream.
    pub asked_usage: bool,
    /// The request streamed.
    pub stream: bool,
    /// Every fact of `facts` that the request held.
    pub facts_seen: Vec<String>,
    /// The request held the few-shot example the client opens its edit modes with.
    pub examples: bool,
    /// Messages in the request.
    pub messages: usize,
}

/// The model's settings and what it saw.
pub struct TextCoder {
    window: u64,
    facts: Mutex<Vec<String>>,
    example: String,
    /// Every request, in order.
    pub seen: Mutex<Vec<Turn>>,
}

/// The model's token count of a text.
pub fn tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(5)
}

impl TextCoder {
    /// A model with a `window`, checking for `facts` (the files' current contents) and
    /// for `example` (a text of the client's few-shot examples).
    pub fn new(window: u64, facts: Vec<String>, example: &str) -> Arc<Self> {
        Arc::new(Self {
            window,
            facts: Mutex::new(facts),
            example: example.to_owned(),
            seen: Mutex::default(),
        })
    }

    /// Changes the facts the files now hold (the user edited one).
    pub fn set_facts(&self, facts: Vec<String>) {
        if let Ok(mut held) = self.facts.lock() {
            *held = facts;
        }
    }

    /// What it saw so far.
    pub fn turns(&self) -> Vec<Turn> {
        self.seen.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Answers one request.
    pub fn answer(&self, request: &Recorded) -> Reply {
        let body = request.json();
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let texts: Vec<String> = messages.iter().map(|m| text(&m["content"])).collect();
        let input = texts.iter().map(|t| tokens(t) + 4).sum::<u64>() + 3;
        let all = texts.join("\n");
        let facts = self.facts.lock().map(|f| f.clone()).unwrap_or_default();
        let mut turn = Turn {
            tokens: input,
            asked_usage: body["stream_options"]["include_usage"] == true,
            stream: body["stream"] == true,
            facts_seen: facts.iter().filter(|f| all.contains(*f)).cloned().collect(),
            examples: all.contains(&self.example),
            messages: messages.len(),
            ..Turn::default()
        };
        let first = texts.first().map(String::as_str).unwrap_or("");
        let last = texts.last().map(String::as_str).unwrap_or("");
        let reply = if first.starts_with(CLIENT_SUMMARY_START) {
            turn.client_summary = true;
            "I asked you about the files in the chat, turn by turn.".to_owned()
        } else if first.starts_with(SUMMARY_PROMPT_START) {
            turn.handoff_summary = true;
            fact_summary(&body["messages"].to_string())
        } else {
            if input > self.window {
                turn.over_window = true;
                self.note(turn);
                let message = format!("This model's maximum context length is {} tokens. However, your messages resulted in {input} tokens. Please reduce the length of the messages.", self.window);
                return Reply::Json {
                    status: http::StatusCode::BAD_REQUEST,
                    body: json!({"error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
                };
            }
            let asked = Regex::new(r"Turn (\d+)\.")
                .ok()
                .and_then(|re| re.captures(last)?.get(1)?.as_str().parse::<u64>().ok());
            turn.turn = asked;
            task_reply(asked.unwrap_or(0), &all)
        };
        self.note(turn);
        chat_reply(
            &body,
            json!({"role": "assistant", "content": reply}),
            "stop",
            input,
        )
    }

    fn note(&self, turn: Turn) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.push(turn);
        }
    }
}

/// The answer to turn `n`: every third turn an edit of `counter.py` from the count the
/// request shows (the newest one, which is the file's current contents).
fn task_reply(n: u64, request: &str) -> String {
    let count = Regex::new(r"COUNT = (\d+)").ok().and_then(|re| {
        re.captures_iter(request)
            .last()?
            .get(1)?
            .as_str()
            .parse::<u64>()
            .ok()
    });
    let filler =
        "The files in the chat hold what you asked about; nothing else needs a change. ".repeat(4);
    match count {
        Some(count) if n.is_multiple_of(3) => format!(
            "Turn {n} done: bumping the counter.\n\ncounter.py\n```python\n<<<<<<< SEARCH\nCOUNT = {count}\n=======\nCOUNT = {}\n>>>>>>> REPLACE\n```\n",
            count + 1
        ),
        _ => format!("Turn {n} answered. {filler}"),
    }
}

/// Text of a string or of text parts.
fn text(content: &Value) -> String {
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}
