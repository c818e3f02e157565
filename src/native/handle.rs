//! The compaction handle: what handoff answers in place of a provider's sealed
//! compaction when it serves the API's compaction itself. It stands for the view the
//! compaction left (the handoff pair and what it kept verbatim), carried inside it,
//! so any replica sharing the server secret reads it, after any restart, with no
//! lookup. It is authenticated, not encrypted: the client that holds it sent every
//! byte it stands for. Bound to its tenant (in the tag) and its conversation (in the
//! payload): a forged, altered or foreign handle is refused before anything is sent.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::base::id::ConversationId;
use crate::tenant::{ServerSecret, TenantId};

pub(crate) use crate::dialect::HANDLE_PREFIX as PREFIX;

/// What the tag is keyed for: no other keyed digest of the secret passes for one.
const PURPOSE: &str = "compaction-handle";

/// What a handle carries.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Payload {
    /// The conversation it was minted in.
    #[serde(rename = "c")]
    pub(crate) conversation: String,
    /// The API it was minted in (`responses`): its messages are that API's.
    #[serde(rename = "d")]
    pub(crate) dialect: String,
    /// The compaction record that wrote it, when one was committed.
    #[serde(rename = "r", default, skip_serializing_if = "Option::is_none")]
    pub(crate) record: Option<String>,
    /// The messages it stands for, raw, in the dialect of the request that minted it.
    #[serde(rename = "x")]
    pub(crate) expansion: Vec<Box<RawValue>>,
}

/// Why a handle was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub(crate) enum HandleError {
    /// Not in the handle's form at all.
    #[error("it is not a compaction handle this proxy minted")]
    Malformed,
    /// The tag does not match: altered, forged, or another tenant's.
    #[error("its seal does not verify: it was altered, forged, or minted for another caller")]
    Unsealed,
    /// Minted in another conversation than the one the request continues.
    #[error("it was minted in another conversation")]
    Foreign,
}

/// True when `text` is in a handle's form (not yet verified).
#[cfg(test)]
fn is_handle(text: &str) -> bool {
    text.starts_with(PREFIX)
}

/// The handle of `payload` for `tenant`.
pub(crate) fn seal(secret: &ServerSecret, tenant: &TenantId, payload: &Payload) -> String {
    let json = serde_json::to_vec(payload).unwrap_or_default();
    let tag = secret.seal(PURPOSE, tenant, &[&json]);
    format!(
        "{PREFIX}{}.{}",
        URL_SAFE_NO_PAD.encode(&json),
        URL_SAFE_NO_PAD.encode(tag)
    )
}

/// The payload of `text`, once its tag verifies for `tenant` and it names
/// `conversation` (any, when `None`).
pub(crate) fn open(
    secret: &ServerSecret,
    tenant: &TenantId,
    conversation: Option<&ConversationId>,
    text: &str,
) -> Result<Payload, HandleError> {
    let rest = text.strip_prefix(PREFIX).ok_or(HandleError::Malformed)?;
    let (body, tag) = rest.split_once('.').ok_or(HandleError::Malformed)?;
    let json = URL_SAFE_NO_PAD
        .decode(body)
        .map_err(|_| HandleError::Malformed)?;
    let tag = URL_SAFE_NO_PAD
        .decode(tag)
        .map_err(|_| HandleError::Unsealed)?;
    if !secret.verify(PURPOSE, tenant, &[&json], &tag) {
        return Err(HandleError::Unsealed);
    }
    let payload: Payload = serde_json::from_slice(&json).map_err(|_| HandleError::Malformed)?;
    match conversation {
        Some(id) if id.to_string() != payload.conversation => Err(HandleError::Foreign),
        _ => Ok(payload),
    }
}

/// What a Messages message holding a compaction block has after its latest one, as a
/// message of its own; `None` when nothing follows it (or for a Responses item).
pub(crate) fn remainder(message: &serde_json::Value) -> Option<serde_json::Value> {
    let blocks = message.get("content")?.as_array()?;
    let at = blocks.iter().rposition(|b| b["type"] == "compaction")?;
    let rest = &blocks[at + 1..];
    (!rest.is_empty()).then(|| serde_json::json!({"role": message["role"], "content": rest}))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payload(conversation: &str) -> Payload {
        Payload {
            conversation: conversation.to_owned(),
            dialect: "responses".to_owned(),
            record: Some("c1".to_owned()),
            expansion: vec![
                RawValue::from_string(r#"{"role":"user","content":"x"}"#.into())
                    .unwrap_or_else(|_| unreachable!()),
            ],
        }
    }

    #[test]
    fn only_the_minting_tenant_and_conversation_open_an_unaltered_handle() {
        let secret = ServerSecret::from_bytes([3; 32]);
        let team = TenantId::parse("team").unwrap();
        let other = TenantId::parse("other").unwrap();
        let id = ConversationId::parse(team.clone(), "c-one").unwrap();
        let elsewhere = ConversationId::parse(team.clone(), "c-two").unwrap();
        let handle = seal(&secret, &team, &payload(&id.to_string()));
        assert!(is_handle(&handle));
        let opened = open(&secret, &team, Some(&id), &handle).unwrap();
        assert_eq!(
            opened.expansion[0].get(),
            r#"{"role":"user","content":"x"}"#
        );
        assert_eq!(
            open(&secret, &other, Some(&id), &handle).err(),
            Some(HandleError::Unsealed)
        );
        assert_eq!(
            open(&secret, &team, Some(&elsewhere), &handle).err(),
            Some(HandleError::Foreign)
        );
        // Another server's secret, a changed byte, a stranger's text: all refused.
        let stranger = ServerSecret::from_bytes([4; 32]);
        assert_eq!(
            open(&stranger, &team, None, &handle).err(),
            Some(HandleError::Unsealed)
        );
        let body_at = PREFIX.len() + 3;
        let mut altered = handle.clone().into_bytes();
        altered[body_at] = if altered[body_at] == b'A' { b'B' } else { b'A' };
        let altered = String::from_utf8(altered).unwrap();
        assert!(open(&secret, &team, None, &altered).is_err());
        assert_eq!(
            open(&secret, &team, None, "gAAAAABforged").err(),
            Some(HandleError::Malformed)
        );
    }
}
