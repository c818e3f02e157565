//! Every request as the client sent it, rebuilt from the log: its pinned set, the
//! branch up to its head, and the forms it carried, byte for byte; then the reply it
//! got.

use std::collections::HashMap;

use serde_json::value::RawValue;

use super::branch::put_back;
use super::Tree;
use crate::base::digest::{bytes_digest, Digest, PrefixDigest};
use crate::base::line::{pinned_slot, Entry, RequestLine, Source};
use crate::store::ConversationLog;

/// One request rebuilt.
pub struct SentRequest<'a> {
    /// Its number, from 1, in log order: what `audit replay --request N` takes.
    pub number: usize,
    /// Its index in the log's lines.
    pub line: usize,
    /// Its request line.
    pub request: &'a RequestLine,
    /// The list the client sent (`messages`, `input`), each message's bytes as sent;
    /// pinned messages that stand for a top-level field (`system`, `instructions`)
    /// are not in it.
    pub messages: Vec<&'a RawValue>,
    /// What the request's list left out as top-level fields, as logged.
    pub top_level: Vec<&'a RawValue>,
    /// For a server-held request (`previous_response_id`, `conversation`), which
    /// carried only what follows the response it continued: the history the upstream
    /// held for it, each item as the client last sent it. Empty for any other.
    pub held: Vec<&'a RawValue>,
    /// The upstream's reply to it, as logged: its choices, or its output items.
    pub reply: Vec<&'a RawValue>,
}

/// Why a request line cannot be rebuilt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RebuildProblem {
    /// The request's number, from 1.
    pub number: usize,
    /// The request line's index in the log's lines.
    pub line: usize,
    /// What is missing.
    pub reason: String,
}

/// The forms of a log's `form` lines, by the digest of their bytes, each rebuilt (an
/// edit of its original applied) and checked against its digest.
pub struct Forms {
    bytes: HashMap<Digest, Box<RawValue>>,
    /// Form lines that do not rebuild to their digest: (index in the log's lines, why).
    pub problems: Vec<(usize, String)>,
}

impl Forms {
    /// Reads the forms of `log`.
    pub fn read(log: &ConversationLog, tree: &Tree<'_>) -> Self {
        let mut forms = Forms {
            bytes: HashMap::new(),
            problems: Vec::new(),
        };
        for (index, line) in log.lines.iter().enumerate() {
            let Entry::Form(form) = &line.entry else {
                continue;
            };
            let original = form.of.and_then(|of| tree.message(&of)).map(RawValue::get);
            let rebuilt = form
                .bytes(original)
                .filter(|bytes| bytes_digest(bytes.as_bytes()) == form.digest)
                .and_then(|bytes| RawValue::from_string(bytes).ok());
            match rebuilt {
                Some(bytes) => {
                    forms.bytes.insert(form.digest, bytes);
                }
                None => forms.problems.push((
                    index,
                    format!(
                        "form {} does not rebuild to its digest",
                        form.digest.short(12)
                    ),
                )),
            }
        }
        forms
    }
}

/// Every request of `log` in log order, rebuilt with `forms`, or why it cannot be.
pub fn sent_requests<'a>(
    log: &'a ConversationLog,
    tree: &Tree<'a>,
    forms: &'a Forms,
) -> Vec<Result<SentRequest<'a>, RebuildProblem>> {
    let forms: HashMap<Digest, &RawValue> = forms
        .bytes
        .iter()
        .map(|(digest, bytes)| (*digest, bytes.as_ref()))
        .collect();
    // The form each message was last sent in, where it is not the logged original.
    let mut current: HashMap<PrefixDigest, &RawValue> = HashMap::new();
    let mut out = Vec::new();
    for (index, line) in log.lines.iter().enumerate() {
        let Entry::Request(request) = &line.entry else {
            continue;
        };
        let number = out.len() + 1;
        let rebuilt =
            rebuild(tree, &forms, &mut current, request).map(|(messages, top_level, held)| {
                SentRequest {
                    number,
                    line: index,
                    request,
                    messages,
                    top_level,
                    held,
                    reply: reply_to(log, index, request.head),
                }
            });
        out.push(rebuilt.map_err(|reason| RebuildProblem {
            number,
            line: index,
            reason,
        }));
    }
    out
}

/// What [`rebuild`] gives: the list, the top-level messages, the history held.
type Rebuilt<'a> = (Vec<&'a RawValue>, Vec<&'a RawValue>, Vec<&'a RawValue>);

/// The list one request carried, its top-level messages, and the history the upstream
/// held for it; `current` moves on to the forms it names.
fn rebuild<'a>(
    tree: &Tree<'a>,
    forms: &HashMap<Digest, &'a RawValue>,
    current: &mut HashMap<PrefixDigest, &'a RawValue>,
    request: &'a RequestLine,
) -> Result<Rebuilt<'a>, String> {
    let pinned = match request.pinned {
        Some(set) => tree
            .pinned(&set)
            .ok_or_else(|| format!("its pinned set {} is not in the log", set.short(12)))?,
        None => Vec::new(),
    };
    let branch = match request.head {
        Some(head) => tree
            .branch(&head)
            .ok_or_else(|| format!("its head {} is not in the log", head.short(12)))?,
        None => Vec::new(),
    };
    let carried = request.carried.unwrap_or(branch.len());
    let skip = branch.len().checked_sub(carried).ok_or_else(|| {
        format!(
            "it carried {carried} message(s), its branch has {}",
            branch.len()
        )
    })?;
    let mut slots: Vec<PrefixDigest> = match request.pinned {
        Some(set) => (0..pinned.len()).map(|j| pinned_slot(&set, j)).collect(),
        None => Vec::new(),
    };
    slots.extend(branch[skip..].iter().map(|m| m.digest));
    let mut list: Vec<&'a RawValue> = pinned;
    list.extend(branch[skip..].iter().map(|m| m.message.as_ref()));
    for (slot, message) in slots.iter().zip(list.iter_mut()) {
        if let Some(form) = current.get(slot) {
            *message = form;
        }
    }
    for (slot, form) in &request.forms {
        let bytes = forms
            .get(form)
            .ok_or_else(|| format!("its form {} is not in the log", form.short(12)))?;
        let at = slots.iter().position(|s| s == slot).ok_or_else(|| {
            format!(
                "its form {} is for {}, a message it did not carry",
                form.short(12),
                slot.short(12)
            )
        })?;
        list[at] = bytes;
        current.insert(*slot, bytes);
    }
    for (at, bytes) in &request.inline_forms {
        let slot = slots.get(*at).ok_or_else(|| {
            format!(
                "its form at {at} lies past the {} messages it carried",
                slots.len()
            )
        })?;
        list[*at] = bytes;
        current.insert(*slot, bytes);
    }
    let pinned_len = slots.len() - (branch.len() - skip);
    let floated = if request.floated.len() <= pinned_len {
        request.floated.as_slice()
    } else {
        &[]
    };
    put_back(&mut list, pinned_len, floated);
    let top = request.top_level.unwrap_or(0).min(pinned_len);
    let top_level = list.drain(..top).collect();
    // A request that continued after a provider compaction carried only what follows
    // it too; what precedes it the provider dropped, and no one sent.
    let held = match request.server_held {
        Some(true) => branch[..skip]
            .iter()
            .map(|m| current.get(&m.digest).copied().unwrap_or(&m.message))
            .collect(),
        _ => Vec::new(),
    };
    Ok((list, top_level, held))
}

/// The upstream messages logged for the request at `index`: written after it, from its
/// head on (several items of one response in a chain, or sibling choices), up to the
/// next request with the same head.
fn reply_to(log: &ConversationLog, index: usize, head: Option<PrefixDigest>) -> Vec<&RawValue> {
    let mut ends: Vec<Option<PrefixDigest>> = vec![head];
    let mut reply = Vec::new();
    for line in &log.lines[index + 1..] {
        match &line.entry {
            // A request from here on is answered by its own reply.
            Entry::Request(next) if ends.contains(&next.head) => break,
            Entry::Message(message)
                if message.source == Source::Upstream && ends.contains(&message.parent) =>
            {
                ends.push(Some(message.digest));
                reply.push(message.message.as_ref());
            }
            _ => {}
        }
    }
    reply
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use crate::audit::verify_log;
    use crate::base::line::Entry;
    use crate::conversation::{ConversationId, Tracker};
    use crate::dialect::ChatRequest;
    use crate::store::{MemoryStore, Store};
    use crate::tenant::TenantId;

    /// A log whose second request carried its first message in another form.
    async fn log_with_a_form() -> crate::store::ConversationLog {
        let store = Arc::new(MemoryStore::default());
        let tracker = Tracker::new(store.clone(), 10);
        let id = ConversationId::parse(TenantId::legacy(), "verify-forms").unwrap();
        // Long enough that an edit is shorter than the message written again.
        let ask = format!(
            "Fix it, and keep the tests green. {}",
            "Mind the flaky ones. ".repeat(30)
        );
        for body in [
            format!(r#"{{"model":"m","messages":[{{"role":"user","content":"{ask}\n"}}]}}"#),
            format!(
                r#"{{"model":"m","messages":[{{"role":"user","content":"{ask}"}},{{"role":"user","content":"And now?"}}]}}"#
            ),
        ] {
            let request = ChatRequest::parse(body.as_bytes()).unwrap();
            tracker.track(id.clone(), &request).await.unwrap();
        }
        store.read(&id).await.unwrap()
    }

    #[tokio::test]
    async fn verify_finds_a_form_that_does_not_rebuild_and_a_request_that_names_none() {
        let log = log_with_a_form().await;
        assert_eq!(verify_log(&log), [], "a sound log");
        let edits = log
            .lines
            .iter()
            .filter(|l| matches!(&l.entry, Entry::Form(f) if f.edit.is_some()))
            .count();
        assert_eq!(edits, 1, "the stripped turn is an edit of its original");

        let mut edited = log.clone();
        for line in &mut edited.lines {
            if let Entry::Form(form) = &mut line.entry {
                if let Some(edit) = &mut form.edit {
                    edit.2.push('!');
                }
            }
        }
        let problems = verify_log(&edited);
        assert!(
            problems
                .iter()
                .any(|p| p.reason.contains("does not rebuild")),
            "{problems:?}"
        );
        assert!(
            problems
                .iter()
                .any(|p| p.reason.contains("request 2 cannot be rebuilt")),
            "{problems:?}"
        );

        let mut lost = log;
        lost.lines
            .retain(|line| !matches!(line.entry, Entry::Form(_)));
        let problems = verify_log(&lost);
        assert!(
            problems
                .iter()
                .any(|p| p.reason.contains("request 2 cannot be rebuilt: its form")),
            "{problems:?}"
        );
    }
}
