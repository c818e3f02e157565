//! A strict provider: it enforces a context window with its own token count and
//! rejects broken tool pairs the way OpenAI does, so a test can prove the proxy never
//! sends an invalid or over-window request. It plays an agent for normal requests and
//! a summariser for handoff summary requests, whose behaviour a test can switch.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use serde_json::{json, Value};
use tiktoken_rs::CoreBPE;

use crate::agent::{agent_reply_as, AgentStyle};
use crate::{Recorded, Reply};

/// How the summariser answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SummaryMode {
    /// A proper summary listing every `FACT-…` it was shown.
    Good,
    /// An empty summary.
    Empty,
    /// Cut by the output limit (`finish_reason: length`).
    Length,
    /// HTTP 500.
    ServerError,
    /// Answers after 30 s.
    Slow,
    /// Reasoning only, no text.
    ReasoningOnly,
    /// A proper summary, but HTTP 500 on this summary call (1-based, counted over the
    /// provider's life).
    FailCall(usize),
}

/// The strict provider's state, shared with the test.
pub struct Strict {
    window: u64,
    scale: f64,
    style: Mutex<AgentStyle>,
    summary_padding: AtomicUsize,
    keep_digit_words: std::sync::atomic::AtomicBool,
    serial: AtomicUsize,
    summary_mode: Mutex<SummaryMode>,
    /// Requests refused for size, with their count.
    pub over_window: Mutex<Vec<u64>>,
    /// Requests refused for broken tool pairs, with the reason.
    pub broken_pairs: Mutex<Vec<String>>,
    /// Summary requests received.
    pub summaries: AtomicUsize,
    /// The user message of every summary request, with its input tokens.
    pub summary_inputs: Mutex<Vec<(String, u64)>>,
}

fn bpe() -> Option<&'static CoreBPE> {
    static BPE: OnceLock<Option<CoreBPE>> = OnceLock::new();
    BPE.get_or_init(|| tiktoken_rs::o200k_base().ok()).as_ref()
}

/// The provider's token count of `text` (o200k).
pub fn text_tokens(text: &str) -> u64 {
    bpe().map_or(text.len() as u64 / 4, |b| {
        b.encode_ordinary(text).len() as u64
    })
}

/// The marker the summary prompt starts with.
pub const SUMMARY_PROMPT_START: &str = "You are writing a handoff";

impl Strict {
    /// A provider with a `window`-token context.
    pub fn new(window: u64) -> Arc<Self> {
        Self::scaled(window, 1.0)
    }

    /// A provider that counts `scale` times what its tokenizer counts, as many
    /// non-OpenAI models count more tokens than tiktoken for the same text.
    pub fn scaled(window: u64, scale: f64) -> Arc<Self> {
        Arc::new(Self {
            window,
            scale,
            style: Mutex::new(AgentStyle::default()),
            summary_padding: AtomicUsize::new(0),
            keep_digit_words: std::sync::atomic::AtomicBool::new(false),
            serial: AtomicUsize::new(0),
            summary_mode: Mutex::new(SummaryMode::Good),
            over_window: Mutex::new(Vec::new()),
            broken_pairs: Mutex::new(Vec::new()),
            summaries: AtomicUsize::new(0),
            summary_inputs: Mutex::new(Vec::new()),
        })
    }

    /// Switches how the agent writes its answers.
    pub fn set_style(&self, style: AgentStyle) {
        if let Ok(mut current) = self.style.lock() {
            *current = style;
        }
    }

    /// Makes each good summary about `words` words longer, as a real model's handoff
    /// of a long history is (the mock's own is a short list of facts).
    pub fn set_summary_padding(&self, words: usize) {
        self.summary_padding.store(words, Ordering::SeqCst);
    }

    /// Makes good summaries keep every word with a digit in it too (ids, numbers,
    /// amounts), as a perfect summariser of real tool output would.
    pub fn set_keep_digit_words(&self, keep: bool) {
        self.keep_digit_words.store(keep, Ordering::SeqCst);
    }

    /// Switches how summaries are answered.
    pub fn set_summary_mode(&self, mode: SummaryMode) {
        if let Ok(mut current) = self.summary_mode.lock() {
            *current = mode;
        }
    }

    /// The provider's own count of a request's input tokens.
    pub fn count(body: &Value) -> u64 {
        let text =
            |s: &str| bpe().map_or(s.len() as u64 / 4, |b| b.encode_ordinary(s).len() as u64);
        let mut total = 3;
        for message in body["messages"].as_array().into_iter().flatten() {
            total += 4;
            if let Some(content) = message["content"].as_str() {
                total += text(content);
            }
            for call in message["tool_calls"].as_array().into_iter().flatten() {
                total += text(call["function"]["name"].as_str().unwrap_or(""));
                total += text(call["function"]["arguments"].as_str().unwrap_or(""));
            }
        }
        if !body["tools"].is_null() {
            total += text(&body["tools"].to_string());
        }
        total
    }

    /// Answers one request.
    pub fn answer(&self, request: &Recorded) -> Reply {
        let body = request.json();
        if let Err(reason) = check_pairs(&body) {
            if let Ok(mut broken) = self.broken_pairs.lock() {
                broken.push(reason.clone());
            }
            return Reply::error(400, "invalid_request_error", &reason);
        }
        let tokens = (Self::count(&body) as f64 * self.scale).ceil() as u64;
        let output = body["max_tokens"]
            .as_u64()
            .or(body["max_completion_tokens"].as_u64())
            .unwrap_or(0);
        // A model named `…-16k` has a 16k window; every other model has `self.window`.
        let window = if body["model"].as_str().is_some_and(|m| m.ends_with("-16k")) {
            16_384
        } else {
            self.window
        };
        if tokens + output > window {
            if let Ok(mut over) = self.over_window.lock() {
                over.push(tokens);
            }
            return Reply::error(
                400,
                "context_length_exceeded",
                &format!("This model's maximum context length is {window} tokens. However, your messages resulted in {tokens} tokens."),
            );
        }
        let serial = self.serial.fetch_add(1, Ordering::SeqCst);
        if let Some(user) = summary_input(&body) {
            let call = self.summaries.fetch_add(1, Ordering::SeqCst) + 1;
            if let Ok(mut inputs) = self.summary_inputs.lock() {
                inputs.push((user, tokens));
            }
            let mode = match self.summary_mode.lock().map(|m| *m) {
                Ok(SummaryMode::FailCall(n)) if n == call => SummaryMode::ServerError,
                Ok(SummaryMode::FailCall(_)) => SummaryMode::Good,
                Ok(mode) => mode,
                Err(_) => SummaryMode::Good,
            };
            let padding = self.summary_padding.load(Ordering::SeqCst);
            let digits = self.keep_digit_words.load(Ordering::SeqCst);
            return summary_reply(&body, mode, tokens, padding, digits);
        }
        let style = self.style.lock().map(|s| *s).unwrap_or_default();
        with_usage(agent_reply_as(request, serial, style), tokens)
    }
}

/// The marker a summary call over the conversation itself ends with: its last user
/// turn is the handoff request.
pub const CONTINUED_MARKER: &str = "<handoff_request>";

/// What a summary call shows the summariser, when `body` is one: the user message of
/// a call that renders the history, or every message before the handoff request of a
/// call that continues the conversation (their texts and tool calls, in order).
pub fn summary_input(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    let system = messages.first()?["content"].as_str().unwrap_or("");
    if system.starts_with(SUMMARY_PROMPT_START) {
        return Some(
            messages.get(1)?["content"]
                .as_str()
                .unwrap_or("")
                .to_owned(),
        );
    }
    let (_, before) = messages.split_last()?;
    asks_continued_summary(&body["messages"]).then(|| conversation_text(before))
}

/// True when the last turn of `list` (a `messages`, `input` or `contents` list, in
/// any API's shape) is handoff's request for a handoff of the conversation before it.
pub fn asks_continued_summary(list: &Value) -> bool {
    let Some(last) = list.as_array().and_then(|l| l.last()) else {
        return false;
    };
    // Its text, or its last block's (a request appended to tool results).
    let text = match (&last["content"], &last["parts"]) {
        (Value::String(text), _) => text.clone(),
        (Value::Array(parts), _) | (_, Value::Array(parts)) => parts
            .last()
            .and_then(|p| p["text"].as_str())
            .unwrap_or("")
            .to_owned(),
        _ => String::new(),
    };
    last["role"] == "user" && text.starts_with(CONTINUED_MARKER)
}

/// True when `body` (any API's request) is one of handoff's summary calls: the summary
/// prompt as its system prompt, instructions or first message, or a handoff request as
/// the last turn of the conversation it continues.
pub fn is_summary(body: &Value) -> bool {
    let text = |value: &Value| match value {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .first()
            .and_then(|p| p["text"].as_str())
            .unwrap_or("")
            .to_owned(),
        _ => String::new(),
    };
    let openings = [
        text(&body["system"]),
        text(&body["instructions"]),
        text(&body["messages"][0]["content"]),
        text(&body["input"][0]["content"]),
        text(&body["systemInstruction"]["parts"]),
        text(&body["contents"][0]["parts"]),
    ];
    openings.iter().any(|t| t.starts_with(SUMMARY_PROMPT_START))
        || ["messages", "input", "contents"]
            .iter()
            .any(|list| asks_continued_summary(&body[*list]))
}

/// The texts and tool calls of `messages`, one per line.
pub fn conversation_text(messages: &[Value]) -> String {
    let mut out = String::new();
    for message in messages {
        match &message["content"] {
            Value::String(text) => out.push_str(text),
            Value::Array(parts) => {
                for part in parts {
                    out.push_str(part["text"].as_str().unwrap_or(""));
                    out.push('\n');
                }
            }
            _ => {}
        }
        out.push('\n');
        for call in message["tool_calls"].as_array().into_iter().flatten() {
            out.push_str(call["function"]["arguments"].as_str().unwrap_or(""));
            out.push('\n');
        }
    }
    out
}

fn with_usage(reply: Reply, prompt_tokens: u64) -> Reply {
    match reply {
        Reply::Json { status, mut body } => {
            body["usage"] = json!({"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": prompt_tokens + 5});
            Reply::Json { status, body }
        }
        other => other,
    }
}

fn summary_reply(
    body: &Value,
    mode: SummaryMode,
    prompt_tokens: u64,
    padding: usize,
    digit_words: bool,
) -> Reply {
    let input = summary_input(body).unwrap_or_default();
    let input = input.as_str();
    // Only the history and the handoff so far: the recent messages are reference only.
    let input = input
        .split("<retained_recent_messages")
        .next()
        .unwrap_or(input);
    let mut facts: Vec<&str> = input
        .split(|c: char| c.is_whitespace() || c == '"' || c == ',')
        .filter(|w| {
            w.starts_with("FACT-") || (digit_words && w.chars().any(|c| c.is_ascii_digit()))
        })
        .collect();
    facts.sort_unstable();
    facts.dedup();
    let usage = json!({"prompt_tokens": prompt_tokens, "completion_tokens": 40, "total_tokens": prompt_tokens + 40});
    let completion = |message: Value, finish: &str| {
        json!({"id": "chatcmpl-sum", "object": "chat.completion", "model": "mock-model",
               "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage})
    };
    // Two tokens each, as the numbered words they replace (numbers would read as ids).
    let detail = vec!["more detail"; padding];
    let text = handoff_text(
        &format!("Turns summarised. {}", detail.join(" ")),
        &facts.join(" "),
    );
    match mode {
        SummaryMode::Good | SummaryMode::FailCall(_) => Reply::json(completion(
            json!({"role": "assistant", "content": text}),
            "stop",
        )),
        SummaryMode::Empty => Reply::json(completion(
            json!({"role": "assistant", "content": ""}),
            "stop",
        )),
        SummaryMode::Length => Reply::json(completion(
            json!({"role": "assistant", "content": "## Goal\nKeep"}),
            "length",
        )),
        SummaryMode::ReasoningOnly => Reply::json(completion(
            json!({"role": "assistant", "content": "", "reasoning_content": "thinking about it"}),
            "stop",
        )),
        SummaryMode::ServerError => Reply::Json {
            status: http::StatusCode::INTERNAL_SERVER_ERROR,
            body: json!({"error": {"message": "summariser exploded", "type": "server_error"}, "usage": usage}),
        },
        SummaryMode::Slow => Reply::json(completion(
            json!({"role": "assistant", "content": text}),
            "stop",
        ))
        .delayed(Duration::from_secs(30)),
    }
}

/// OpenAI's pairing rule: every tool message answers a call of the assistant message
/// before it, and every call is answered before the next non-tool message.
pub fn check_pairs(body: &Value) -> Result<(), String> {
    let mut pending: HashSet<String> = HashSet::new();
    for (index, message) in body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let role = message["role"].as_str().unwrap_or("");
        if role == "tool" {
            let id = message["tool_call_id"].as_str().unwrap_or("");
            if !pending.remove(id) {
                return Err(format!(
                    "messages[{index}]: tool message {id} does not answer a preceding tool call"
                ));
            }
            continue;
        }
        if !pending.is_empty() {
            return Err(format!(
                "messages[{index}]: tool_calls {pending:?} have no tool messages"
            ));
        }
        if role == "assistant" {
            pending = message["tool_calls"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| c["id"].as_str().map(str::to_owned))
                .collect();
        }
    }
    if pending.is_empty() {
        Ok(())
    } else {
        Err(format!("tool_calls {pending:?} have no tool messages"))
    }
}

/// A handoff with every section of handoff's default prompt, as a good model writes
/// it: `completed` under Completed work, `facts` under Key tool results.
pub fn handoff_text(completed: &str, facts: &str) -> String {
    format!(
        "## Goal\nKeep helping the user.\n## Completed work\n{completed}\n## Pending work\nNone.\n\
         ## State in progress\nNone.\n## Files, commands and tests\nNone.\n\
         ## Key tool results\nRemembered facts: {facts}\n## User preferences and constraints\nNone.\n\
         ## Risks and next checks\nNone.\n"
    )
}

/// The summary the Messages and Responses mocks write: every `FACT-…` in `input`,
/// once each, in order, under every section of the default prompt.
pub fn fact_summary(input: &str) -> String {
    let mut facts: Vec<&str> = input
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))
        .filter(|w| w.starts_with("FACT-"))
        .collect();
    facts.sort_unstable();
    facts.dedup();
    handoff_text("Turns summarised.", &facts.join(" "))
}
