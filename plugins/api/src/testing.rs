//! Stand-ins for writing strategy tests: a model client that is never called, a
//! token counter at four bytes a token, and a [`StrategyInput`] built from them.

use futures_util::future::BoxFuture;
use serde_json::Value;

use std::sync::Arc;

use crate::{
    Budgets, CancellationToken, ModelCallError, ModelClient, ModelInfo, ModelReply, StrategyInput,
    TokenCounter, Unit,
};

/// A [`ModelClient`] for deterministic strategies: every call fails.
pub struct NoModel;

impl ModelClient for NoModel {
    fn complete(&self, _body: Value) -> BoxFuture<'_, Result<ModelReply, ModelCallError>> {
        Box::pin(async { Err(ModelCallError("this strategy must not call a model".into())) })
    }
}

/// A [`TokenCounter`] that counts four bytes as one token.
pub struct BytesPerFour;

impl TokenCounter for BytesPerFour {
    fn count_text(&self, text: &str) -> u64 {
        text.len() as u64 / 4
    }

    fn count_message(&self, message: &Value) -> u64 {
        message.to_string().len() as u64 / 4
    }
}

/// An input for `history` with model `m` of `window` tokens (also the summary model's),
/// a handoff budget of `handoff_tokens`, one model call, [`NoModel`] and
/// [`BytesPerFour`]; a test changes the fields it cares about.
pub fn input(history: Vec<Unit>, window: u64, handoff_tokens: u64) -> StrategyInput {
    StrategyInput {
        conversation_id: "c".into(),
        dialect: "openai".into(),
        history,
        retained_recent_messages: Vec::new(),
        previous_handoff: None,
        model: ModelInfo {
            model: "m".into(),
            context_window: window,
            summary_model: "m".into(),
            summary_context_window: window,
        },
        budgets: Budgets {
            input_budget: window,
            handoff_tokens,
            max_calls: 1,
            room_tokens: 0,
            parallel_calls: 1,
        },
        cancel: CancellationToken::new(),
        client: Arc::new(NoModel),
        tokens: Arc::new(BytesPerFour),
        conversation: None,
    }
}
