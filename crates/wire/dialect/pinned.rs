//! The system message that stands for a top-level prompt (Anthropic's `system`, the
//! Responses API's `instructions`), built once per distinct prompt.
//!
//! An agent re-sends its prompt byte for byte on every turn: Claude Code's is 29 KB.
//! Building its message copies the prompt into a new buffer, and finding the message's
//! facts digests that buffer. A prompt held out as a repeat ([`super::repeated`])
//! comes with the digest of its bytes, so the message built for those bytes before is
//! taken whole instead: its buffer shared, its facts as they were.

use std::sync::{Arc, OnceLock};

use super::message::Facts;
use super::{DialectError, DialectKind, Message, RawMessage, Role};

/// The bytes of built messages kept, all prompts together: a few dozen agents' prompts.
/// A prompt that falls out is built again, so this is a bound, not a setting.
const KEPT_BYTES: u64 = 4 << 20;

/// A built message: its bytes and its facts.
#[derive(Clone)]
struct Built {
    raw: RawMessage,
    facts: Arc<Facts>,
}

#[derive(Clone)]
struct ByLength;

impl quick_cache::Weighter<(u128, u8), Built> for ByLength {
    fn weight(&self, _key: &(u128, u8), built: &Built) -> u64 {
        built.raw.as_bytes().len() as u64
    }
}

type BuiltCache = quick_cache::sync::Cache<(u128, u8), Built, ByLength>;

fn built() -> &'static BuiltCache {
    static BUILT: OnceLock<BuiltCache> = OnceLock::new();
    BUILT.get_or_init(|| BuiltCache::with_weighter(256, KEPT_BYTES, ByLength))
}

/// Empties the built prompts: an erased conversation's leave no trace here.
pub(crate) fn clear() {
    built().clear();
}

/// The pinned system message for a top-level prompt whose JSON text is `content`;
/// `digest` is the [`keyed_hash`](crate::base::chunks::keyed_hash) of `content` when
/// the reading took it already, which finds the message built for it before.
pub(super) fn system_message(
    content: &[u8],
    digest: Option<u128>,
    dialect: DialectKind,
) -> Result<Message, DialectError> {
    // Per tenant: no request finds (or times) another tenant's prompt.
    let scope = u128::from(crate::cache_scope::current());
    let Some(key) = digest.map(|digest| (digest ^ scope, dialect as u8)) else {
        return build(content, dialect);
    };
    if let Some(Built { raw, facts }) = built().get(&key) {
        return Ok(Message::known(raw, facts));
    }
    let message = build(content, dialect)?;
    let kept = Built {
        raw: message.raw.clone(),
        facts: message.shared_facts(),
    };
    built().insert(key, kept);
    Ok(message)
}

/// Builds the message `{"role":"system","content":<content>}` and reads it through the
/// facts cache.
fn build(content: &[u8], dialect: DialectKind) -> Result<Message, DialectError> {
    // Checked here, once per distinct prompt: a held prompt repeats bytes serde read,
    // so the reading does not check them on every request.
    let content = simdutf8::basic::from_utf8(content).map_err(|_| DialectError::Shape {
        index: 0,
        rule: "the top-level system prompt is not UTF-8".into(),
    })?;
    Message::read(system_raw(content), dialect, |_| Ok(Role::System))
}

/// The message's bytes, sized up front: `format!` would grow a prompt of tens of KB by
/// reallocations.
fn system_raw(content: &str) -> RawMessage {
    const HEAD: &str = r#"{"role":"system","content":"#;
    let mut raw = String::with_capacity(HEAD.len() + content.len() + 1);
    raw.push_str(HEAD);
    raw.push_str(content);
    raw.push('}');
    RawMessage::from(raw)
}

#[cfg(test)]
mod tests {
    use crate::base::chunks::{keyed_hash, Chunks};
    use crate::dialect::anthropic::AnthropicMessages;
    use crate::dialect::responses::OpenAiResponses;
    use crate::dialect::ChatRequest;
    use crate::dialect::Parsing;

    fn anthropic(system: &str, tools: &str) -> ChatRequest {
        let body = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"hi"}}],"system":{system},"tools":{tools}}}"#
        );
        AnthropicMessages
            .parse_body(&Chunks::from(body.into_bytes()))
            .unwrap()
    }

    fn responses(instructions: &str) -> ChatRequest {
        let body = format!(r#"{{"model":"m","instructions":{instructions},"input":"hi"}}"#);
        OpenAiResponses
            .parse_body(&Chunks::from(body.into_bytes()))
            .unwrap()
    }

    fn ptr(request: &ChatRequest) -> *const u8 {
        request.messages[0].raw.as_bytes().as_ptr()
    }

    #[test]
    fn a_repeated_prompt_takes_the_message_built_for_it() {
        let system = format!(r#""pinned-a {}""#, "p".repeat(3000));
        let tools = format!(
            r#"[{{"name":"pinned-a","description":"{}"}}]"#,
            "t".repeat(2000)
        );
        let first = anthropic(&system, &tools);
        assert_eq!(first.tools_digest, None, "nothing was read before");
        // Held from here on: built once more under its digest, then taken whole.
        let second = anthropic(&system, &tools);
        let third = anthropic(&system, &tools);
        assert_eq!(second.tools_digest, Some(keyed_hash(tools.as_bytes())));
        for request in [&second, &third] {
            assert_eq!(request.top_level, 1);
            assert_eq!(request.messages[0].raw.get(), first.messages[0].raw.get());
            assert_eq!(request.messages[0].digest(), first.messages[0].digest());
        }
        assert_eq!(ptr(&third), ptr(&second), "the built message is shared");
        assert_ne!(ptr(&second), ptr(&first));

        // One byte off is another prompt: read, and built for its own bytes.
        let other = system.replace("pp\"", "pq\"");
        anthropic(&other, &tools);
        let changed = anthropic(&other, &tools);
        assert!(changed.messages[0].raw.get().ends_with(r#"pq"}"#));
        assert_ne!(changed.messages[0].digest(), first.messages[0].digest());
        assert_ne!(ptr(&changed), ptr(&third));
    }

    #[test]
    fn instructions_are_pinned_the_same_way() {
        let instructions = format!(r#""pinned-b {}""#, "i".repeat(3000));
        let first = responses(&instructions);
        let again = responses(&instructions);
        let third = responses(&instructions);
        assert_eq!(third.messages[0].raw.get(), first.messages[0].raw.get());
        assert_eq!(third.messages[0].digest(), first.messages[0].digest());
        assert_eq!(ptr(&third), ptr(&again));
        // The same prompt in the other dialect is that dialect's own message.
        let tools = r#"[]"#;
        anthropic(&instructions, tools);
        let anthropic_again = anthropic(&instructions, tools);
        assert_ne!(ptr(&anthropic_again), ptr(&third));
    }
}
