//! The `summarize` strategy: asks a model for a source-bound handoff.
//!
//! History and `retained_recent_messages` stay separate in the request; the recent
//! messages are marked reference only and the prompt forbids copying them. The request
//! must fit the summary model's window with `min(8192, window/10)` output and 5% of the
//! window as headroom; if it does not, only over-long tool bodies are shortened
//! (head+tail, marked), and if it still does not fit the attempt fails. User text and
//! tool arguments are never shortened.

#![forbid(unsafe_code)]

mod render;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{AttemptError, FailureReason, Strategy, StrategyInput, Summary};
use serde_json::{json, Map, Value};

pub use render::{render_request_text, RenderOptions};

/// The built-in prompt; `compaction.prompt_file` replaces it.
pub const DEFAULT_PROMPT: &str = include_str!("../../../config/prompts/summarize.md");

/// Largest summary output, in tokens.
const MAX_OUTPUT: u64 = 8192;

/// The LLM summary strategy.
pub struct Summarize {
    prompt: String,
    extra: Map<String, Value>,
}

impl Summarize {
    /// A strategy with `prompt` as system prompt and `extra` merged into each request.
    pub fn new(prompt: String, extra: Map<String, Value>) -> Self {
        Self { prompt, extra }
    }

    /// Output tokens reserved for the summary: `min(8192, window/10)`.
    pub fn output_budget(window: u64) -> u64 {
        MAX_OUTPUT.min(window / 10)
    }

    /// Input tokens the summary request may use: window − output − 5% headroom.
    pub fn input_allowance(window: u64) -> u64 {
        window.saturating_sub(Self::output_budget(window) + window / 20)
    }

    /// Builds the request body, shortening tool bodies only if the plain one does not fit.
    pub fn build_request(&self, input: &StrategyInput) -> Result<Value, AttemptError> {
        let window = input.model.summary_context_window;
        let allowance = Self::input_allowance(window);
        let mut measured = 0;
        for shorten in [false, true] {
            let user = render_request_text(
                input,
                RenderOptions {
                    shorten_tool_bodies: shorten,
                },
            );
            let messages = vec![
                json!({"role": "system", "content": self.prompt}),
                json!({"role": "user", "content": user}),
            ];
            measured = messages
                .iter()
                .map(|m| input.tokens.count_message(m))
                .sum::<u64>();
            if measured <= allowance {
                // A strategy may be given a smaller handoff budget than the seed's reserve.
                let output = Self::output_budget(window).min(input.budgets.handoff_tokens.max(1));
                return Ok(self.request_body(input, messages, output));
            }
        }
        Err(AttemptError::new(
            FailureReason::PrecheckFailed,
            format!(
                "summary input is {measured} tokens with tool bodies shortened; {} allows {allowance} (window {window} − output {} − 5% headroom)",
                input.model.summary_model,
                Self::output_budget(window)
            ),
        ))
    }

    fn request_body(&self, input: &StrategyInput, messages: Vec<Value>, output: u64) -> Value {
        let mut body = Map::new();
        body.insert("model".into(), json!(input.model.summary_model));
        body.insert("messages".into(), json!(messages));
        body.insert("max_tokens".into(), json!(output));
        body.insert("stream".into(), json!(false));
        for (key, value) in &self.extra {
            body.insert(key.clone(), value.clone());
        }
        // Reasoning models refuse max_tokens next to max_completion_tokens.
        if body.contains_key("max_completion_tokens") {
            body.remove("max_tokens");
        }
        Value::Object(body)
    }
}

/// Checks a summary reply: text present, not reasoning only, finished with `stop`.
pub fn validate_reply(status: u16, body: &Value) -> Result<Summary, AttemptError> {
    let usage = body.get("usage").filter(|u| !u.is_null()).cloned();
    if !(200..300).contains(&status) {
        let detail = body
            .pointer("/error/message")
            .and_then(Value::as_str)
            .unwrap_or("no error message");
        return Err(AttemptError::new(
            FailureReason::HttpError,
            format!("upstream answered {status}: {detail}"),
        )
        .with_usage(usage));
    }
    let choice = body.pointer("/choices/0").cloned().unwrap_or(Value::Null);
    let text = choice
        .pointer("/message/content")
        .and_then(Value::as_str)
        .unwrap_or("")
        .trim();
    let reasoning = ["reasoning_content", "reasoning"].iter().any(|key| {
        choice["message"][*key]
            .as_str()
            .is_some_and(|r| !r.trim().is_empty())
    });
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .unwrap_or("none");
    if text.is_empty() && reasoning {
        return Err(AttemptError::new(
            FailureReason::ReasoningOnly,
            "the summary has reasoning but no text",
        )
        .with_usage(usage));
    }
    if text.is_empty() {
        return Err(
            AttemptError::new(FailureReason::EmptySummary, "the summary is empty")
                .with_usage(usage),
        );
    }
    if finish != "stop" {
        return Err(AttemptError::new(
            FailureReason::FinishReason,
            format!("finish_reason is {finish:?}, not \"stop\": the summary may be cut short"),
        )
        .with_usage(usage));
    }
    Ok(Summary {
        text: text.to_owned(),
        usage,
    })
}

impl Strategy for Summarize {
    fn kind(&self) -> &'static str {
        "summarize"
    }

    fn summarize<'a>(
        &'a self,
        input: &'a StrategyInput,
    ) -> BoxFuture<'a, Result<Summary, AttemptError>> {
        async move {
            let body = self.build_request(input)?;
            let reply = input
                .client
                .complete(body)
                .await
                .map_err(|err| AttemptError::new(FailureReason::HttpError, err.to_string()))?;
            validate_reply(reply.status, &reply.body)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_follow_the_seed() {
        assert_eq!(Summarize::output_budget(128_000), 8192);
        assert_eq!(Summarize::output_budget(16_000), 1600);
        assert_eq!(Summarize::input_allowance(16_000), 16_000 - 1600 - 800);
    }

    #[test]
    fn each_invalid_reply_is_a_failed_attempt_with_usage() {
        let usage = json!({"prompt_tokens": 5, "completion_tokens": 1});
        let reply = |message: Value, finish: &str| json!({"choices": [{"message": message, "finish_reason": finish}], "usage": usage});
        let cases = [
            (
                200,
                reply(json!({"content": "  "}), "stop"),
                FailureReason::EmptySummary,
            ),
            (
                200,
                reply(json!({"content": "", "reasoning_content": "hmm"}), "stop"),
                FailureReason::ReasoningOnly,
            ),
            (
                200,
                reply(json!({"content": "half a sum"}), "length"),
                FailureReason::FinishReason,
            ),
            (
                500,
                json!({"error": {"message": "boom"}, "usage": usage}),
                FailureReason::HttpError,
            ),
        ];
        for (status, body, reason) in cases {
            let err = validate_reply(status, &body).unwrap_err();
            assert_eq!(err.reason, reason);
            assert_eq!(err.usage, Some(usage.clone()), "{reason:?} lost its usage");
        }
        let ok = validate_reply(
            200,
            &reply(
                json!({"content": "Goal: x", "reasoning_content": "secret"}),
                "stop",
            ),
        )
        .unwrap();
        assert_eq!(
            ok.text, "Goal: x",
            "the summary model's reasoning is never kept"
        );
    }
}

#[cfg(test)]
mod precheck_tests {
    use std::sync::Arc;

    use handoff_plugin_api::testing::{BytesPerFour, NoModel};
    use handoff_plugin_api::{Budgets, CancellationToken, ModelInfo, Unit};

    use super::*;

    fn input(window: u64, user_text: &str, tool_body: &str, arguments: &str) -> StrategyInput {
        StrategyInput {
            conversation_id: "c".into(),
            history: vec![
                Unit {
                    messages: vec![json!({"role": "user", "content": user_text})],
                },
                Unit {
                    messages: vec![
                        json!({"role": "assistant", "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "read", "arguments": arguments}}]}),
                        json!({"role": "tool", "tool_call_id": "t1", "content": tool_body}),
                    ],
                },
            ],
            retained_recent_messages: vec![json!({"role": "user", "content": "RECENT-ONLY"})],
            previous_handoff: None,
            model: ModelInfo {
                model: "m".into(),
                context_window: window,
                summary_model: "m".into(),
                summary_context_window: window,
            },
            budgets: Budgets {
                input_budget: window,
                handoff_tokens: 5000,
            },
            cancel: CancellationToken::new(),
            client: Arc::new(NoModel),
            tokens: Arc::new(BytesPerFour),
        }
    }

    #[test]
    fn only_tool_bodies_are_shortened_and_user_text_and_arguments_survive() {
        let user = format!("USER-START {} USER-END", "u".repeat(6000));
        let args = format!("{{\"path\": \"ARG-START{}ARG-END\"}}", "a".repeat(3000));
        let body = format!("BODY-START{}BODY-END", "b".repeat(40_000));
        let summarize = Summarize::new("prompt".into(), Map::new());
        // 40k of tool body does not fit a 12k-token window; shortened it does.
        let request = summarize
            .build_request(&input(12_000, &user, &body, &args))
            .unwrap();
        let text = request["messages"][1]["content"].as_str().unwrap();
        assert!(text.contains(&user), "user text was shortened");
        assert!(text.contains(&args), "tool arguments were shortened");
        assert!(text.contains("BODY-START") && text.contains("BODY-END"));
        assert!(text.contains("characters omitted by handoff"));
        assert!(text.contains("reference_only") && text.contains("RECENT-ONLY"));
        assert_eq!(request["max_tokens"], 1200);
    }

    #[test]
    fn input_that_still_does_not_fit_fails_the_precheck() {
        let user = "u".repeat(60_000);
        let err = Summarize::new("prompt".into(), Map::new())
            .build_request(&input(12_000, &user, "small", "{}"))
            .unwrap_err();
        assert_eq!(err.reason, FailureReason::PrecheckFailed);
    }
}
