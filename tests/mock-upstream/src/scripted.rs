//! A scripted coding model for real agents (Claude Code, Codex CLI, opencode, Gemini
//! CLI): it speaks the Messages, Responses, chat-completions and Gemini wire formats as the real
//! providers do, as strictly as they are and no stricter, and plays one task: read
//! `notes_01.txt` … `notes_NN.txt` in order with the agent's own file tool, then
//! answer. The next file is read off the newest tool result (each file opens with
//! `FILE k of N`), so retries and compacted views never confuse it.
//!
//! What it enforces, with the providers' own error texts: a context window counted
//! with its own tokenizer (the overflow error of each API), tool pairing, and, on the
//! Messages API, signed thinking blocks: those of the current tool-use cycle must come
//! back unmodified; on the Gemini API, the signature of each step's first function
//! call in the current turn. What the real agents send and the real APIs take passes: `system`
//! messages inside `messages`, consecutive turns of one role, moving `cache_control`,
//! unknown fields. Final events are larger than a chunk (Responses echoes the tools in
//! `response.completed`), and every stream is sent in 4 KiB chunks.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{json, Value};

use crate::anthropic::blocks_of;
use crate::native::{compacted_window, Asked, Compactor, Refused};
use crate::strict::{asks_continued_summary, fact_summary, SUMMARY_PROMPT_START};
use crate::{Recorded, Reply};

/// Bytes per SSE chunk: final events span several.
const CHUNK: usize = 4096;

/// Which assistant turns think, when the request turns thinking on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Thinking {
    /// Every turn opens with a signed thinking block.
    Every,
    /// Odd steps only (adaptive thinking).
    Some,
}

/// What the model saw, for the test to assert on.
#[derive(Debug, Default)]
pub struct Seen {
    /// Requests refused for the window, with the provider's message.
    pub over_window: Vec<String>,
    /// Requests refused for their structure, with the provider's message.
    pub refused: Vec<String>,
    /// Agent requests answered (not summaries, not side requests).
    pub agent_turns: usize,
    /// Summary requests answered, with the headers each carried.
    pub summaries: Vec<http::HeaderMap>,
}

/// The scripted model's settings and state.
pub struct ScriptedCoder {
    window: u64,
    files: usize,
    dir: PathBuf,
    thinking: Thinking,
    key: u64,
    serial: AtomicUsize,
    // Tool-use ids answered with thinking, and the signature of that thinking.
    thought: Mutex<HashMap<String, String>>,
    /// What it saw.
    pub seen: Mutex<Seen>,
    /// The Responses API's own compaction: what it minted.
    pub compactor: Compactor,
    /// False for a server without the APIs' own compaction (a self-hosted Responses
    /// server, an Anthropic-compatible endpoint): its trigger, items, fields and
    /// endpoint are refused as such servers refuse them.
    native: std::sync::atomic::AtomicBool,
}

/// The text of file `k` of `n`: ~20 KB of numbered facts.
pub fn file_text(k: usize, n: usize) -> String {
    let mut out = format!("FILE {k:02} of {n:02}\n");
    for line in 1..=220 {
        out.push_str(&format!(
            "line {line:03}: FACT-{k:02}-{line:03} the setting k{k}_{line} holds {} for the service tier {}\n",
            (k * 7919 + line * 104_729) % 100_000,
            line % 7
        ));
    }
    out
}

/// Writes the task's files into `dir`.
pub fn write_files(dir: &std::path::Path, n: usize) -> std::io::Result<()> {
    for k in 1..=n {
        std::fs::write(dir.join(format!("notes_{k:02}.txt")), file_text(k, n))?;
    }
    Ok(())
}

/// The prompt an agent is given for the task.
pub fn task_prompt(n: usize) -> String {
    format!("Read the files notes_01.txt to notes_{n:02}.txt in this directory one at a time, in order, with your file-reading tool, then say DONE.")
}

/// The model's final answer.
pub const FINAL: &str = "DONE: all files read.";

impl ScriptedCoder {
    /// A model with a `window`-token context for a task of `files` files in `dir`.
    pub fn new(window: u64, files: usize, dir: PathBuf, thinking: Thinking) -> Arc<Self> {
        Arc::new(Self {
            window,
            files,
            dir,
            thinking,
            key: 0x5eed_cafe,
            serial: AtomicUsize::new(0),
            thought: Mutex::new(HashMap::new()),
            seen: Mutex::new(Seen::default()),
            compactor: Compactor::new(0x5eed_c0de),
            native: std::sync::atomic::AtomicBool::new(true),
        })
    }

    /// Turns the Responses API's own compaction off (or on again).
    pub fn set_native(&self, native: bool) {
        self.native.store(native, Ordering::SeqCst);
    }

    /// Answers one request.
    pub fn answer(&self, request: &Recorded) -> Reply {
        let body = request.json();
        let path = request.target.split('?').next().unwrap_or("");
        match path {
            "/v1/messages" => self.messages(request, &body),
            "/v1/responses" | "/v1/responses/compact" => self.responses(request, &body, path),
            "/v1/chat/completions" => self.chat(request, &body),
            _ if crate::gemini::generating(path).is_some() => self.gemini(request, &body, path),
            _ if path.ends_with(":countTokens") => Reply::json(json!({
                "totalTokens": count(&[&body["contents"], &body["generateContentRequest"]])
            })),
            _ => Reply::Json {
                status: http::StatusCode::NOT_FOUND,
                body: json!({"error": {"type": "not_found_error", "message": format!("no route {path}")}}),
            },
        }
    }

    fn sign(&self, text: &str) -> String {
        let mut hasher = DefaultHasher::new();
        self.key.hash(&mut hasher);
        text.hash(&mut hasher);
        format!("sig{:016x}", hasher.finish())
    }

    fn note(&self, update: impl FnOnce(&mut Seen)) {
        if let Ok(mut seen) = self.seen.lock() {
            update(&mut seen);
        }
    }

    fn over(&self, input: u64) -> Option<u64> {
        (input > self.window).then_some(input)
    }

    /// The step after the newest file read in `results` (tool-result texts).
    fn next_step<'a>(&self, results: impl Iterator<Item = &'a str>) -> usize {
        let newest = results
            .filter_map(|text| {
                let at = text.find("FILE ")?;
                text[at + 5..].get(..2)?.parse::<usize>().ok()
            })
            .max()
            .unwrap_or(0);
        newest + 1
    }

    fn file_path(&self, step: usize) -> String {
        self.dir
            .join(format!("notes_{step:02}.txt"))
            .display()
            .to_string()
    }

    // ---- Messages API -------------------------------------------------------------

    fn messages(&self, request: &Recorded, body: &Value) -> Reply {
        // An Anthropic-compatible endpoint without context management: the field is
        // an extra input.
        if !self.native.load(Ordering::SeqCst) {
            for field in ["context_management", "compaction"] {
                if body.get(field).is_some() {
                    let message = format!("{field}: Extra inputs are not permitted");
                    self.note(|s| s.refused.push(message.clone()));
                    return anthropic_error(&message);
                }
            }
        }
        let system = text_of(&body["system"]);
        let input = count(&[&body["system"], &body["messages"], &body["tools"]]);
        if system.starts_with(SUMMARY_PROMPT_START) || asks_continued_summary(&body["messages"]) {
            self.note(|s| s.summaries.push(request.headers.clone()));
            let text = fact_summary(&body["messages"].to_string());
            return anthropic_reply(body, vec![json!({"type": "text", "text": text})], input, 0);
        }
        if let Some(input) = self.over(input) {
            let message = format!(
                "prompt is too long: {input} tokens > {} maximum",
                self.window
            );
            self.note(|s| s.over_window.push(message.clone()));
            return anthropic_error(&message);
        }
        if let Err(message) = self.check_messages(body) {
            self.note(|s| s.refused.push(message.clone()));
            return anthropic_error(&message);
        }
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let results: Vec<String> = messages
            .iter()
            .filter(|m| m["role"] == "user")
            .flat_map(|m| blocks_of(m).into_iter())
            .filter(|b| b["type"] == "tool_result")
            .map(|b| text_of(&b["content"]))
            .collect();
        let has_tool = tool_named(&body["tools"], "Read");
        if !has_tool {
            // A side request (titles, topics): a short plain answer.
            return anthropic_reply(
                body,
                vec![json!({"type": "text", "text": "Reading notes"})],
                input,
                0,
            );
        }
        self.note(|s| s.agent_turns += 1);
        let step = self.next_step(results.iter().map(String::as_str));
        let serial = self.serial.fetch_add(1, Ordering::SeqCst);
        let thinking_on = body["thinking"]["type"]
            .as_str()
            .is_some_and(|t| t != "disabled");
        let think = thinking_on && (self.thinking == Thinking::Every || step % 2 == 1);
        let mut blocks = Vec::new();
        let mut signature = None;
        if think {
            let thought = format!("Step {step}: the next file to read is notes_{step:02}.txt.");
            let sig = self.sign(&thought);
            blocks.push(json!({"type": "thinking", "thinking": thought, "signature": sig}));
            signature = Some(sig);
        }
        if step > self.files {
            blocks.push(json!({"type": "text", "text": FINAL}));
        } else {
            let id = format!("toolu_{serial:05}");
            if let Some(sig) = signature {
                if let Ok(mut thought) = self.thought.lock() {
                    thought.insert(id.clone(), sig);
                }
            }
            blocks.push(json!({"type": "text", "text": format!("Reading notes_{step:02}.txt.")}));
            blocks.push(json!({"type": "tool_use", "id": id, "name": "Read",
                               "input": {"file_path": self.file_path(step)}}));
        }
        anthropic_reply(body, blocks, input, serial)
    }

    /// Tool pairing over turns (consecutive turns of a role are one, `system` messages
    /// are instructions), and the current cycle's thinking.
    fn check_messages(&self, body: &Value) -> Result<(), String> {
        let messages = body["messages"]
            .as_array()
            .ok_or("messages: Field required")?;
        // (role, blocks, index of the turn's first message)
        let mut turns: Vec<(String, Vec<Value>, usize)> = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            let role = message["role"].as_str().unwrap_or("").to_owned();
            if role == "system" {
                continue;
            }
            match turns.last_mut() {
                Some((last, blocks, _)) if *last == role => blocks.extend(blocks_of(message)),
                _ => turns.push((role, blocks_of(message), index)),
            }
        }
        let mut pending: Vec<String> = Vec::new();
        for (role, blocks, index) in &turns {
            if role == "user" {
                let lead = blocks
                    .iter()
                    .take_while(|b| b["type"] == "tool_result")
                    .count();
                for id in &pending {
                    let answered = blocks[..lead]
                        .iter()
                        .any(|b| b["tool_use_id"] == id.as_str());
                    if !answered {
                        return Err(format!("messages.{index}: `tool_use` ids were found without `tool_result` blocks immediately after: {id}. Each `tool_use` block must have a corresponding `tool_result` block in the next message."));
                    }
                }
                for block in &blocks[..lead] {
                    let id = block["tool_use_id"].as_str().unwrap_or("");
                    if !pending.iter().any(|p| p == id) {
                        return Err(format!("messages.{index}.content.0: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."));
                    }
                }
                pending.clear();
            } else {
                pending = blocks
                    .iter()
                    .filter(|b| b["type"] == "tool_use")
                    .filter_map(|b| b["id"].as_str().map(str::to_owned))
                    .collect();
            }
        }
        // The current cycle: the turns after the last user turn that is not only results.
        let start = turns
            .iter()
            .rposition(|(role, blocks, _)| {
                role == "user" && blocks.iter().any(|b| b["type"] != "tool_result")
            })
            .map_or(0, |i| i + 1);
        let thought = self.thought.lock().map(|t| t.clone()).unwrap_or_default();
        for (role, blocks, index) in &turns[start..] {
            if role != "assistant" {
                continue;
            }
            for block in blocks.iter().filter(|b| b["type"] == "thinking") {
                let text = block["thinking"].as_str().unwrap_or("");
                if block["signature"].as_str() != Some(self.sign(text).as_str()) {
                    return Err(format!(
                        "messages.{index}: Invalid `signature` in `thinking` block"
                    ));
                }
            }
            for block in blocks.iter().filter(|b| b["type"] == "tool_use") {
                let Some(sig) = block["id"].as_str().and_then(|id| thought.get(id)) else {
                    continue;
                };
                let kept = blocks
                    .iter()
                    .any(|b| b["type"] == "thinking" && b["signature"].as_str() == Some(sig));
                if !kept {
                    return Err(format!("messages.{index}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{}`. When `thinking` is enabled, the assistant turns of the current tool use cycle must keep their thinking blocks.", blocks.first().and_then(|b| b["type"].as_str()).unwrap_or("text")));
                }
            }
        }
        Ok(())
    }

    // ---- Responses API ------------------------------------------------------------

    fn responses(&self, request: &Recorded, body: &Value, path: &str) -> Reply {
        let sent: Vec<Value> = match &body["input"] {
            Value::Array(items) => items.clone(),
            Value::String(text) => vec![json!({"role": "user", "content": text})],
            _ => Vec::new(),
        };
        if !self.native.load(Ordering::SeqCst) {
            if let Some((status, code, message)) = crate::native::unsupported(path, body, &sent) {
                self.note(|s| s.refused.push(message.clone()));
                return Reply::Json {
                    status: http::StatusCode::from_u16(status)
                        .unwrap_or(http::StatusCode::BAD_REQUEST),
                    body: json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}}),
                };
            }
        }
        let asked = Asked::of(path, body, &sent);
        // The API reads a request from its latest compaction item on.
        let (mut items, compacted_step) = match self.compactor.window(&sent) {
            Ok(window) => window,
            Err(Refused(error)) => {
                let message = error["error"]["message"].as_str().unwrap_or("").to_owned();
                self.note(|s| s.refused.push(message));
                return Reply::Json {
                    status: http::StatusCode::BAD_REQUEST,
                    body: error,
                };
            }
        };
        if asked == Asked::Trigger {
            items.pop();
        }
        let instructions = body["instructions"].as_str().unwrap_or("");
        let window = Value::Array(items.clone());
        let input = count(&[&body["instructions"], &window, &body["tools"]]);
        let first_text = items
            .first()
            .map(|i| text_of(&i["content"]))
            .unwrap_or_default();
        if instructions.starts_with(SUMMARY_PROMPT_START)
            || first_text.starts_with(SUMMARY_PROMPT_START)
            || asks_continued_summary(&window)
        {
            self.note(|s| s.summaries.push(request.headers.clone()));
            let text = fact_summary(&window.to_string());
            return self.response(body, vec![message_item(0, &text)], input);
        }
        if let Some(input) = self.over(input) {
            let message = format!(
                "Your input exceeds the context window of this model. ({input} tokens > {})",
                self.window
            );
            self.note(|s| s.over_window.push(message.clone()));
            return Reply::Json {
                status: http::StatusCode::BAD_REQUEST,
                body: json!({"error": {"message": "Your input exceeds the context window of this model. Please adjust your input and try again.", "type": "invalid_request_error", "param": "input", "code": "context_length_exceeded"}}),
            };
        }
        if let Err(message) = crate::responses::check(&items) {
            self.note(|s| s.refused.push(message.clone()));
            return Reply::Json {
                status: http::StatusCode::BAD_REQUEST,
                body: json!({"error": {"message": message, "type": "invalid_request_error", "param": "input", "code": null}}),
            };
        }
        let results: Vec<String> = items
            .iter()
            .filter(|i| i["type"] == "function_call_output")
            .map(|i| text_of(&i["output"]))
            .collect();
        // What a compaction kept of the task: the files read before it, or the facts
        // of the files a summary in the window names.
        let step = self
            .next_step(results.iter().map(String::as_str))
            .max(compacted_step + 1)
            .max(summarised_step(&window.to_string()));
        match asked {
            Asked::Trigger => {
                return self.response(body, vec![self.compactor.mint(step - 1)], input);
            }
            Asked::Endpoint => {
                let output = compacted_window(&sent, self.compactor.mint(step - 1));
                return Reply::json(json!({
                    "id": format!("resp_{:05}", self.serial.fetch_add(1, Ordering::SeqCst)),
                    "object": "response.compaction", "created_at": 1_700_000_000, "output": output,
                    "usage": {"input_tokens": input, "output_tokens": 200, "total_tokens": input + 200,
                              "input_tokens_details": {"cached_tokens": 0},
                              "output_tokens_details": {"reasoning_tokens": 0}}}));
            }
            Asked::Threshold(_) | Asked::Nothing => {}
        }
        // Compacted first, when the input passed the client's threshold.
        let mut output = match asked {
            Asked::Threshold(threshold) if input > threshold => vec![self.compactor.mint(step - 1)],
            _ => Vec::new(),
        };
        if !tool_named(&body["tools"], "exec_command") {
            output.push(message_item(0, "Reading notes"));
            return self.response(body, output, input);
        }
        self.note(|s| s.agent_turns += 1);
        let serial = self.serial.fetch_add(1, Ordering::SeqCst);
        if step > self.files {
            output.push(message_item(serial, FINAL));
        } else {
            let arguments = json!({"cmd": format!("cat {}", self.file_path(step))}).to_string();
            output.push(
                json!({"id": format!("fc_{serial:05}"), "type": "function_call", "status": "completed",
                        "call_id": format!("call_{serial:05}"), "name": "exec_command", "arguments": arguments}),
            );
        }
        self.response(body, output, input)
    }

    fn response(&self, body: &Value, output: Vec<Value>, input: u64) -> Reply {
        let serial = self.serial.fetch_add(1, Ordering::SeqCst);
        // The real API echoes the request's settings, tools included, in the response.
        let response = json!({
            "id": format!("resp_{serial:05}"), "object": "response", "created_at": 1_700_000_000,
            "status": "completed", "model": body["model"], "output": output,
            "tools": body["tools"], "tool_choice": body["tool_choice"],
            "parallel_tool_calls": body["parallel_tool_calls"], "store": body["store"],
            "usage": {"input_tokens": input, "output_tokens": 20, "total_tokens": input + 20,
                      "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens_details": {"reasoning_tokens": 0}}
        });
        if body["stream"] == true {
            chunked(crate::responses::stream_events(&response))
        } else {
            Reply::json(response)
        }
    }

    // ---- Gemini API ---------------------------------------------------------------

    fn gemini(&self, request: &Recorded, body: &Value, path: &str) -> Reply {
        let (model, stream) = crate::gemini::generating(path).unwrap_or(("", false));
        let sse = request.target.contains("alt=sse");
        let contents = body["contents"].as_array().cloned().unwrap_or_default();
        let input = count(&[
            &body["systemInstruction"],
            &body["contents"],
            &body["tools"],
        ]);
        let system = text_of(&body["systemInstruction"]["parts"]);
        let first = contents
            .first()
            .map(|c| text_of(&c["parts"]))
            .unwrap_or_default();
        let serial = self.serial.fetch_add(1, Ordering::SeqCst);
        let answer = |parts: Vec<Value>| {
            let chunks = crate::gemini::chunks(model, &parts, input, serial);
            match (stream, sse) {
                (true, true) => chunked(crate::gemini::sse_events(&chunks)),
                (true, false) => Reply::json(Value::Array(chunks)),
                (false, _) => {
                    Reply::json(crate::gemini::whole(model, &joined(parts), input, serial))
                }
            }
        };
        if system.starts_with(SUMMARY_PROMPT_START) || first.starts_with(SUMMARY_PROMPT_START) {
            self.note(|s| s.summaries.push(request.headers.clone()));
            let text = fact_summary(&body["contents"].to_string());
            return answer(vec![json!({"text": text})]);
        }
        if let Some(input) = self.over(input) {
            let reply = crate::gemini::overflow(input, self.window);
            self.note(|s| {
                s.over_window
                    .push(format!("{input} tokens > {}", self.window))
            });
            return reply;
        }
        let signatures = self.thought.lock().map(|t| t.clone()).unwrap_or_default();
        let signed = |call: &Value| signatures.get(&call["args"].to_string()).cloned();
        if let Err(message) = crate::gemini::check(&contents, &signed) {
            self.note(|s| s.refused.push(message.clone()));
            return crate::gemini::error(400, "INVALID_ARGUMENT", &message);
        }
        let declares = body["tools"].as_array().into_iter().flatten().any(|tool| {
            tool["functionDeclarations"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|f| f["name"] == "read_file")
        });
        if !declares {
            // A side request (a next-speaker check, a title): JSON when it asks for it.
            let json_asked = body["generationConfig"]["responseMimeType"] == "application/json";
            let text = if json_asked {
                json!({"reasoning": "The model has finished its turn.", "next_speaker": "user"})
                    .to_string()
            } else {
                "Reading notes".to_owned()
            };
            return answer(vec![json!({"text": text})]);
        }
        self.note(|s| s.agent_turns += 1);
        let results: Vec<String> = contents
            .iter()
            .flat_map(|c| c["parts"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p.get("functionResponse").cloned())
            .map(|r| match &r["response"]["output"] {
                Value::String(text) => text.clone(),
                _ => r["response"].to_string(),
            })
            .collect();
        let step = self.next_step(results.iter().map(String::as_str));
        let thinking = body["generationConfig"]["thinkingConfig"].is_object();
        let include = body["generationConfig"]["thinkingConfig"]["includeThoughts"] == true;
        let mut parts = Vec::new();
        if include {
            parts.push(json!({"text": format!("**Next file**\n\nStep {step}: notes_{step:02}.txt."), "thought": true}));
        }
        if step > self.files {
            let mut done = json!({"text": FINAL});
            if thinking {
                done["thoughtSignature"] = json!(self.sign(FINAL));
            }
            parts.push(done);
            return answer(parts);
        }
        parts.push(json!({"text": "Reading "}));
        parts.push(json!({"text": format!("notes_{step:02}.txt.")}));
        let args = json!({"file_path": self.file_path(step)});
        let mut call = json!({"functionCall": {"name": "read_file", "args": args}});
        if thinking {
            let signature = self.sign(&args.to_string());
            if let Ok(mut thought) = self.thought.lock() {
                thought.insert(args.to_string(), signature.clone());
            }
            call["thoughtSignature"] = json!(signature);
        }
        parts.push(call);
        answer(parts)
    }

    // ---- Chat completions ---------------------------------------------------------

    fn chat(&self, request: &Recorded, body: &Value) -> Reply {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let input = count(&[&body["messages"], &body["tools"]]);
        let first = messages
            .first()
            .map(|m| text_of(&m["content"]))
            .unwrap_or_default();
        if first.starts_with(SUMMARY_PROMPT_START) || asks_continued_summary(&body["messages"]) {
            self.note(|s| s.summaries.push(request.headers.clone()));
            let text = fact_summary(&body["messages"].to_string());
            return chat_reply(
                body,
                json!({"role": "assistant", "content": text}),
                "stop",
                input,
            );
        }
        if let Some(input) = self.over(input) {
            let message = format!("This model's maximum context length is {} tokens. However, your messages resulted in {input} tokens. Please reduce the length of the messages.", self.window);
            self.note(|s| s.over_window.push(message.clone()));
            return Reply::Json {
                status: http::StatusCode::BAD_REQUEST,
                body: json!({"error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
            };
        }
        if let Err(message) = crate::strict::check_pairs(body) {
            self.note(|s| s.refused.push(message.clone()));
            return Reply::error(400, "invalid_request_error", &message);
        }
        if !tool_named(&body["tools"], "read") {
            return chat_reply(
                body,
                json!({"role": "assistant", "content": "Reading notes"}),
                "stop",
                input,
            );
        }
        self.note(|s| s.agent_turns += 1);
        let results: Vec<String> = messages
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| text_of(&m["content"]))
            .collect();
        let step = self.next_step(results.iter().map(String::as_str));
        let serial = self.serial.fetch_add(1, Ordering::SeqCst);
        if step > self.files {
            return chat_reply(
                body,
                json!({"role": "assistant", "content": FINAL}),
                "stop",
                input,
            );
        }
        let call = json!({"id": format!("call_{serial:05}"), "type": "function",
                          "function": {"name": "read", "arguments": json!({"filePath": self.file_path(step)}).to_string()}});
        chat_reply(
            body,
            json!({"role": "assistant", "content": null, "tool_calls": [call]}),
            "tool_calls",
            input,
        )
    }
}

/// The provider's token count of some request parts (o200k over their JSON).
/// The step after the newest file whose facts (`FACT-KK-…`) `text` names: a summary
/// of the files read so far stands for reading them.
fn summarised_step(text: &str) -> usize {
    (text.match_indices("FACT-"))
        .filter_map(|(at, _)| {
            let rest = text.get(at + 5..at + 8)?;
            rest.ends_with('-')
                .then(|| rest[..2].parse::<usize>().ok())
                .flatten()
        })
        .max()
        .map_or(0, |newest| newest + 1)
}

fn count(parts: &[&Value]) -> u64 {
    parts
        .iter()
        .filter(|p| !p.is_null())
        .map(|p| crate::strict::text_tokens(&p.to_string()))
        .sum()
}

fn tool_named(tools: &Value, name: &str) -> bool {
    tools.as_array().is_some_and(|tools| {
        tools
            .iter()
            .any(|t| t["name"] == name || t["function"]["name"] == name)
    })
}

/// Text of a string, of text blocks, or of anything else as JSON.
fn text_of(value: &Value) -> String {
    match value {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match &p["text"] {
                Value::String(text) => text.clone(),
                _ => text_of(&p["content"]),
            })
            .collect::<Vec<_>>()
            .join("\n"),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Parts as one reply holds them whole: adjacent plain text joined (a stream sends it
/// in pieces).
fn joined(parts: Vec<Value>) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for part in parts {
        let plain = |p: &Value| p["text"].is_string() && p.get("thought").is_none();
        match out.last_mut() {
            Some(last) if plain(last) && plain(&part) && last.get("thoughtSignature").is_none() => {
                let text = format!(
                    "{}{}",
                    last["text"].as_str().unwrap_or(""),
                    part["text"].as_str().unwrap_or("")
                );
                last["text"] = Value::String(text);
            }
            _ => out.push(part),
        }
    }
    out
}

fn message_item(serial: usize, text: &str) -> Value {
    json!({"id": format!("msg_{serial:05}"), "type": "message", "role": "assistant", "status": "completed",
           "content": [{"type": "output_text", "text": text, "annotations": []}]})
}

/// An SSE reply in 4 KiB chunks, whatever its events' boundaries.
fn chunked(events: Vec<String>) -> Reply {
    let whole = events.concat().into_bytes();
    let frames = whole
        .chunks(CHUNK)
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .collect();
    Reply::Sse {
        frames,
        gap: Duration::from_millis(1),
        cut_after: None,
    }
}

fn anthropic_error(message: &str) -> Reply {
    crate::anthropic::error(400, "invalid_request_error", message)
}

fn anthropic_reply(body: &Value, blocks: Vec<Value>, input: u64, serial: usize) -> Reply {
    let stop = if blocks.iter().any(|b| b["type"] == "tool_use") {
        "tool_use"
    } else {
        "end_turn"
    };
    let model = body["model"].as_str().unwrap_or("claude").to_owned();
    let usage = json!({"input_tokens": input, "output_tokens": 30,
                       "cache_read_input_tokens": 0, "cache_creation_input_tokens": 0});
    if body["stream"] != true {
        return Reply::json(
            json!({"id": format!("msg_{serial:05}"), "type": "message", "role": "assistant",
            "model": model, "content": blocks, "stop_reason": stop, "stop_sequence": null, "usage": usage}),
        );
    }
    let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
    let mut events = vec![event(
        "message_start",
        json!({"type": "message_start", "message": {
        "id": format!("msg_{serial:05}"), "type": "message", "role": "assistant", "model": model,
        "content": [], "stop_reason": null, "stop_sequence": null, "usage": usage}}),
    )];
    for (index, block) in blocks.iter().enumerate() {
        let (start, deltas) = match block["type"].as_str() {
            Some("thinking") => (
                json!({"type": "thinking", "thinking": "", "signature": ""}),
                vec![
                    json!({"type": "thinking_delta", "thinking": block["thinking"]}),
                    json!({"type": "signature_delta", "signature": block["signature"]}),
                ],
            ),
            Some("tool_use") => (
                json!({"type": "tool_use", "id": block["id"], "name": block["name"], "input": {}}),
                vec![
                    json!({"type": "input_json_delta", "partial_json": block["input"].to_string()}),
                ],
            ),
            _ => (
                json!({"type": "text", "text": ""}),
                vec![json!({"type": "text_delta", "text": block["text"]})],
            ),
        };
        events.push(event(
            "content_block_start",
            json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for delta in deltas {
            events.push(event(
                "content_block_delta",
                json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        events.push(event(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": index}),
        ));
    }
    events.push(event("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": 30}})));
    events.push(event("message_stop", json!({"type": "message_stop"})));
    chunked(events)
}

pub(crate) fn chat_reply(body: &Value, message: Value, finish: &str, input: u64) -> Reply {
    let usage =
        json!({"prompt_tokens": input, "completion_tokens": 20, "total_tokens": input + 20});
    if body["stream"] != true {
        return Reply::json(
            json!({"id": "chatcmpl-scripted", "object": "chat.completion", "created": 1_700_000_000,
            "model": body["model"], "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}),
        );
    }
    // As OpenAI: usage only when asked for, then `"usage":null` on every other chunk.
    let asked = body["stream_options"]["include_usage"] == true;
    let chunk = |delta: Value, finish: Value, usage: Value| {
        let mut data = json!({"id": "chatcmpl-scripted", "object": "chat.completion.chunk", "created": 1_700_000_000,
            "model": body["model"], "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]});
        if !usage.is_null() {
            data["choices"] = json!([]);
        }
        if asked {
            data["usage"] = usage;
        }
        format!("data: {data}\n\n")
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
        Value::Null,
    )];
    if let Some(text) = message["content"].as_str() {
        events.push(chunk(json!({"content": text}), Value::Null, Value::Null));
    }
    for (index, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        events.push(chunk(json!({"tool_calls": [{"index": index, "id": call["id"], "type": "function",
            "function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]}), Value::Null, Value::Null));
    }
    events.push(chunk(json!({}), json!(finish), Value::Null));
    if asked {
        events.push(chunk(Value::Null, Value::Null, usage));
    }
    events.push("data: [DONE]\n\n".to_owned());
    chunked(events)
}
