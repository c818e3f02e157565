//! A conversation as the web audit view shows it: every message, request and
//! compaction in log order, the branches as lanes, each request's figures as the proxy
//! logged its decision (the budget and trigger it used, the calibrated estimate of what
//! it sent, the provider's count), what a prepared compaction waited for, and the view
//! the next request would be sent with. A request logged before decisions is sized
//! from the log instead (the handoff in force plus the messages after it), and marked
//! estimated.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{json, Value};

use super::{compacted_here, request_figures, summarize, RequestFigures, Tree};
use crate::base::digest::{message_digest, PrefixDigest};
use crate::base::line::{Entry, MessageLine, RequestLine, RescueLine, Source};
use crate::compaction::budget::RequestBudget;
use crate::compaction::{adopt, Adopted};
use crate::config::{Config, Tokenizer};
use crate::conversation::{ConversationId, Tracked};
use crate::projection::project_view;
use crate::store::ConversationLog;
use crate::tokens::Tokens;

/// Problems a timeline lists; `problems` counts them all.
const PROBLEMS_SHOWN: usize = 50;

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
    let figures = request_figures(log);
    // Requests without a logged decision are sized as the next request comes: a
    // compaction this request triggered is committed after its line, and the view sent
    // carried it.
    let mut pending: Option<(usize, &RequestLine)> = None;
    let mut rebuilt: Vec<Option<Sent>> = vec![None; figures.len()];
    // Where each request's event sits in `events`.
    let mut request_events: Vec<usize> = Vec::with_capacity(figures.len());
    let mut requests = 0usize;
    let mut rescues: HashMap<Option<PrefixDigest>, &RescueLine> = HashMap::new();
    let dialect = tree.dialect();
    let mut bill = super::bill::Bill::default();
    let kept_out = super::bill::kept_out(&log.compactions);
    let mut last_model = "";
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
                let artefact = message.source == Source::Upstream
                    && crate::dialect::is_provider_compaction(&value);
                // A reply names its model; a line without one, its request's.
                let billed_as = if message.model.is_empty() {
                    last_model
                } else {
                    &message.model
                };
                let cost = message
                    .usage
                    .as_ref()
                    .and_then(|usage| bill.reply(&config.prices, dialect, billed_as, usage));
                // A priced reply's request went without what its compaction keeps out.
                let used = requests.checked_sub(1).and_then(|at| figures.get(at));
                if let Some(tokens) = used
                    .and_then(RequestFigures::compaction)
                    .and_then(|id| kept_out.get(id))
                {
                    bill.kept_out(&config.prices, billed_as, *tokens);
                }
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
                    "cost_usd": cost,
                    "finish_reason": message.finish_reason,
                    "incomplete": message.incomplete,
                    "provider_compaction": artefact,
                }));
                // The request this reply answers: the provider compacted its view.
                if artefact {
                    let at = request_events.last().copied();
                    if let Some(event) = at.and_then(|at| events.get_mut(at)) {
                        event["provider_compacted"] = json!(true);
                    }
                }
            }
            Entry::Request(request) => {
                last_model = &request.model;
                if let Some((index, earlier)) = pending.take() {
                    rebuilt[index] = Some(sized(
                        &tree,
                        &committed,
                        &adoption.adopted,
                        &message_tokens,
                        &rescues,
                        &count,
                        earlier,
                    ));
                }
                let logged = figures.get(requests).is_some_and(|f| f.decision.is_some());
                if !logged {
                    pending = Some((requests, request));
                }
                request_events.push(events.len());
                events.push(request_event(line.at.as_str(), request));
                requests += 1;
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
                    "summary_cost_usd": bill.add_compaction(&config.prices, record),
                    "handoff": handoff_text(&record.handoff),
                    // A prepared record waits for the first request that could adopt it.
                    "waiting_from": record.prepared.as_ref().map(|_| requests + 1),
                }));
            }
            Entry::StandIn(stand_in) => {
                let record = &stand_in.record;
                events.push(json!({
                    "type": "stand_in",
                    "at": line.at,
                    "id": record.id,
                    "head": stand_in.head.map(|h| h.to_hex()),
                    "waited_ms": stand_in.waited_ms,
                    "strategy": record.strategy,
                    "chain": record.chain,
                    "tokens_before": record.tokens_before,
                    "tokens_after": record.tokens_after,
                    "covers": record.source.end_exclusive,
                    "attempts": record.attempts,
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
            // Its figures are the request's event's.
            Entry::Decision(_) => {}
            Entry::Pinned(pinned) => events.push(json!({
                "type": "pinned",
                "at": line.at,
                "count": pinned.messages.len(),
                "messages": pinned.messages,
            })),
        }
    }
    if let Some((index, last)) = pending.take() {
        rebuilt[index] = Some(sized(
            &tree,
            &committed,
            &adoption.adopted,
            &message_tokens,
            &rescues,
            &count,
            last,
        ));
    }
    let fallback = rebuilt
        .iter()
        .any(Option::is_some)
        .then(|| budget_of(&tree, config, tokens));
    let sent: Vec<Option<String>> = figures
        .iter()
        .zip(&rebuilt)
        .map(|(figure, rebuilt)| match (figure.decision, rebuilt) {
            (Some(decision), _) => decision.compaction.clone(),
            (None, Some(rebuilt)) => rebuilt.compaction.clone(),
            (None, None) => None,
        })
        .collect();
    let first_uses = compacted_here(sent.iter().map(Option::as_deref));
    for (index, figure) in figures.iter().enumerate() {
        let Some(event) = request_events.get(index).and_then(|&at| events.get_mut(at)) else {
            continue;
        };
        let rescued = rescues.contains_key(&figure.head);
        add_figures(event, figure, rebuilt[index].as_ref(), fallback, rescued);
        event["compacted_here"] = json!(first_uses[index]);
    }
    // When each request was logged: a preparation started during the last one before it.
    let request_times: Vec<String> = request_events
        .iter()
        .filter_map(|&at| events.get(at))
        .map(|e| e["at"].as_str().unwrap_or_default().to_owned())
        .collect();
    // A prepared record is waiting from its commit to the first request that used it.
    for event in &mut events {
        if event["type"] != "compaction" || event["waiting_from"].is_null() {
            continue;
        }
        let id = event["id"].as_str().unwrap_or_default();
        let adopted = sent
            .iter()
            .position(|c| c.as_deref() == Some(id))
            .map(|at| at + 1);
        // Committed while the request that crossed the trigger waited for it: that
        // request both waited and adopted.
        let waited = adopted.is_some_and(|at| Some(at as u64) < event["waiting_from"].as_u64());
        if waited {
            event["waiting_from"] = json!(adopted);
        }
        event["adopted_at"] = json!(adopted);
        event["waited"] = json!(waited);
        // Both times are RFC 3339 in UTC to the millisecond: as strings they sort.
        let started = event["prepared"]["started"].as_str().unwrap_or_default();
        let started_from = request_times
            .iter()
            .filter(|at| at.as_str() <= started)
            .count();
        event["started_from"] = json!(started_from.max(1));
    }
    let latest = figures.iter().rev().find_map(|f| f.decision);
    let uncommitted = adoption.uncommitted.clone();
    let (window, trigger, input_budget) = match (latest, fallback) {
        (Some(d), _) => (Some(d.window), Some(d.trigger), Some(d.input_budget)),
        (None, Some(fallback)) => fallback,
        (None, None) => budget_of(&tree, config, tokens),
    };
    let mut value = serde_json::to_value(summarize(id, log)).unwrap_or(Value::Null);
    value["dialect"] = json!(tree.dialect().name());
    // The chart's series, whole whichever page of events a reader shows.
    value["chart"] = Value::Array(
        request_events
            .iter()
            .filter_map(|&at| events.get(at))
            .map(chart_point)
            .collect(),
    );
    value["prepared"] = Value::Array(
        events
            .iter()
            .filter(|e| e["type"] == "compaction" && !e["waiting_from"].is_null())
            .map(|e| json!({"id": e["id"], "started": e["prepared"]["started"], "finished": e["at"], "started_from": e["started_from"], "waiting_from": e["waiting_from"], "adopted_at": e["adopted_at"], "waited": e["waited"]}))
            .collect(),
    );
    value["events"] = Value::Array(events);
    // Everything `audit verify` finds, not only unreadable lines: a torn or planted
    // line makes the rest of the page untrustworthy, and the page says so first.
    let mut problems = super::verify_log(log);
    problems.extend(crate::adoption::compaction_problems(log));
    problems.sort_by_key(|p| p.line);
    value["bill"] = bill.json();
    value["problems"] = json!(problems.len());
    value["problem_list"] = Value::Array(
        problems
            .iter()
            .take(PROBLEMS_SHOWN)
            .map(|p| json!({"line": p.line, "reason": p.reason}))
            .collect(),
    );
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

/// What a request was sent with, rebuilt for a log without its decision.
#[derive(Clone)]
struct Sent {
    tokens: Option<u64>,
    compaction: Option<String>,
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
    }
}

/// A request's timeline event, before its figures.
fn request_event(at: &str, request: &RequestLine) -> Value {
    json!({
        "type": "request",
        "at": at,
        "model": request.model,
        "stream": request.stream,
        "head": request.head.map(|h| h.to_hex()),
        "new_messages": request.new_messages,
        "forms": request.forms.iter().map(|(slot, form)| json!({"of": slot.to_hex(), "form": form.to_hex()})).collect::<Vec<_>>(),
        "inline_forms": request.inline_forms.iter().map(|(at, _)| at).collect::<Vec<_>>(),
        "server_held": request.server_held.unwrap_or(false),
    })
}

/// Adds a request's figures to its event: the logged decision's, else `rebuilt` with
/// the `fallback` budget (the latest request's, from today's config), marked estimated.
fn add_figures(
    event: &mut Value,
    figure: &RequestFigures<'_>,
    rebuilt: Option<&Sent>,
    fallback: Option<(Option<u64>, Option<u64>, Option<u64>)>,
    rescued: bool,
) {
    event["number"] = json!(figure.number);
    event["provider_tokens"] = json!(figure.provider);
    event["rescued"] = json!(rescued);
    if let Some(d) = figure.decision {
        let fields = json!({
            "estimated": false,
            "estimated_tokens": d.estimate,
            "local_tokens": d.local,
            "compaction": d.compaction,
            "window": d.window,
            "reserved": d.reserved,
            "input_budget": d.input_budget,
            "trigger": d.trigger,
            "tools_tokens": d.tools,
            "over": d.over,
            "retries": d.retries,
            "refused": d.refused,
            "refusal": d.detail,
            "upstream_status": d.upstream_status,
            "from_record": d.from_record,
        });
        merge(event, fields);
        return;
    }
    let (window, trigger, input_budget) = fallback.unwrap_or_default();
    merge(
        event,
        json!({
            "estimated": true,
            "estimated_tokens": rebuilt.and_then(|r| r.tokens),
            "compaction": rebuilt.and_then(|r| r.compaction.clone()),
            "window": window,
            "input_budget": input_budget,
            "trigger": trigger,
        }),
    );
}

/// The fields of a request's event the chart draws.
fn chart_point(event: &Value) -> Value {
    const FIELDS: [&str; 17] = [
        "number",
        "provider_compacted",
        "estimated",
        "estimated_tokens",
        "provider_tokens",
        "compaction",
        "compacted_here",
        "rescued",
        "window",
        "input_budget",
        "trigger",
        "over",
        "retries",
        "refused",
        "upstream_status",
        "server_held",
        "from_record",
    ];
    Value::Object(
        FIELDS
            .iter()
            .map(|field| ((*field).to_owned(), event[*field].clone()))
            .collect(),
    )
}

/// Copies the fields of `fields` into `event`.
fn merge(event: &mut Value, fields: Value) {
    if let (Some(event), Value::Object(fields)) = (event.as_object_mut(), fields) {
        event.extend(fields);
    }
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

/// The handoff's text, whatever its dialect's shape (Gemini's in `parts`).
fn handoff_text(handoff: &Value) -> String {
    let content = match handoff.get("content") {
        Some(content) => content,
        None => &handoff["parts"],
    };
    match content {
        Value::String(text) => text.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p["text"].as_str())
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}
