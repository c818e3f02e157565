//! OpenAiResponses: the neutral form: a message as strategies read it (OpenAI chat), and the summary client that speaks it.

use super::*;
use crate::dialect::Neutral;

impl Neutral for OpenAiResponses {
    fn neutral(&self, message: &Value) -> Vec<Value> {
        neutral(message).into_iter().collect()
    }

    fn summary_client(&self, raw: Arc<dyn ModelClient>) -> Arc<dyn ModelClient> {
        Arc::new(TranslatingClient::new(
            raw,
            summary::to_responses,
            summary::to_completion,
        ))
    }
}
