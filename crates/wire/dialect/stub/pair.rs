//! StubDialect: the handoff pair: its continuation and handoff messages, their shape, and a summary call that continues the conversation.

use super::*;
use crate::dialect::Pair;

impl Pair for StubDialect {
    fn continuation(&self) -> Value {
        json!({"role": "user", "content": crate::dialect::pair::CONTINUATION})
    }

    fn handoff(&self, text: &str, _reasoning_marker: bool) -> Value {
        json!({"role": "assistant", "content": text})
    }
}
