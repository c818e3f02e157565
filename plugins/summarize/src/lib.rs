//! The `summarize` strategy: asks a model for a source-bound handoff.
//!
//! History and `retained_recent_messages` stay separate in the request; the recent
//! messages are marked reference only and the prompt forbids copying them. A request
//! must fit the summary model's window with `min(8192, window/10)` output and 5% of the
//! window as headroom. When the whole history does not fit one request, even with
//! over-long tool bodies shortened (head+tail, marked), it is *folded*: summarised in
//! parts ([`fold`]). With `parallel_calls` above 1 the parts are summarised at once and
//! merged by a last call ([`parallel`]), so a fold takes about two calls' time; with 1,
//! each call extends the handoff the previous call wrote. User text and tool arguments
//! are never shortened; a single unit that cannot fit, or a fold that needs more than
//! `max_calls` calls (its merges included), fails the attempt.

#![forbid(unsafe_code)]

pub mod check;
mod continued;
pub mod fold;
mod parallel;
mod render;

use futures_util::future::BoxFuture;
use futures_util::FutureExt;
use handoff_plugin_api::{
    sum_usage, AttemptError, FailureReason, Strategy, StrategyInput, Summary,
};
use serde_json::{json, Map, Value};

pub use continued::instruction as continued_instruction;
pub use fold::{plan_parts, Part, Room};
pub use render::{render_part, render_request_text, Position, RenderOptions};

/// The built-in prompt; `compaction.prompt_file` replaces it.
pub const DEFAULT_PROMPT: &str = include_str!("../../../config/prompts/summarize.md");

/// Largest summary output, in tokens.
const MAX_OUTPUT: u64 = 8192;

/// The LLM summary strategy.
pub struct Summarize {
    prompt: String,
    /// The prompt's sections, which every summary must have ([`check`]).
    sections: Vec<String>,
    extra: Map<String, Value>,
}

impl Summarize {
    /// A strategy with `prompt` as system prompt and `extra` merged into each request.
    pub fn new(prompt: String, extra: Map<String, Value>) -> Self {
        let sections = check::sections_of(&prompt);
        Self {
            prompt,
            sections,
            extra,
        }
    }

    /// Output tokens reserved for the summary: `min(8192, window/10)`.
    pub fn output_budget(window: u64) -> u64 {
        MAX_OUTPUT.min(window / 10)
    }

    /// Input tokens the summary request may use: window − output − 5% headroom.
    pub fn input_allowance(window: u64) -> u64 {
        window.saturating_sub(Self::output_budget(window) + window / 20)
    }

    /// The parts to summarise, one call each: the whole history in one part when it
    /// fits (tool bodies shortened if need be), else the fold's parts.
    pub fn plan(&self, input: &StrategyInput) -> Result<Vec<Part>, AttemptError> {
        let window = input.model.summary_context_window;
        let allowance = Self::input_allowance(window);
        let system = self.system_message();
        let prompt = input.tokens.count_message(&system);
        for shorten in [false, true] {
            let options = RenderOptions {
                shorten_tool_bodies: shorten,
            };
            let user = json!({"role": "user", "content": render_request_text(input, options)});
            if prompt + input.tokens.count_message(&user) <= allowance {
                let history = input
                    .history
                    .iter()
                    .map(|unit| render::render_unit(unit, options))
                    .collect();
                let recent = (!input.retained_recent_messages.is_empty())
                    .then(|| render::render_recent(&input.retained_recent_messages, options));
                return Ok(vec![Part { history, recent }]);
            }
        }
        // The frame of a folding call, and the handoff it carries at its largest: the
        // previous compaction's, or what a call may write. A parallel part carries none:
        // the previous handoff goes to the merge.
        let frame = json!({"role": "user", "content": render_part(Some(""), "", None, Position { index: 1, count: 2 })});
        let previous = input
            .previous_handoff
            .as_deref()
            .map_or(0, |text| input.tokens.count_text(text));
        let max_calls = input.budgets.max_calls.max(1);
        let in_sequence = || {
            let running = previous.max(self.output_tokens(input));
            plan_parts(
                input,
                Room {
                    allowance,
                    fixed: prompt + input.tokens.count_message(&frame) + running,
                    max_calls,
                },
            )
        };
        let Some(per) = self.per_merge(input, prompt, previous) else {
            return in_sequence();
        };
        let parts = plan_parts(
            input,
            Room {
                allowance,
                fixed: prompt + input.tokens.count_message(&frame),
                max_calls: u32::MAX,
            },
        )?;
        // One part without a running handoff is one call that must carry the previous
        // handoff too: planned as such.
        if parts.len() <= 1 {
            return in_sequence();
        }
        let needed = parts.len() + parallel::merge_calls(parts.len(), per);
        if needed > max_calls as usize {
            return Err(AttemptError::new(
                FailureReason::PrecheckFailed,
                format!(
                    "folding this history into a handoff needs {needed} summary calls to {} ({} parts and their merges); compaction.max_summary_calls allows {max_calls}",
                    input.model.summary_model,
                    parts.len()
                ),
            ));
        }
        Ok(parts)
    }

    /// How many part handoffs one merge call holds, when the fold runs in parallel
    /// (`parallel_calls` above 1 and room for at least two); `None` folds in sequence.
    fn per_merge(&self, input: &StrategyInput, prompt: u64, previous: u64) -> Option<usize> {
        if input.budgets.parallel_calls <= 1 {
            return None;
        }
        let allowance = Self::input_allowance(input.model.summary_context_window);
        let frame = input
            .tokens
            .count_text(&render::render_merge(Some(""), &[], 2, 0))
            + 64;
        let per = parallel::per_merge(
            allowance,
            prompt + frame,
            previous,
            self.output_tokens(input) + 16,
        );
        (per >= 2).then_some(per)
    }

    /// One summary call: its reply validated as a handoff of what `user` showed.
    async fn one_call(&self, input: &StrategyInput, user: &str) -> Result<Summary, AttemptError> {
        let reply = input
            .client
            .complete(self.request_body(input, user.to_owned()))
            .await
            .map_err(|err| AttemptError::new(FailureReason::HttpError, err.to_string()))?;
        let summary = validate_reply(reply.status, &reply.body)?;
        if let Err(wrong) = check::check(&summary.text, &self.sections, &self.prompt, user) {
            return Err(AttemptError::new(
                FailureReason::InvalidSummary,
                format!("the summary is not a handoff: {wrong}"),
            )
            .with_usage(summary.usage.clone()));
        }
        Ok(summary)
    }

    /// The request body of one call.
    pub fn request_body(&self, input: &StrategyInput, user: String) -> Value {
        let messages = vec![
            self.system_message(),
            json!({"role": "user", "content": user}),
        ];
        let mut body = Map::new();
        body.insert("model".into(), json!(input.model.summary_model));
        body.insert("messages".into(), json!(messages));
        body.insert("max_tokens".into(), json!(self.output_tokens(input)));
        body.insert("stream".into(), json!(false));
        // Reproducible summaries: greedy sampling unless summary_request_extra says else.
        body.insert("temperature".into(), json!(0));
        for (key, value) in &self.extra {
            body.insert(key.clone(), value.clone());
        }
        // Reasoning models refuse max_tokens next to max_completion_tokens.
        if body.contains_key("max_completion_tokens") {
            body.remove("max_tokens");
        }
        Value::Object(body)
    }

    fn system_message(&self) -> Value {
        json!({"role": "system", "content": self.prompt})
    }

    /// A strategy may be given a smaller handoff budget than the seed's reserve.
    fn output_tokens(&self, input: &StrategyInput) -> u64 {
        Self::output_budget(input.model.summary_context_window)
            .min(input.budgets.handoff_tokens.max(1))
    }

    /// Runs one call per part, each extending the handoff of the one before.
    async fn fold(&self, input: &StrategyInput, parts: Vec<Part>) -> Result<Summary, AttemptError> {
        let count = parts.len();
        let mut running = input.previous_handoff.clone();
        let mut usages: Vec<Value> = Vec::new();
        for (index, part) in parts.into_iter().enumerate() {
            let calls = index as u32;
            if index > 0 && input.cancel.is_cancelled() {
                return Err(AttemptError::new(
                    FailureReason::Cancelled,
                    "compaction cancelled between summary calls",
                )
                .with_usage(sum_usage(&usages))
                .with_calls(calls));
            }
            let user = render_part(
                running.as_deref(),
                &part.history,
                part.recent.as_deref(),
                Position { index, count },
            );
            let reply = input
                .client
                .complete(self.request_body(input, user.clone()))
                .await
                .map_err(|err| {
                    AttemptError::new(FailureReason::HttpError, err.to_string())
                        .with_usage(sum_usage(&usages))
                        .with_calls(calls + 1)
                })?;
            let at = |err: AttemptError, usages: &[Value]| {
                let message = if count > 1 {
                    format!("summary call {} of {count}: {}", index + 1, err.message)
                } else {
                    err.message.clone()
                };
                let mut all: Vec<&Value> = usages.iter().collect();
                all.extend(err.usage.as_ref());
                AttemptError::new(err.reason, message)
                    .with_usage(sum_usage(all))
                    .with_calls(calls + 1)
            };
            let summary =
                validate_reply(reply.status, &reply.body).map_err(|err| at(err, &usages))?;
            if let Err(wrong) = check::check(&summary.text, &self.sections, &self.prompt, &user) {
                // `at` adds the earlier calls' usage to this one's.
                let err = AttemptError::new(
                    FailureReason::InvalidSummary,
                    format!("the summary is not a handoff: {wrong}"),
                )
                .with_usage(summary.usage.clone());
                return Err(at(err, &usages));
            }
            usages.extend(summary.usage);
            running = Some(summary.text);
        }
        Ok(Summary {
            text: running.unwrap_or_default(),
            usage: sum_usage(&usages),
            calls: Some(count as u32),
        })
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
        calls: Some(1),
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
            // The conversation's own cached prefix first; the rendered history if that
            // call fails, its cost kept on the bill.
            let mut failed = None;
            if let Some(conversation) = input.conversation.as_deref() {
                if let Some(output) = self.continued_output(input, conversation) {
                    match self.continued(input, conversation, output).await {
                        Ok(summary) => return Ok(summary),
                        Err(err) if err.reason == FailureReason::Cancelled => return Err(err),
                        Err(err) => failed = Some(err),
                    }
                }
            }
            let rendered = self.rendered(input).await;
            match failed {
                None => rendered,
                Some(failed) => match rendered {
                    Ok(summary) => Ok(continued::after_failed(summary, &failed)),
                    Err(err) => {
                        let usages: Vec<&Value> =
                            err.usage.iter().chain(failed.usage.iter()).collect();
                        let usage = sum_usage(usages);
                        let calls = err.calls.unwrap_or(0) + failed.calls.unwrap_or(1);
                        Err(AttemptError::new(
                            err.reason,
                            format!(
                                "{} (a call over the cached conversation failed first: {})",
                                err.message, failed.message
                            ),
                        )
                        .with_usage(usage)
                        .with_calls(calls))
                    }
                },
            }
        }
        .boxed()
    }

    fn max_model_calls(&self, input: &StrategyInput) -> u32 {
        input.budgets.max_calls.max(1) + u32::from(input.conversation.is_some())
    }
}

impl Summarize {
    /// The history rendered as text in the summary request: one call, or a fold.
    async fn rendered(&self, input: &StrategyInput) -> Result<Summary, AttemptError> {
        {
            let parts = self.plan(input)?;
            let prompt = input.tokens.count_message(&self.system_message());
            let previous = input
                .previous_handoff
                .as_deref()
                .map_or(0, |text| input.tokens.count_text(text));
            match self.per_merge(input, prompt, previous) {
                Some(per) if parts.len() > 1 => parallel::fold(self, input, parts, per).await,
                _ => self.fold(input, parts).await,
            }
        }
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

    use handoff_plugin_api::{testing, Unit};

    use super::*;

    fn input(window: u64, user_text: &str, tool_body: &str, arguments: &str) -> StrategyInput {
        {
            let history = vec![
                Unit {
                    messages: vec![json!({"role": "user", "content": user_text})],
                },
                Unit {
                    messages: vec![
                        json!({"role": "assistant", "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "read", "arguments": arguments}}]}),
                        json!({"role": "tool", "tool_call_id": "t1", "content": tool_body}),
                    ],
                },
            ];
            let mut input = testing::input(history, window, 5000);
            input.retained_recent_messages =
                vec![json!({"role": "user", "content": "RECENT-ONLY"})];
            input.budgets.max_calls = 8;
            input
        }
    }

    #[test]
    fn only_tool_bodies_are_shortened_and_user_text_and_arguments_survive() {
        let user = format!("USER-START {} USER-END", "u".repeat(6000));
        let args = format!("{{\"path\": \"ARG-START{}ARG-END\"}}", "a".repeat(3000));
        let body = format!("BODY-START{}BODY-END", "b".repeat(40_000));
        let summarize = Summarize::new("prompt".into(), Map::new());
        let input = input(12_000, &user, &body, &args);
        // 40k of tool body does not fit a 12k-token window; shortened it does.
        let parts = summarize.plan(&input).unwrap();
        assert_eq!(parts.len(), 1, "one call when the shortened history fits");
        let text = &parts[0].history;
        assert!(text.contains(&user), "user text was shortened");
        assert!(text.contains(&args), "tool arguments were shortened");
        assert!(text.contains("BODY-START") && text.contains("BODY-END"));
        assert!(text.contains("characters omitted by handoff"));
        let recent = parts[0].recent.as_deref().unwrap();
        assert!(recent.contains("reference_only") && recent.contains("RECENT-ONLY"));
        assert_eq!(
            summarize.request_body(&input, String::new())["max_tokens"],
            1200
        );
    }

    #[test]
    fn a_unit_that_cannot_fit_one_call_fails_the_precheck() {
        let user = "u".repeat(60_000);
        let err = Summarize::new("prompt".into(), Map::new())
            .plan(&input(12_000, &user, "small", "{}"))
            .unwrap_err();
        assert_eq!(err.reason, FailureReason::PrecheckFailed);
        assert!(err.message.contains("unit 1 of 2"), "{}", err.message);
    }

    /// A history of `units` user messages of about `tokens` tokens each.
    fn long_input(window: u64, units: usize, tokens: usize, max_calls: u32) -> StrategyInput {
        let mut input = input(window, "x", "small", "{}");
        input.history = (0..units)
            .map(|n| Unit {
                messages: vec![json!({"role": "user", "content": format!("MARK-{n:03} {}", "w".repeat(tokens * 4))})],
            })
            .collect();
        input.budgets.max_calls = max_calls;
        input
    }

    #[test]
    fn a_long_history_is_folded_into_parts_that_each_fit_in_order() {
        let summarize = Summarize::new("prompt".into(), Map::new());
        // 40 units of 1,000 tokens against a 16k window: about 3 units' worth per call.
        let input = long_input(16_000, 40, 1000, 8);
        let parts = summarize.plan(&input).unwrap();
        assert!(parts.len() >= 4, "{} parts", parts.len());
        let joined: String = parts.iter().map(|p| p.history.as_str()).collect();
        let marks: Vec<usize> = joined.match_indices("MARK-").map(|(i, _)| i).collect();
        assert_eq!(marks.len(), 40, "every unit once");
        assert!(joined.contains("MARK-000") && joined.contains("MARK-039"));
        for (index, part) in parts.iter().enumerate() {
            let user = render_part(
                Some(&"h ".repeat(1600)),
                &part.history,
                part.recent.as_deref(),
                Position {
                    index,
                    count: parts.len(),
                },
            );
            let body = summarize.request_body(&input, user);
            let measured: u64 = body["messages"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| input.tokens.count_message(m))
                .sum();
            assert!(
                measured <= Summarize::input_allowance(16_000),
                "part {index} is {measured} tokens"
            );
        }
        assert!(
            parts.last().unwrap().recent.is_some(),
            "the recent messages go with the last part"
        );
        assert!(parts[..parts.len() - 1].iter().all(|p| p.recent.is_none()));
    }

    #[test]
    fn a_fold_past_max_calls_fails_the_precheck_with_the_count_needed() {
        let summarize = Summarize::new("prompt".into(), Map::new());
        let err = summarize
            .plan(&long_input(16_000, 40, 1000, 2))
            .unwrap_err();
        assert_eq!(err.reason, FailureReason::PrecheckFailed);
        let needed = summarize
            .plan(&long_input(16_000, 40, 1000, 100))
            .unwrap()
            .len();
        assert!(
            err.message
                .contains(&format!("needs {needed} summary calls"))
                && err.message.contains("allows 2"),
            "{}",
            err.message
        );
    }

    /// Answers each call with the marks it was shown, and fails call `fail_at` (1-based).
    struct Folder {
        calls: std::sync::Mutex<Vec<String>>,
        fail_at: usize,
    }

    impl handoff_plugin_api::ModelClient for Folder {
        fn complete(
            &self,
            body: Value,
        ) -> BoxFuture<'_, Result<handoff_plugin_api::ModelReply, handoff_plugin_api::ModelCallError>>
        {
            let user = body["messages"][1]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            let mut calls = self.calls.lock().unwrap();
            calls.push(user.clone());
            let n = calls.len();
            let marks: Vec<&str> = user
                .split_whitespace()
                .filter(|w| w.starts_with("MARK-"))
                .collect();
            let status = if n == self.fail_at { 500 } else { 200 };
            let reply = json!({
                "choices": [{"message": {"role": "assistant", "content": format!("## Goal\n{}", marks.join(" "))}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 100 * n, "completion_tokens": 10}
            });
            Box::pin(async move {
                Ok(handoff_plugin_api::ModelReply {
                    status,
                    body: reply,
                })
            })
        }
    }

    #[tokio::test]
    async fn each_call_extends_the_running_handoff_and_usage_adds_up() {
        let summarize = Summarize::new("prompt".into(), Map::new());
        let mut input = long_input(16_000, 40, 1000, 8);
        let client = Arc::new(Folder {
            calls: Default::default(),
            fail_at: 0,
        });
        input.client = client.clone();
        let summary = summarize.summarize(&input).await.unwrap();
        let calls = client.calls.lock().unwrap().clone();
        let n = calls.len();
        assert!(n >= 4);
        assert_eq!(summary.calls, Some(n as u32));
        for mark in (0..40).map(|m| format!("MARK-{m:03}")) {
            assert!(summary.text.contains(&mark), "{mark} lost in the fold");
        }
        assert!(!calls[0].starts_with("<running_handoff>"));
        for call in &calls[1..] {
            assert!(
                call.starts_with("<running_handoff>\n## Goal\nMARK-000"),
                "{}",
                &call[..80]
            );
            assert!(call.contains("You are extending a running handoff"));
        }
        let prompt: u64 = (1..=n as u64).map(|k| 100 * k).sum();
        assert_eq!(
            summary.usage,
            Some(json!({"prompt_tokens": prompt, "completion_tokens": 10 * n}))
        );
    }

    #[tokio::test]
    async fn a_failed_call_fails_the_attempt_with_its_calls_and_summed_usage() {
        let summarize = Summarize::new("prompt".into(), Map::new());
        let mut input = long_input(16_000, 40, 1000, 8);
        input.client = Arc::new(Folder {
            calls: Default::default(),
            fail_at: 2,
        });
        let err = summarize.summarize(&input).await.unwrap_err();
        assert_eq!(err.reason, FailureReason::HttpError);
        assert_eq!(err.calls, Some(2));
        assert_eq!(
            err.usage,
            Some(json!({"prompt_tokens": 300, "completion_tokens": 20}))
        );
        assert!(
            err.message.starts_with("summary call 2 of"),
            "{}",
            err.message
        );
    }
}

#[cfg(test)]
mod parallel_tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use handoff_plugin_api::testing;
    use handoff_plugin_api::{ModelCallError, ModelClient, ModelReply, Unit};

    use super::*;

    /// Answers each call after `delay` with the marks it was shown (a merge call with
    /// `merge_answer` when set), and counts the calls in flight at once.
    struct Slow {
        delay: Duration,
        calls: Mutex<Vec<String>>,
        in_flight: Mutex<(usize, usize)>,
        merge_answer: Option<String>,
    }

    impl ModelClient for Slow {
        fn complete(&self, body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
            let user = body["messages"][1]["content"]
                .as_str()
                .unwrap_or("")
                .to_owned();
            self.calls.lock().unwrap().push(user.clone());
            Box::pin(async move {
                {
                    let mut flight = self.in_flight.lock().unwrap();
                    flight.0 += 1;
                    flight.1 = flight.1.max(flight.0);
                }
                tokio::time::sleep(self.delay).await;
                self.in_flight.lock().unwrap().0 -= 1;
                let marks: Vec<&str> = user
                    .split_whitespace()
                    .filter(|w| w.starts_with("MARK-"))
                    .collect();
                let text = match (&self.merge_answer, user.contains("<part_handoff")) {
                    (Some(answer), true) => answer.clone(),
                    _ => format!("## Goal\n{}", marks.join(" ")),
                };
                Ok(ModelReply {
                    status: 200,
                    body: json!({
                        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
                        "usage": {"prompt_tokens": 100, "completion_tokens": 10}
                    }),
                })
            })
        }
    }

    fn slow(delay: u64, merge_answer: Option<&str>) -> Arc<Slow> {
        Arc::new(Slow {
            delay: Duration::from_secs(delay),
            calls: Mutex::default(),
            in_flight: Mutex::default(),
            merge_answer: merge_answer.map(str::to_owned),
        })
    }

    /// A history of four parts' worth on a 16k summary model, folded 4 at a time.
    fn four_parts(client: Arc<Slow>) -> StrategyInput {
        let history = (0..16)
            .map(|n| Unit {
                messages: vec![json!({"role": "user", "content": format!("MARK-{n:03} {}", "w".repeat(12_000))})],
            })
            .collect();
        let mut input = testing::input(history, 16_000, 1600);
        input.budgets.max_calls = 8;
        input.budgets.parallel_calls = 4;
        input.previous_handoff = Some("## Goal\nMARK-PREV earlier".into());
        input.client = client;
        input
    }

    #[tokio::test(start_paused = true)]
    async fn a_fold_of_four_parts_runs_at_once_and_one_merge_ends_it_in_two_calls_time() {
        let client = slow(3, None);
        let input = four_parts(Arc::clone(&client));
        let summarize = Summarize::new("prompt".into(), Map::new());
        let parts = summarize.plan(&input).unwrap();
        assert_eq!(parts.len(), 4, "the history needs four parts");
        let started = tokio::time::Instant::now();
        let summary = summarize.summarize(&input).await.unwrap();
        // Two rounds of 3 s: the parts together, then their merge.
        assert!(
            started.elapsed() <= Duration::from_secs(7),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(
            client.in_flight.lock().unwrap().1,
            4,
            "the four parts at once"
        );
        let calls = client.calls.lock().unwrap().clone();
        assert_eq!(calls.len(), 5);
        assert_eq!(summary.calls, Some(5));
        assert_eq!(
            summary.usage,
            Some(json!({"prompt_tokens": 500, "completion_tokens": 50}))
        );
        let merge = &calls[4];
        assert!(
            merge.starts_with("<previous_handoff>\n## Goal\nMARK-PREV"),
            "{merge}"
        );
        assert_eq!(merge.matches("<part_handoff part=").count(), 4);
        for mark in (0..16)
            .map(|m| format!("MARK-{m:03}"))
            .chain(["MARK-PREV".into()])
        {
            assert!(summary.text.contains(&mark), "{mark} lost in the fold");
        }
        // No part carries a running handoff: each is summarised alone.
        assert!(calls[..4].iter().all(|c| !c.contains("MARK-PREV")));
    }

    #[tokio::test(start_paused = true)]
    async fn a_merge_that_is_not_a_handoff_fails_the_attempt_with_every_call_counted() {
        // The merge names an id no part handoff showed.
        let client = slow(
            1,
            Some("## Goal\nMARK-000 /etc/a1.rs /etc/b2.rs /srv/c3.rs INV-99887"),
        );
        let input = four_parts(Arc::clone(&client));
        let summarize = Summarize::new("prompt".into(), Map::new());
        let err = summarize.summarize(&input).await.unwrap_err();
        assert_eq!(err.reason, FailureReason::InvalidSummary, "{}", err.message);
        assert_eq!(err.calls, Some(5));
        assert!(
            err.message.starts_with("summary call 5 of 5"),
            "{}",
            err.message
        );
        assert_eq!(
            err.usage,
            Some(json!({"prompt_tokens": 500, "completion_tokens": 50}))
        );
    }

    #[test]
    fn the_precheck_counts_the_merges() {
        let summarize = Summarize::new("prompt".into(), Map::new());
        let mut input = four_parts(slow(0, None));
        input.budgets.max_calls = 4;
        let err = summarize.plan(&input).unwrap_err();
        assert_eq!(err.reason, FailureReason::PrecheckFailed);
        assert!(
            err.message.contains("needs 5 summary calls") && err.message.contains("4 parts"),
            "{}",
            err.message
        );
    }
}
