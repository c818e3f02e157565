//! OpenAiChat: the neutral form: a message as strategies read it (OpenAI chat), and the summary client that speaks it.

use super::*;
use crate::dialect::Neutral;

impl Neutral for OpenAiChat {
    fn neutral(&self, message: &Value) -> Vec<Value> {
        vec![message.clone()]
    }

    fn summary_client(&self, raw: Arc<dyn ModelClient>) -> Arc<dyn ModelClient> {
        raw
    }
}
