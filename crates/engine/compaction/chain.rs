//! Running the strategy chain: each strategy in order until one produces a handoff,
//! each attempt timed out, recorded with its outcome and usage, and the whole run
//! abandoned if it is cancelled.

use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::HashMap;

use futures_util::FutureExt;
use handoff_plugin_api::{
    AttemptError, FailureReason, Strategy, StrategyInput, Summary, TokenCounter, Unit,
};
use serde_json::{json, Map, Value};

use crate::base::record::Attempt;
use crate::config::Tokenizer;

/// A chain of strategies, first to last: built once per config and shared by the
/// requests that select it.
pub type Chain = Arc<[NamedStrategy]>;

/// A strategy with its name in the chain and its own settings.
#[derive(Clone)]
pub struct NamedStrategy {
    /// The name used in config and records.
    pub name: String,
    /// The strategy.
    pub strategy: Arc<dyn Strategy>,
    /// Its time limit; `compaction.summary_timeout` when unset.
    pub timeout: Option<Duration>,
    /// Its own summary model, when it has one.
    pub summary_model: Option<SummaryModel>,
    /// Tool output kept whole when pruning (tokens); no pruning when unset.
    pub prune: Option<u64>,
    /// Its own, smaller, handoff budget in tokens.
    pub handoff_tokens: Option<u64>,
}

/// A strategy's own summary model and what the models table says of it.
#[derive(Debug, Clone)]
pub struct SummaryModel {
    /// The model name sent.
    pub name: String,
    /// Its window, when configured.
    pub window: Option<u64>,
    /// Its tokenizer, when configured.
    pub tokenizer: Option<Tokenizer>,
}

/// What an input's token counter counts for.
#[derive(Debug, Clone, Copy)]
pub(crate) enum CountFor<'a> {
    /// Summary requests to the chain's default summary model (`None`) or a strategy's
    /// own: that model's tokenizer and calibration.
    Summary(Option<&'a SummaryModel>),
    /// The handoff itself, which the request's model reads: a deterministic strategy
    /// sizes its text with the request model's counts, within the whole handoff budget.
    Handoff,
}

/// Gives an input the token counter (and client) of what it counts for.
pub(crate) type Equip<'a> = dyn Fn(&mut StrategyInput, CountFor<'_>) + Sync + 'a;

impl NamedStrategy {
    /// The input this strategy sees: its own summary model, pruned tool output, and
    /// for a deterministic strategy the request model's counts (`input` counts for the
    /// chain's summary model).
    fn input_for(&self, input: &StrategyInput, equip: &Equip<'_>) -> Option<StrategyInput> {
        let deterministic = self.strategy.is_deterministic();
        if !deterministic
            && self.summary_model.is_none()
            && self.prune.is_none()
            && self.handoff_tokens.is_none()
        {
            return None;
        }
        let mut own = input.clone();
        if let Some(model) = &self.summary_model {
            own.model.summary_model = model.name.clone();
            own.model.summary_context_window = model.window.unwrap_or(input.model.context_window);
            equip(&mut own, CountFor::Summary(Some(model)));
        }
        // Last: a deterministic strategy given a summary model (the built-in extract
        // is, for its settings' sake) still counts what the request model reads.
        if deterministic {
            equip(&mut own, CountFor::Handoff);
        }
        // After equipping, which may give a deterministic strategy a budget of its own.
        if let Some(limit) = self.handoff_tokens {
            own.budgets.handoff_tokens = own.budgets.handoff_tokens.min(limit);
        }
        if let Some(keep) = self.prune {
            own.history = prune_tool_outputs(&input.history, keep, own.tokens.as_ref());
        }
        // The conversation continued is the request model's, and holds every tool
        // output whole: a strategy with another model, or pruned output, renders.
        if self.prune.is_some() || own.model.summary_model != own.model.model {
            own.conversation = None;
        }
        Some(own)
    }
}

/// Replaces old tool results by placeholders that keep the tool name and the size;
/// the newest `keep_tokens` of tool output stay whole.
pub(crate) fn prune_tool_outputs(
    history: &[Unit],
    keep_tokens: u64,
    tokens: &dyn TokenCounter,
) -> Vec<Unit> {
    let mut kept = 0;
    let mut out: Vec<Unit> = history.to_vec();
    for unit in out.iter_mut().rev() {
        let names: HashMap<String, String> = unit
            .messages
            .iter()
            .flat_map(|m| {
                m.get("tool_calls")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default()
            })
            .filter_map(|call| {
                let id = call.get("id")?.as_str()?.to_owned();
                let name = call.pointer("/function/name")?.as_str()?.to_owned();
                Some((id, name))
            })
            .collect();
        for message in unit.messages.iter_mut().rev() {
            if message.get("role").and_then(Value::as_str) != Some("tool") {
                continue;
            }
            let text = message
                .get("content")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let cost = tokens.count_text(&text);
            if kept + cost <= keep_tokens {
                kept += cost;
                continue;
            }
            kept = keep_tokens;
            let id = message
                .get("tool_call_id")
                .and_then(Value::as_str)
                .unwrap_or("");
            let name = names.get(id).map_or("tool", String::as_str);
            message["content"] = json!(format!(
                "[{name} output pruned by handoff: {} characters]",
                text.chars().count()
            ));
        }
    }
    out
}

/// What a chain run produced.
pub(crate) struct ChainOutcome {
    /// The strategy name and summary that succeeded, if any.
    pub summary: Option<(String, Summary)>,
    /// Every attempt, in order.
    pub attempts: Vec<Attempt>,
}

fn reason_name(reason: FailureReason) -> String {
    serde_json::to_value(reason)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_else(|| "failed".into())
}

/// Tries each strategy of `chain` until one succeeds or the run is cancelled.
pub(crate) async fn run_chain(
    chain: &[NamedStrategy],
    input: &StrategyInput,
    timeout: Duration,
    equip: &Equip<'_>,
) -> ChainOutcome {
    let mut attempts = Vec::new();
    for named in chain {
        if input.cancel.is_cancelled() {
            break;
        }
        let started = Instant::now();
        let mut own = named.input_for(input, equip);
        let input_for = own.as_ref().unwrap_or(input);
        let model =
            (!named.strategy.is_deterministic()).then(|| input_for.model.summary_model.clone());
        // The time limit is per model call: a folding attempt gets it once per call.
        let calls = named.strategy.max_model_calls(input_for).max(1);
        let timeout = named.timeout.unwrap_or(timeout) * calls;
        let attempt = match own.take_if(|_| named.strategy.is_deterministic()) {
            Some(own) => off_thread(Arc::clone(&named.strategy), own).boxed(),
            None => named.strategy.summarize(own.as_ref().unwrap_or(input)),
        };
        let result = tokio::select! {
            () = input.cancel.cancelled() => Err(AttemptError::new(FailureReason::Cancelled, "compaction cancelled")),
            timed = tokio::time::timeout(timeout, attempt) => match timed {
                Ok(result) => result,
                Err(_) => Err(AttemptError::new(FailureReason::Timeout, format!("no summary within {timeout:?}"))),
            },
        };
        let duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        match result {
            Ok(summary) => {
                attempts.push(Attempt {
                    strategy: named.name.clone(),
                    outcome: "ok".into(),
                    reason: None,
                    error: None,
                    usage: summary.usage.clone(),
                    calls: summary.calls,
                    model,
                    duration_ms,
                });
                return ChainOutcome {
                    summary: Some((named.name.clone(), summary)),
                    attempts,
                };
            }
            Err(err) => {
                // Upstream errors quote key fragments ("Incorrect API key provided: sk-…"):
                // they reach the log, the record and admin answers only scrubbed.
                let message = crate::redact::scrub_secrets(&err.message).into_owned();
                tracing::warn!(strategy = %named.name, reason = ?err.reason, error = %message, "compaction attempt failed");
                attempts.push(Attempt {
                    strategy: named.name.clone(),
                    outcome: "failed".into(),
                    reason: Some(reason_name(err.reason)),
                    error: Some(message),
                    usage: err.usage,
                    calls: err.calls,
                    model: model.clone(),
                    duration_ms,
                });
            }
        }
    }
    ChainOutcome {
        summary: None,
        attempts,
    }
}

/// A deterministic strategy's attempt, on the blocking pool: it is CPU work only (a
/// 200k-token history takes milliseconds to tens of them), which on a worker thread
/// would hold every other connection that thread serves.
async fn off_thread(
    strategy: Arc<dyn Strategy>,
    input: StrategyInput,
) -> Result<Summary, AttemptError> {
    // The blocking pool's threads are inside the runtime's context: a strategy that
    // awaits a timer or a process still can.
    let work = move || tokio::runtime::Handle::current().block_on(strategy.summarize(&input));
    super::blocking::run(work).await.unwrap_or_else(|| {
        Err(AttemptError::new(
            FailureReason::Failed,
            "the strategy stopped before it wrote a handoff",
        ))
    })
}

/// Adds up every attempt's usage.
pub fn sum_usage(attempts: &[Attempt]) -> Value {
    handoff_plugin_api::sum_usage(attempts.iter().filter_map(|a| a.usage.as_ref()))
        .unwrap_or_else(|| Value::Object(Map::new()))
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Words;
    impl TokenCounter for Words {
        fn count_text(&self, text: &str) -> u64 {
            text.split_whitespace().count() as u64
        }
        fn count_message(&self, message: &Value) -> u64 {
            self.count_text(&message.to_string())
        }
    }

    fn unit(id: &str, name: &str, output_words: usize) -> Unit {
        Unit {
            messages: vec![
                json!({"role": "assistant", "tool_calls": [{"id": id, "type": "function", "function": {"name": name, "arguments": "{}"}}]}),
                json!({"role": "tool", "tool_call_id": id, "content": "word ".repeat(output_words)}),
            ],
        }
    }

    #[test]
    fn pruning_keeps_the_newest_tool_output_and_names_the_rest() {
        let history = vec![
            unit("a", "grep", 100),
            unit("b", "cat", 100),
            unit("c", "ls", 100),
        ];
        let pruned = prune_tool_outputs(&history, 150, &Words);
        assert_eq!(pruned[2], history[2], "the newest output stays whole");
        assert_eq!(
            pruned[1].messages[1]["content"],
            "[cat output pruned by handoff: 500 characters]"
        );
        assert_eq!(
            pruned[0].messages[1]["content"],
            "[grep output pruned by handoff: 500 characters]"
        );
        assert_eq!(
            pruned[0].messages[0], history[0].messages[0],
            "calls and their arguments are kept"
        );
    }

    /// A strategy that fails the way a provider's 401 reads.
    struct Refused;
    impl Strategy for Refused {
        fn kind(&self) -> &'static str {
            "refused"
        }
        fn summarize<'a>(
            &'a self,
            _input: &'a StrategyInput,
        ) -> futures_util::future::BoxFuture<'a, Result<Summary, AttemptError>> {
            Box::pin(async {
                Err(AttemptError::new(
                    FailureReason::HttpError,
                    "upstream answered 401: Incorrect API key provided: sk-proj-****************wxyz.",
                ))
            })
        }
    }

    /// A deterministic strategy that writes how many tokens its counter gives a text.
    struct Counts;
    impl Strategy for Counts {
        fn kind(&self) -> &'static str {
            "counts"
        }
        fn is_deterministic(&self) -> bool {
            true
        }
        fn summarize<'a>(
            &'a self,
            input: &'a StrategyInput,
        ) -> futures_util::future::BoxFuture<'a, Result<Summary, AttemptError>> {
            let text = input.tokens.count_text("one two three four").to_string();
            Box::pin(async move {
                Ok(Summary {
                    text,
                    usage: None,
                    calls: None,
                })
            })
        }
    }

    /// Counts every text as twice its words.
    struct Doubled;
    impl TokenCounter for Doubled {
        fn count_text(&self, text: &str) -> u64 {
            2 * text.split_whitespace().count() as u64
        }
        fn count_message(&self, message: &Value) -> u64 {
            self.count_text(&message.to_string())
        }
    }

    #[tokio::test]
    async fn a_deterministic_strategy_counts_what_the_request_model_reads() {
        // The input counts for the summary model (words); the handoff is the request
        // model's, which counts double here.
        let mut input = handoff_plugin_api::testing::input(vec![], 8000, 800);
        input.tokens = Arc::new(Words);
        // The built-in extract carries the configured summary model in its settings.
        let chain = [NamedStrategy {
            name: "counts".into(),
            strategy: Arc::new(Counts),
            timeout: None,
            summary_model: Some(SummaryModel {
                name: "small".into(),
                window: Some(4096),
                tokenizer: None,
            }),
            prune: None,
            handoff_tokens: None,
        }];
        let equip = |input: &mut StrategyInput, count_for: CountFor<'_>| match count_for {
            CountFor::Handoff => input.tokens = Arc::new(Doubled),
            CountFor::Summary(_) => input.tokens = Arc::new(Words),
        };
        let outcome = run_chain(&chain, &input, Duration::from_secs(1), &equip).await;
        assert_eq!(outcome.summary.unwrap().1.text, "8");
    }

    /// A deterministic strategy that holds its thread until it is released, as a long
    /// extract holds it with work.
    struct Held(std::sync::Mutex<std::sync::mpsc::Receiver<()>>);
    impl Strategy for Held {
        fn kind(&self) -> &'static str {
            "held"
        }
        fn is_deterministic(&self) -> bool {
            true
        }
        fn summarize<'a>(
            &'a self,
            _input: &'a StrategyInput,
        ) -> futures_util::future::BoxFuture<'a, Result<Summary, AttemptError>> {
            let released = self
                .0
                .lock()
                .is_ok_and(|release| release.recv_timeout(Duration::from_secs(20)).is_ok());
            Box::pin(async move {
                Ok(Summary {
                    text: if released {
                        "released"
                    } else {
                        "never released"
                    }
                    .into(),
                    usage: None,
                    calls: None,
                })
            })
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_deterministic_strategy_leaves_the_worker_thread_to_its_other_tasks() {
        // One thread, as a `workers = N` worker has: the release is sent by another task
        // of that thread, so it is only sent if the strategy does not hold the thread.
        let (release, held) = std::sync::mpsc::channel();
        let chain = [NamedStrategy {
            name: "held".into(),
            strategy: Arc::new(Held(std::sync::Mutex::new(held))),
            timeout: None,
            summary_model: None,
            prune: None,
            handoff_tokens: None,
        }];
        let other = tokio::spawn(async move {
            tokio::task::yield_now().await;
            release.send(())
        });
        let input = handoff_plugin_api::testing::input(vec![], 8000, 800);
        let outcome = run_chain(&chain, &input, Duration::from_secs(30), &|_, _| {}).await;
        assert_eq!(outcome.summary.unwrap().1.text, "released");
        assert!(other.await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn attempt_errors_are_recorded_without_key_fragments() {
        let input = handoff_plugin_api::testing::input(vec![], 8000, 800);
        let chain = [NamedStrategy {
            name: "refused".into(),
            strategy: Arc::new(Refused),
            timeout: None,
            summary_model: None,
            prune: None,
            handoff_tokens: None,
        }];
        let outcome = run_chain(&chain, &input, Duration::from_secs(1), &|_, _| {}).await;
        let error = outcome.attempts[0].error.as_deref().unwrap();
        assert!(
            !error.contains("wxyz") && error.contains("[redacted]"),
            "{error}"
        );
        assert!(error.contains("upstream answered 401"), "{error}");
    }
}
