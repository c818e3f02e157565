//! Summaries that continue the conversation: when the summary model is the
//! conversation's own, the call is the conversation as its upstream last saw it, cut
//! after the history, with the summary prompt as one more user turn. The provider reads
//! that prefix from its prompt cache; re-rendering the history as text would pay for
//! all of it again. The recent messages are not in the call at all, so they cannot be
//! summarised twice.

use handoff_plugin_api::{
    sum_usage, AttemptError, ConversationClient, FailureReason, StrategyInput, Summary,
};
use serde_json::Value;

use crate::render::{render_part, render_unit, Position, RenderOptions};
use crate::{check, validate_reply, Summarize};

/// Tokens the instruction frame adds to the prompt, with room to spare.
const FRAME_TOKENS: u64 = 256;

/// The window's share kept free for counting error: 1/50.
const MARGIN_DIVISOR: u64 = 50;

/// The user turn that asks for the handoff of everything before it.
pub fn instruction(prompt: &str, previous: bool) -> String {
    let scope = if previous {
        "In this request, <history> is every message above this one after the earlier \
         handoff (the assistant message right after the note that the conversation was \
         compacted), and <previous_handoff> is that earlier handoff: extend it into one \
         complete handoff. There are no <retained_recent_messages>."
    } else {
        "In this request, <history> is every message above this one. There is no \
         <previous_handoff> and there are no <retained_recent_messages>."
    };
    format!(
        "<handoff_request>\nThe conversation above is being compacted. Do not continue \
         the task, do not call tools and do not answer the last message: write the \
         handoff described below, and nothing else.\n\n{scope}\n\n{prompt}\n</handoff_request>"
    )
}

impl Summarize {
    /// The output the continued call may ask for: the handoff budget, less what the
    /// window lacks for it after the prefix (the prefix is what the upstream already
    /// read, so only a small margin is kept); `None` when less than a quarter of the
    /// budget is left, and the rendered history (which may fold) does better.
    pub(crate) fn continued_output(
        &self,
        input: &StrategyInput,
        conversation: &dyn ConversationClient,
    ) -> Option<u64> {
        let window = input.model.summary_context_window;
        let frame = input.tokens.count_text(&self.prompt) + FRAME_TOKENS;
        let room =
            window.saturating_sub(conversation.prefix_tokens() + frame + window / MARGIN_DIVISOR);
        let wanted = self.output_tokens(input);
        let output = wanted.min(room);
        (output >= wanted / 4).then_some(output)
    }

    /// One call over the cached prefix, checked as a handoff of what it showed.
    pub(crate) async fn continued(
        &self,
        input: &StrategyInput,
        conversation: &dyn ConversationClient,
        output: u64,
    ) -> Result<Summary, AttemptError> {
        let previous = input.previous_handoff.is_some();
        let reply = conversation
            .ask(instruction(&self.prompt, previous), output)
            .await
            .map_err(|err| {
                AttemptError::new(FailureReason::HttpError, err.to_string()).with_calls(1)
            })?;
        let summary = validate_reply(reply.status, &reply.body).map_err(|err| err.with_calls(1))?;
        let options = RenderOptions {
            shorten_tool_bodies: false,
        };
        let history: String = input
            .history
            .iter()
            .map(|unit| render_unit(unit, options))
            .collect();
        let shown = render_part(
            input.previous_handoff.as_deref(),
            &history,
            None,
            Position { index: 0, count: 1 },
        );
        if let Err(wrong) = check::check(&summary.text, &self.sections, &self.prompt, &shown) {
            return Err(AttemptError::new(
                FailureReason::InvalidSummary,
                format!("the summary is not a handoff: {wrong}"),
            )
            .with_usage(summary.usage.clone())
            .with_calls(1));
        }
        Ok(summary)
    }
}

/// `summary` with the usage and calls of a failed continued call added: the bill
/// counts every call made.
pub(crate) fn after_failed(mut summary: Summary, failed: &AttemptError) -> Summary {
    let usages: Vec<&Value> = summary.usage.iter().chain(failed.usage.iter()).collect();
    summary.usage = sum_usage(usages);
    summary.calls = Some(summary.calls.unwrap_or(0) + failed.calls.unwrap_or(1));
    summary
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use futures_util::future::BoxFuture;
    use handoff_plugin_api::{
        testing, ConversationClient, ModelCallError, ModelClient, ModelReply, Strategy, Unit,
    };
    use serde_json::{json, Map, Value};

    use crate::{Summarize, DEFAULT_PROMPT};

    /// A handoff with every section of the built-in prompt, as a chat completion.
    fn handoff(prompt_tokens: u64) -> Value {
        let text: String = crate::check::sections_of(DEFAULT_PROMPT)
            .iter()
            .map(|s| format!("## {s}\nFACT-1 noted.\n"))
            .collect();
        json!({"choices": [{"message": {"content": text}, "finish_reason": "stop"}],
               "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 10}})
    }

    /// A conversation whose calls answer `reply`, counted.
    struct Conversation {
        reply: Value,
        status: u16,
        asked: AtomicUsize,
        instruction: std::sync::Mutex<String>,
    }

    impl ConversationClient for Conversation {
        fn prefix_tokens(&self) -> u64 {
            500
        }
        fn ask(
            &self,
            instruction: String,
            _: u64,
        ) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
            self.asked.fetch_add(1, Ordering::SeqCst);
            *self.instruction.lock().unwrap() = instruction;
            Box::pin(async move {
                Ok(ModelReply {
                    status: self.status,
                    body: self.reply.clone(),
                })
            })
        }
    }

    /// The rendering client: answers a handoff, counted.
    struct Rendered(AtomicUsize);

    impl ModelClient for Rendered {
        fn complete(&self, _: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
            self.0.fetch_add(1, Ordering::SeqCst);
            Box::pin(async {
                Ok(ModelReply {
                    status: 200,
                    body: handoff(2000),
                })
            })
        }
    }

    fn input(
        conversation: Arc<Conversation>,
        rendered: Arc<Rendered>,
    ) -> handoff_plugin_api::StrategyInput {
        let history = vec![Unit {
            messages: vec![json!({"role": "user", "content": "FACT-1 please"})],
        }];
        let mut input = testing::input(history, 32_000, 3000);
        input.conversation = Some(conversation);
        input.client = rendered;
        input
    }

    fn conversation(reply: Value, status: u16) -> Arc<Conversation> {
        Arc::new(Conversation {
            reply,
            status,
            asked: AtomicUsize::new(0),
            instruction: std::sync::Mutex::default(),
        })
    }

    #[tokio::test]
    async fn the_conversation_is_continued_once_and_nothing_is_rendered() {
        let summarize = Summarize::new(DEFAULT_PROMPT.into(), Map::new());
        let (talk, rendered) = (
            conversation(handoff(400), 200),
            Arc::new(Rendered(AtomicUsize::new(0))),
        );
        let summary = summarize
            .summarize(&input(Arc::clone(&talk), Arc::clone(&rendered)))
            .await
            .unwrap();
        assert_eq!(summary.calls, Some(1));
        assert_eq!(summary.usage.unwrap()["prompt_tokens"], 400);
        assert_eq!(talk.asked.load(Ordering::SeqCst), 1);
        assert_eq!(rendered.0.load(Ordering::SeqCst), 0, "nothing rendered");
        let instruction = talk.instruction.lock().unwrap().clone();
        assert!(instruction.starts_with("<handoff_request>") && instruction.contains("## Goal"));
    }

    #[tokio::test]
    async fn a_failed_continuation_falls_back_to_the_rendered_history_and_is_billed() {
        let summarize = Summarize::new(DEFAULT_PROMPT.into(), Map::new());
        let refused = json!({"error": {"message": "overloaded"}, "usage": {"prompt_tokens": 300, "completion_tokens": 0}});
        let (talk, rendered) = (
            conversation(refused, 529),
            Arc::new(Rendered(AtomicUsize::new(0))),
        );
        let summary = summarize
            .summarize(&input(Arc::clone(&talk), Arc::clone(&rendered)))
            .await
            .unwrap();
        assert_eq!(
            rendered.0.load(Ordering::SeqCst),
            1,
            "rendered after the refusal"
        );
        assert_eq!(summary.calls, Some(2), "both calls counted");
        assert_eq!(
            summary.usage.unwrap()["prompt_tokens"],
            2300,
            "both calls billed"
        );
    }
}
