//! What `handoff eval` replays: each recorded request of a data dir's conversations,
//! rebuilt from the log, or the requests a client would have made for a JSON
//! conversation file (`{"tools", "messages"}`, as under `shared/data/conversations`).

use std::path::Path;

use serde_json::value::RawValue;
use serde_json::{json, Value};

use crate::audit::Tree;
use crate::base::digest::PrefixDigest;
use crate::base::line::Source;
use crate::conversation::{CapturedReply, ConversationId};
use crate::dialect::DialectKind;
use crate::store::layout::{conversation_dir, list_ids, resolve, ResolveError, MESSAGES_FILE};
use crate::store::read_conversation;
use crate::tenant::TenantId;

/// Why a conversation could not be loaded.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SourceError {
    /// A file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A conversation file is not the expected JSON.
    #[error("{path} is not a conversation file: {reason}")]
    Shape {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// A conversation given with --conversation could not be found.
    #[error(transparent)]
    Resolve(#[from] ResolveError),
}

/// One request to replay, and the reply the upstream gave it, if it was logged.
pub(crate) struct Step {
    /// The request's wire format.
    pub dialect: DialectKind,
    /// The path and query it was posted to (where Gemini names the model).
    pub target: String,
    /// The request body, in its dialect.
    pub body: Vec<u8>,
    /// The logged reply (consecutive output items for Responses), to log again, and
    /// the usage that calibrates the next request.
    pub reply: Option<(Vec<CapturedReply>, Option<Value>)>,
}

/// A conversation to replay.
pub(crate) struct Replay {
    /// Its name in the report: the conversation id or the file name.
    pub name: String,
    /// The tenant of a recorded conversation.
    pub tenant: Option<TenantId>,
    /// Its requests, in order.
    pub steps: Vec<Step>,
    /// Every original's text, where the probe's matches are looked for.
    pub originals: String,
}

/// The recorded conversations of `data_dir`: `ids`, or all when empty.
pub(crate) fn from_data_dir(data_dir: &Path, ids: &[String]) -> Result<Vec<Replay>, SourceError> {
    let ids: Vec<ConversationId> = if ids.is_empty() {
        list_ids(data_dir, None, None, usize::MAX).map_err(|source| SourceError::Read {
            path: data_dir.display().to_string(),
            source,
        })?
    } else {
        ids.iter()
            .map(|id| resolve(data_dir, id, None))
            .collect::<Result<_, _>>()?
    };
    let mut replays = Vec::with_capacity(ids.len());
    for id in ids {
        let path = conversation_dir(data_dir, &id).join(MESSAGES_FILE);
        let log = read_conversation(data_dir, &path).map_err(|source| SourceError::Read {
            path: path.display().to_string(),
            source,
        })?;
        let tree = Tree::new(&log);
        let mut steps = Vec::new();
        for request in tree.requests() {
            let branch = match request.head {
                Some(head) => match tree.branch(&head) {
                    Some(branch) => branch,
                    None => continue,
                },
                None => Vec::new(),
            };
            let dialect = DialectKind::from_name(request.dialect.as_deref());
            let pinned = request
                .pinned
                .and_then(|digest| tree.pinned(&digest))
                .unwrap_or_default();
            let top_level = request.top_level.unwrap_or(0).min(pinned.len());
            let messages: Vec<&RawValue> = pinned[top_level..]
                .iter()
                .copied()
                .chain(branch.iter().map(|m| m.message.as_ref()))
                .collect();
            let top = pinned
                .first()
                .filter(|_| top_level > 0)
                .and_then(|raw| serde_json::from_str::<Value>(raw.get()).ok());
            let body = dialect
                .get()
                .request_body(&request.model, top.as_ref(), &messages);
            let reply = replies_after(&tree, request.head).map(|(replies, usage)| {
                // A chat or Messages reply is one message; Responses' are its output items.
                let replies = if dialect.get().reply_is_items() {
                    replies
                } else {
                    replies.into_iter().take(1).collect()
                };
                (replies, usage)
            });
            steps.push(Step {
                dialect,
                target: dialect.get().call_path(&request.model, None),
                body,
                reply,
            });
        }
        let originals = tree
            .messages()
            .iter()
            .map(|m| m.message.get())
            .collect::<Vec<_>>()
            .join("\n");
        replays.push(Replay {
            name: id.to_string(),
            tenant: Some(id.tenant().clone()),
            steps,
            originals,
        });
    }
    Ok(replays)
}

/// A conversation file, replayed as its client would have sent it: one request before
/// each assistant message, and one with every message.
pub(crate) fn from_file(path: &Path, model: &str) -> Result<Replay, SourceError> {
    let shape = |reason: &str| SourceError::Shape {
        path: path.display().to_string(),
        reason: reason.to_owned(),
    };
    let bytes = std::fs::read(path).map_err(|source| SourceError::Read {
        path: path.display().to_string(),
        source,
    })?;
    let file: Value = serde_json::from_slice(&bytes).map_err(|err| shape(&err.to_string()))?;
    let messages = file["messages"]
        .as_array()
        .ok_or_else(|| shape("no \"messages\" array"))?;
    let raw: Vec<Box<RawValue>> = messages
        .iter()
        .map(serde_json::value::to_raw_value)
        .collect::<Result<_, _>>()
        .map_err(|err| shape(&err.to_string()))?;
    let tools = file.get("tools").filter(|t| !t.is_null());
    let mut steps = Vec::new();
    for (index, message) in messages.iter().enumerate() {
        if message["role"] == "assistant" && index > 0 {
            let sent: Vec<&RawValue> = raw[..index].iter().map(AsRef::as_ref).collect();
            steps.push(Step {
                dialect: DialectKind::OpenAiChat,
                target: DialectKind::OpenAiChat.get().path().to_owned(),
                body: chat_body(model, &sent, tools),
                reply: None,
            });
        }
    }
    let all: Vec<&RawValue> = raw.iter().map(AsRef::as_ref).collect();
    steps.push(Step {
        dialect: DialectKind::OpenAiChat,
        target: DialectKind::OpenAiChat.get().path().to_owned(),
        body: chat_body(model, &all, tools),
        reply: None,
    });
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    Ok(Replay {
        name,
        tenant: None,
        steps,
        originals: messages
            .iter()
            .map(Value::to_string)
            .collect::<Vec<_>>()
            .join("\n"),
    })
}

/// The complete upstream replies logged after `head`, in order (a Responses reply is
/// several output items, each the parent of the next), with the first one's usage.
fn replies_after(
    tree: &Tree<'_>,
    head: Option<PrefixDigest>,
) -> Option<(Vec<CapturedReply>, Option<Value>)> {
    let messages = tree.messages();
    let upstream = |parent: Option<PrefixDigest>| {
        messages.iter().find(|m| {
            m.parent == parent && m.source == Source::Upstream && m.complete != Some(false)
        })
    };
    let first = upstream(head)?;
    let mut replies = Vec::new();
    let mut usage = first.usage.clone();
    let mut next = Some(first);
    while let Some(m) = next {
        replies.push(CapturedReply {
            message: m.message.clone(),
            finish_reason: m.finish_reason.clone(),
            choice: m.choice.unwrap_or(0),
        });
        usage = usage.or_else(|| m.usage.clone());
        next = upstream(Some(m.digest));
    }
    Some((replies, usage))
}

/// A Messages or Responses body: the top-level instructions from the pinned
/// `{"role":"system","content":…}` message, and the list.
fn chat_body(model: &str, messages: &[&RawValue], tools: Option<&Value>) -> Vec<u8> {
    let list: Vec<&str> = messages.iter().map(|m| m.get()).collect();
    let mut body = format!(
        "{{\"model\":{},\"messages\":[{}]",
        json!(model),
        list.join(",")
    );
    if let Some(tools) = tools {
        body.push_str(&format!(",\"tools\":{tools}"));
    }
    body.push('}');
    body.into_bytes()
}
