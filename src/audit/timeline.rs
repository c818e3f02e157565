//! A conversation as the web audit view shows it: every message, request and
//! compaction in log order, the branches as lanes, each request's estimated input
//! (what was sent: the handoff in force plus the messages after it), the model's window
//! and trigger, and the view the next request would be sent with.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::{summarize, Tree};
use crate::base::digest::{message_digest, PrefixDigest};
use crate::base::line::{Entry, MessageLine, RequestLine, RescueLine};
use crate::compaction::budget::RequestBudget;
use crate::compaction::{adopt, Adopted};
use crate::config::{Config, Tokenizer};
use crate::conversation::{ConversationId, Tracked};
use crate::projection::project_view;
use crate::store::ConversationLog;
use crate::tokens::Tokens;

/// The whole timeline of `log` as JSON.
pub fn timeline(
    id: &ConversationId,
    log: &ConversationLog,
    config: &Config,
    tokens: &Tokens,
) -> Value {
    let tree = Tree::new(log);
    let adoption = adopt(log);
    let model = tree
        .requests()
        .last()
        .map(|r| r.model.clone())
        .unwrap_or_default();
    let tokenizer = config
        .model(&model)
        .map_or(Tokenizer::default(), |m| m.tokenizer);
    let count = |value: &Value| tokens.count_message(tokenizer, &message_digest(value), value);

    // Lanes: a message continues its parent's lane if it is the parent's first child.
    let mut lanes: HashMap<PrefixDigest, usize> = HashMap::new();
    let mut first_child: HashMap<Option<PrefixDigest>, PrefixDigest> = HashMap::new();
    let mut next_lane = 0;
    let mut positions: HashMap<PrefixDigest, usize> = HashMap::new();
    let mut committed: Vec<(&str, PrefixDigest)> = Vec::new();
    // Each message is parsed and counted once; requests sum these.
    let mut message_tokens: HashMap<PrefixDigest, u64> = HashMap::new();
    let mut events = Vec::new();
    let mut pending: Option<(usize, (&str, &RequestLine))> = None;
    let mut requests = 0usize;
    let mut rescues: HashMap<Option<PrefixDigest>, &RescueLine> = HashMap::new();
    for line in &log.lines {
        match &line.entry {
            Entry::Message(message) => {
                let value: Value =
                    serde_json::from_str(message.message.get()).unwrap_or(Value::Null);
                // A first child continues its parent's lane; a later one opens a branch.
                let first = *first_child.entry(message.parent).or_insert(message.digest);
                let lane = if first == message.digest {
                    message
                        .parent
                        .and_then(|p| lanes.get(&p).copied())
                        .unwrap_or(0)
                } else {
                    next_lane += 1;
                    next_lane
                };
                lanes.insert(message.digest, lane);
                let depth = message
                    .parent
                    .and_then(|p| positions.get(&p))
                    .map_or(0, |d| d + 1);
                positions.insert(message.digest, depth);
                let counted = count(&value);
                message_tokens.insert(message.digest, counted);
                events.push(json!({
                    "type": "message",
                    "at": line.at,
                    "digest": message.digest.to_hex(),
                    "parent": message.parent.map(|p| p.to_hex()),
                    "lane": lane,
                    "position": depth,
                    "source": format!("{:?}", message.source).to_lowercase(),
                    "role": role_of(&value),
                    "model": (!message.model.is_empty()).then_some(&message.model),
                    "tokens": counted,
                    "message": value,
                    "usage": message.usage,
                    "finish_reason": message.finish_reason,
                    "incomplete": message.incomplete,
                }));
            }
            Entry::Request(request) => {
                // Sized once the next request comes: a compaction this request triggered
                // is committed after its line, and the view sent carried it.
                if let Some((at, earlier)) = pending.take() {
                    let sent = sized(
                        &tree,
                        &committed,
                        &adoption.adopted,
                        &message_tokens,
                        &rescues,
                        &count,
                        earlier.1,
                    );
                    let number = events[at]["number"].take();
                    events[at] = request_event(earlier, &sent);
                    events[at]["number"] = number;
                }
                pending = Some((events.len(), (line.at.as_str(), request)));
                // Numbered as `audit replay --request N` and the requests endpoint take it.
                requests += 1;
                events.push(json!({"number": requests}));
            }
            Entry::Rescue(rescue) => {
                rescues.insert(rescue.head, rescue);
                events.push(json!({
                    "type": "rescue",
                    "at": line.at,
                    "head": rescue.head.map(|h| h.to_hex()),
                    "shortened": rescue.shortened,
                }));
            }
            Entry::Adopt(adopt) => {
                // A prepared record counts for the views from its adoption on.
                let prepared = adoption
                    .adopted
                    .iter()
                    .find(|(_, record)| record.id == adopt.compact_id);
                if let Some((prefix, record)) = prepared {
                    committed.push((record.id.as_str(), *prefix));
                }
                events.push(json!({
                    "type": "adopt",
                    "at": line.at,
                    "id": adopt.compact_id,
                    "head": adopt.head.map(|h| h.to_hex()),
                    "arrived": adopt.arrived,
                }));
            }
            Entry::CompactBoundary(boundary) => {
                let Some(record) = adoption.adopted.get(&boundary.prefix_digest) else {
                    continue;
                };
                if record.prepared.is_none() {
                    committed.push((record.id.as_str(), boundary.prefix_digest));
                }
                events.push(json!({
                    "type": "compaction",
                    "at": line.at,
                    "id": record.id,
                    "strategy": record.strategy,
                    "chain": record.chain,
                    "reason": record.reason,
                    "prepared": record.prepared,
                    "tokens_before": record.tokens_before,
                    "tokens_after": record.tokens_after,
                    "covers": record.source.end_exclusive,
                    "prefix_digest": record.source.prefix_digest.to_hex(),
                    "attempts": record.attempts,
                    "usage": record.usage,
                    "handoff": handoff_text(&record.handoff),
                }));
            }
            Entry::Form(form) => events.push(json!({
                "type": "form",
                "at": line.at,
                "digest": form.digest.to_hex(),
                "of": form.of.map(|o| o.to_hex()),
                "edit": form.edit.is_some(),
            })),
            Entry::Pinned(pinned) => events.push(json!({
                "type": "pinned",
                "at": line.at,
                "count": pinned.messages.len(),
                "messages": pinned.messages,
            })),
        }
    }
    if let Some((at, last)) = pending.take() {
        let sent = sized(
            &tree,
            &committed,
            &adoption.adopted,
            &message_tokens,
            &rescues,
            &count,
            last.1,
        );
        let number = events[at]["number"].take();
        events[at] = request_event(last, &sent);
        events[at]["number"] = number;
    }
    let uncommitted = adoption.uncommitted.clone();
    let (window, trigger, input_budget) = budget_of(&tree, config, tokens);
    let mut value = serde_json::to_value(summarize(id, log)).unwrap_or(Value::Null);
    value["dialect"] = json!(tree.dialect().name());
    value["events"] = Value::Array(events);
    value["uncommitted_records"] = json!(uncommitted);
    value["window"] = json!(window);
    value["trigger_tokens"] = json!(trigger);
    value["input_budget"] = json!(input_budget);
    value["branch_tips"] = json!(tree
        .tips()
        .iter()
        .map(
            |tip| json!({"tip": tip.to_hex(), "messages": tree.branch(tip).map_or(0, |b| b.len())})
        )
        .collect::<Vec<_>>());
    value["view"] = json!(next_view(id, log, &tree));
    value
}

/// What a request was sent with, for its timeline event.
struct Sent {
    tokens: Option<u64>,
    compaction: Option<String>,
    rescued: bool,
}

/// What `request` was sent with: the compactions committed so far, and its rescue.
fn sized(
    tree: &Tree<'_>,
    committed: &[(&str, PrefixDigest)],
    adopted: &HashMap<PrefixDigest, crate::base::record::CompactionRecord>,
    message_tokens: &HashMap<PrefixDigest, u64>,
    rescues: &HashMap<Option<PrefixDigest>, &RescueLine>,
    count: &dyn Fn(&Value) -> u64,
    request: &RequestLine,
) -> Sent {
    let estimate = request.head.and_then(|head| {
        sent_estimate(
            tree,
            &head,
            committed,
            adopted,
            request.pinned,
            message_tokens,
            count,
        )
    });
    let rescue = rescues.get(&request.head).copied();
    let saved = rescue.map_or(0, |r| rescued_tokens(tree, request.head, r, message_tokens));
    Sent {
        tokens: estimate.as_ref().map(|(t, _)| t.saturating_sub(saved)),
        compaction: estimate.and_then(|(_, c)| c),
        rescued: rescue.is_some(),
    }
}

/// A request's timeline event.
fn request_event((at, request): (&str, &RequestLine), sent: &Sent) -> Value {
    json!({
        "type": "request",
        "at": at,
        "model": request.model,
        "stream": request.stream,
        "head": request.head.map(|h| h.to_hex()),
        "new_messages": request.new_messages,
        "forms": request.forms.iter().map(|(slot, form)| json!({"of": slot.to_hex(), "form": form.to_hex()})).collect::<Vec<_>>(),
        "server_held": request.server_held.unwrap_or(false),
        "estimated_tokens": sent.tokens,
        "compaction": sent.compaction,
        "rescued": sent.rescued,
    })
}

/// Tokens a rescue took out of a request's view: each shortened message's count, in
/// the share of its bytes that was cut.
fn rescued_tokens(
    tree: &Tree<'_>,
    head: Option<PrefixDigest>,
    rescue: &RescueLine,
    message_tokens: &HashMap<PrefixDigest, u64>,
) -> u64 {
    let Some(branch) = head.and_then(|h| tree.branch(&h)) else {
        return 0;
    };
    rescue
        .shortened
        .iter()
        .filter_map(|s| {
            let tokens = *message_tokens.get(&branch.get(s.index)?.digest)?;
            let cut = s.bytes_before.saturating_sub(s.bytes_after) as f64;
            Some((tokens as f64 * cut / s.bytes_before.max(1) as f64) as u64)
        })
        .sum()
}

/// What a request ending at `head` was sent with, estimated: pinned messages, then the
/// latest compaction committed before it that covers a prefix of its branch (its pair),
/// then the messages after that prefix. Also the id of that compaction.
fn sent_estimate(
    tree: &Tree<'_>,
    head: &PrefixDigest,
    committed: &[(&str, PrefixDigest)],
    adopted: &HashMap<PrefixDigest, crate::base::record::CompactionRecord>,
    pinned: Option<crate::base::digest::Digest>,
    message_tokens: &HashMap<PrefixDigest, u64>,
    count: &dyn Fn(&Value) -> u64,
) -> Option<(u64, Option<String>)> {
    let branch: Vec<&MessageLine> = tree.branch(head)?;
    let pinned_tokens: u64 = pinned
        .and_then(|digest| tree.pinned(&digest))
        .unwrap_or_default()
        .iter()
        .filter_map(|m| serde_json::from_str::<Value>(m.get()).ok())
        .map(|m| count(&m))
        .sum();
    let cover = committed.iter().rev().find_map(|(id, prefix)| {
        branch
            .iter()
            .position(|m| m.digest == *prefix)
            .map(|at| (*id, *prefix, at + 1))
    });
    let (pair, start, compaction) = match cover {
        Some((id, prefix, start)) => {
            let record = adopted.get(&prefix)?;
            (
                count(&record.continuation) + count(&record.handoff),
                start,
                Some(id.to_owned()),
            )
        }
        None => (0, 0, None),
    };
    let rest: u64 = branch[start..]
        .iter()
        .filter_map(|m| message_tokens.get(&m.digest))
        .sum();
    Some((pinned_tokens + pair + rest, compaction))
}

/// The model's window, the trigger in tokens and the input budget, from the latest
/// request; `None`s when the model has no configured window.
fn budget_of(
    tree: &Tree<'_>,
    config: &Config,
    tokens: &Tokens,
) -> (Option<u64>, Option<u64>, Option<u64>) {
    let request = tree
        .latest_request_body()
        .and_then(|body| tree.dialect().get().parse(body.as_bytes()).ok());
    let budget = request
        .as_ref()
        .and_then(|r| RequestBudget::new(config, r, tokens));
    match budget {
        Some(b) => (
            Some(b.model.context_window),
            Some(b.threshold),
            Some(b.input_budget),
        ),
        None => (None, None, None),
    }
}

/// The messages the next request would be sent with (as `audit view`).
pub fn next_view(id: &ConversationId, log: &ConversationLog, tree: &Tree<'_>) -> Vec<Value> {
    let Some(body) = tree.latest_request_body() else {
        return Vec::new();
    };
    let Ok(request) = tree.dialect().get().parse(body.as_bytes()) else {
        return Vec::new();
    };
    let tracked = Tracked::compute(id.clone(), &request);
    let adopted: HashMap<_, _> = adopt(log)
        .adopted
        .into_iter()
        .filter_map(|(prefix, record)| Adopted::new(record).ok().map(|a| (prefix, Arc::new(a))))
        .collect();
    let view = project_view(&request, &tracked, &adopted);
    view.raw_messages()
        .into_iter()
        .filter_map(|m| serde_json::from_str(m).ok())
        .collect()
}

fn role_of(message: &Value) -> String {
    message["role"]
        .as_str()
        .or_else(|| message["type"].as_str())
        .unwrap_or("?")
        .to_owned()
}

/// The handoff's text, whatever its dialect's shape.
fn handoff_text(handoff: &Value) -> String {
    match &handoff["content"] {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}
