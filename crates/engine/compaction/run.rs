//! One pass of a compaction: from a plan (where to cut) to a record ready to commit.
//! The history before the cut goes to the strategy chain in the neutral form, the
//! ledger takes its share first and the room the strategy left after, and the record
//! is measured as the request's model will read it.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::SystemTime;

// The runtime's clock, as the pace's: a summariser's latency is planned against the
// seconds between requests, and both are virtual on paused time.
use tokio::time::Instant;

use handoff_plugin_api::{Budgets, CancellationToken, StrategyInput, Unit};
use serde_json::json;

use super::chain::{run_chain, sum_usage, ChainOutcome, CountFor};
use super::handoff::{continuation_message, handoff_message, needs_reasoning_marker};
use super::job::{CompactError, Compactor, Job};
use super::ledger::{self, Ledger, LedgerWork};
use super::plan::{handoff_budget, handoff_counter, plan, user_slack, Plan};
use super::unit::split_into_units;
use super::Adopted;
use crate::base::line::{Entry, FORMAT_VERSION};
use crate::base::record::{
    Attempt, CompactionRecord, Prepared, Reason, RecordSource, POLICY_VERSION,
};
use crate::dialect::objects::REFERENCE_TYPE;
use crate::dialect::Message;
use crate::projection::ModelView;
use crate::store::StoreError;
use crate::tokens::{MESSAGE_OVERHEAD, REPLY_PRIMING};

/// Tokens the handoff pair may take with the view still under the trigger: the
/// trigger less everything else the view holds (pinned, tools, lifted, recent).
fn room_under_trigger(job: &Job<'_>, plan: &Plan) -> u64 {
    job.threshold
        .saturating_sub(job.scale.tokens(plan.rest + 2 * MESSAGE_OVERHEAD + 64))
}

/// Share of the trigger a compacted view may reach when its handoff grows to keep the
/// user's messages whole: well under `compaction.prepare_at`'s default (0.8), so the
/// turns that arrive while a prepared compaction waits, and the next few, neither
/// compact nor prepare again at once (0.65 made a 4k conversation of 500-token turns
/// prepare on every turn).
const GROWN_VIEW_SHARE: f64 = 0.5;

/// Tokens a handoff may grow to, past its budget, before it cuts a user message: what
/// leaves the view at [`GROWN_VIEW_SHARE`] of the trigger; and when the user's words
/// need more (up to a quarter of the input budget: `plan.users`), what they need, up
/// to what the window allows (less [`WINDOW_MARGIN_SHARE`]). The plan kept a recent
/// part small enough for them under the trigger where one was; where the newest unit
/// alone leaves no such room, the view goes over the trigger rather than lose what the
/// user said.
fn room_for_user_text(job: &Job<'_>, plan: &Plan) -> u64 {
    let rest = job.scale.tokens(plan.rest + 2 * MESSAGE_OVERHEAD + 64);
    let grown = grown_room(job, plan);
    let needed = job.scale.tokens(plan.users + user_slack(&job.model));
    let limit = job.hard_limit();
    let window = (limit - (limit as f64 * WINDOW_MARGIN_SHARE) as u64).saturating_sub(rest);
    grown.max(needed.min(window))
}

/// Tokens a handoff may take that leave the view at [`GROWN_VIEW_SHARE`] of the trigger.
fn grown_room(job: &Job<'_>, plan: &Plan) -> u64 {
    // The share is of the conversation's room: what pinned messages and tool schemas
    // leave under the trigger (4-5k tokens of schemas would leave none of half of 8k).
    let fixed = job.scale.tokens(plan.fixed);
    let aim = fixed + (job.threshold.saturating_sub(fixed) as f64 * GROWN_VIEW_SHARE) as u64;
    aim.saturating_sub(job.scale.tokens(plan.rest + 2 * MESSAGE_OVERHEAD + 64))
}

/// Share of the input budget a handoff grown for user text leaves free: the local count
/// is an estimate, and the upstream's own may be a little higher.
const WINDOW_MARGIN_SHARE: f64 = 0.05;

/// Tokens a deterministic handoff must leave for the ledger to be appended at all: its
/// headings alone take about fifty.
const LEDGER_LEAST_ROOM: u64 = 96;

/// What the chain wrote, before the record is drafted.
struct Written {
    strategy: String,
    text: String,
    attempts: Vec<Attempt>,
}

/// Runs the chain once over the history before `keep_only_last`'s plan cut, and
/// drafts the record; nothing is committed here.
pub(super) async fn run_once(
    compactor: &Compactor,
    job: &Job<'_>,
    view: &ModelView<'_>,
    before: u64,
    keep_only_last: bool,
) -> Result<CompactionRecord, CompactError> {
    let started = Instant::now();
    let plan = plan(&compactor.tokens, job, view, keep_only_last)?;
    let referenced = referenced_items(job, &view.live).await;
    let history = history_units(job, view, plan.cut, &referenced);
    // The ledger is built first: the strategy gets the budget it leaves.
    let previous = view.compaction.as_ref().map(|a| &a.record);
    let budget = handoff_budget(&job.model);
    let (history, ledger) = ledger(compactor, job, previous, history, budget).await;
    let cancel = compactor.cancel.child_token();
    let input = strategy_input(
        compactor,
        job,
        view,
        &plan,
        (history, &referenced),
        budget,
        &ledger,
        &cancel,
    );
    // A deterministic handoff leaves the ledger half its share: it quotes the user's
    // messages and the edges of tool results itself, and the ledger adds the
    // identifiers it has no room for.
    let planned = ledger.as_ref().map_or(0, |(_, tokens)| *tokens);
    let reserve = planned / 2;
    let outcome = run_equipped(compactor, job, input, budget.saturating_sub(reserve)).await;
    let written = written(compactor, outcome, &cancel)?;
    let deterministic = job
        .chain
        .iter()
        .any(|s| s.name == written.strategy && s.strategy.is_deterministic());
    if !deterministic {
        // What `prepare_at = "auto"` plans with: how long this summariser takes.
        compactor
            .pace
            .note_latency(&job.model.summary_model, started.elapsed());
    }
    let text = with_ledger(
        compactor,
        job,
        &plan,
        (budget, deterministic.then_some(reserve)),
        ledger,
        written.text,
    )
    .await;
    let mut record = draft(
        compactor,
        job,
        view,
        &plan,
        before,
        written.strategy,
        &text,
        written.attempts,
    )?;
    if job.reason == Reason::Prepared {
        let started = SystemTime::now() - started.elapsed();
        record.prepared = Some(Prepared {
            started: humantime::format_rfc3339_millis(started).to_string(),
            messages: job.tracked.message_digests.len(),
        });
    }
    compactor.metrics.add(
        "handoff_compaction_duration_seconds_sum",
        &[],
        started.elapsed().as_secs_f64(),
    );
    compactor
        .metrics
        .add("handoff_compaction_duration_seconds_count", &[], 1.0);
    Ok(record)
}

/// The ledger of `history` (with `previous`'s carried forward) and the tokens its
/// share of `budget` takes; `None` when it is off or has nothing to say. Built and
/// fitted on the blocking pool; `history` comes back as it went.
async fn ledger(
    compactor: &Compactor,
    job: &Job<'_>,
    previous: Option<&CompactionRecord>,
    history: Vec<Unit>,
    budget: u64,
) -> (Vec<Unit>, Option<(Ledger, u64)>) {
    let share = job.config.ledger_share;
    if share <= 0.0 {
        return (history, None);
    }
    let counter = handoff_counter(&compactor.tokens, job);
    let previous = previous.and_then(|r| r.ledger.clone());
    let limit = (budget as f64 * share) as u64;
    let history = Arc::new(history);
    let shared = Arc::clone(&history);
    let work = move || {
        let whole = Ledger::build(previous.as_ref(), &shared);
        if whole.is_empty() {
            return None;
        }
        let mut planned = whole.clone();
        planned.fit(limit, counter.as_ref(), "");
        let tokens = counter.count_text(&planned.render(""));
        Some((whole, tokens))
    };
    let ledger = super::blocking::run(work).await.flatten();
    // The work's own reference is gone with it: this is no copy.
    (Arc::unwrap_or_clone(history), ledger)
}

/// What the chain reads: the history, the recent part, the previous handoff
/// (without its ledger, which the new one carries), and the budgets.
#[allow(clippy::too_many_arguments)]
fn strategy_input(
    compactor: &Compactor,
    job: &Job<'_>,
    view: &ModelView<'_>,
    plan: &Plan,
    (history, referenced): (Vec<Unit>, &Referenced),
    budget: u64,
    ledger: &Option<(Ledger, u64)>,
    cancel: &CancellationToken,
) -> StrategyInput {
    let dialect = job.request.dialect();
    let previous = view.compaction.as_ref().map(|a| &a.record);
    let ledger_tokens = ledger.as_ref().map_or(0, |(_, tokens)| *tokens);
    StrategyInput {
        conversation_id: job.id.to_string(),
        history,
        retained_recent_messages: view.live[plan.cut..]
            .iter()
            .flat_map(|m| dialect.neutral(resolved(m, referenced)))
            .collect(),
        dialect: job.request.dialect.name().to_owned(),
        previous_handoff: previous.map(|record| match ledger {
            Some(_) => ledger::strip(record.handoff_text()).to_owned(),
            None => record.handoff_text().to_owned(),
        }),
        model: job.model.clone(),
        budgets: Budgets {
            input_budget: job.input_budget,
            handoff_tokens: budget.saturating_sub(ledger_tokens),
            max_calls: job.config.max_summary_calls,
            room_tokens: room_for_user_text(job, plan),
            parallel_calls: job.config.fold_concurrency.max(1),
        },
        cancel: cancel.clone(),
        client: Arc::clone(&job.client),
        tokens: compactor.tokens.counter(job.summary_tokenizer),
        conversation: continued(compactor, job, view, plan),
    }
}

/// The conversation continued before the plan's cut, when the summary model is the
/// request's own: the view's prefix, as the upstream read it, in the model's count.
fn continued(
    compactor: &Compactor,
    job: &Job<'_>,
    view: &ModelView<'_>,
    plan: &Plan,
) -> Option<Arc<dyn handoff_plugin_api::ConversationClient>> {
    let continuer = job.continuer.as_ref()?;
    if job.model.summary_model != job.model.model {
        return None;
    }
    let recent = job.scale.tokens(plan.rest.saturating_sub(plan.fixed));
    let prefix = job.count(&compactor.tokens, view).saturating_sub(recent);
    let client = Arc::new(super::model_client::Bounded::new(
        Arc::clone(&continuer.client),
        Arc::clone(&compactor.summary_slots),
        job.tally.clone(),
    ));
    continuer.conversation(view, plan.cut, prefix, client)
}

/// Runs the chain, each strategy counting in the tokens it is judged in: a summary
/// call in its model's, a deterministic handoff in the request model's.
///
/// A deterministic handoff gets `budget` (the handoff budget less half the ledger's
/// share), not what the whole share leaves: it quotes the user's messages and the
/// edges of tool results itself, which the share reserved for a model's summary
/// crowded out (a 22-turn agent lost the edges of its oldest tool results).
async fn run_equipped(
    compactor: &Compactor,
    job: &Job<'_>,
    mut input: StrategyInput,
    budget: u64,
) -> ChainOutcome {
    let equip = |input: &mut StrategyInput, count_for: CountFor<'_>| {
        let tokenizer = match count_for {
            CountFor::Handoff => {
                input.tokens = handoff_counter(&compactor.tokens, job);
                input.budgets.handoff_tokens = budget;
                return;
            }
            CountFor::Summary(Some(model)) => model.tokenizer.unwrap_or(job.tokenizer),
            CountFor::Summary(None) => job.summary_tokenizer,
        };
        input.client = Arc::new(super::model_client::Bounded::new(
            Arc::clone(&job.client),
            Arc::clone(&compactor.summary_slots),
            job.tally.clone(),
        ));
        compactor
            .summary_calibrations
            .equip(input, &compactor.tokens, tokenizer, &job.scale);
    };
    equip(&mut input, CountFor::Summary(None));
    run_chain(&job.chain, &input, job.config.summary_timeout, &equip).await
}

/// The handoff the chain wrote, its failed attempts counted; a cancelled run or a
/// chain that wrote nothing is an error.
fn written(
    compactor: &Compactor,
    outcome: ChainOutcome,
    cancel: &CancellationToken,
) -> Result<Written, CompactError> {
    for attempt in outcome.attempts.iter().filter(|a| a.outcome != "ok") {
        compactor.metrics.add(
            "handoff_compaction_attempts_failed_total",
            &[
                ("strategy", &attempt.strategy),
                ("reason", attempt.reason.as_deref().unwrap_or("failed")),
            ],
            1.0,
        );
    }
    let failed = |outcome: &str| {
        compactor.metrics.add(
            "handoff_compactions_total",
            &[("strategy", "none"), ("outcome", outcome)],
            1.0,
        );
    };
    // Checked again after the model returned: a cancelled run commits nothing.
    if cancel.is_cancelled() {
        failed("cancelled");
        return Err(CompactError::Cancelled);
    }
    let Some((strategy, summary)) = outcome.summary else {
        failed("failed");
        let reasons: Vec<String> = outcome
            .attempts
            .iter()
            .filter_map(|a| a.error.clone())
            .collect();
        return Err(CompactError::NoHandoff(reasons.join("; ")));
    };
    Ok(Written {
        strategy,
        text: summary.text,
        attempts: outcome.attempts,
    })
}

/// `text` with the ledger after it. The ledger gets the room the strategy left, as
/// far as the view stays under the trigger: past its share it never pushes a view
/// over. After a deterministic handoff it gets what the handoff `reserved` for it
/// and the room left, or what leaves the view at [`GROWN_VIEW_SHARE`] of the
/// trigger if that is more, and nothing when that cannot hold its headings (the
/// user's messages are then carried unwritten). Fitted on the
/// blocking pool; `text` alone if that failed.
async fn with_ledger(
    compactor: &Compactor,
    job: &Job<'_>,
    plan: &Plan,
    (budget, reserved): (u64, Option<u64>),
    ledger: Option<(Ledger, u64)>,
    text: String,
) -> (String, Option<Ledger>) {
    let Some((mut ledger, planned)) = ledger else {
        return (text, None);
    };
    let counter = handoff_counter(&compactor.tokens, job);
    let under_trigger = room_under_trigger(job, plan);
    let user_room = room_for_user_text(job, plan);
    let grown = grown_room(job, plan);
    let text = Arc::new(text);
    let shared = Arc::clone(&text);
    let work = move || {
        let used = counter.count_text(&shared);
        let left = budget.min(under_trigger).saturating_sub(used);
        let deterministic = reserved.is_some();
        // A deterministic handoff costs no model output: its ledger may take the
        // view to the grown share of the trigger for the facts the text above left.
        // (A model's summary keeps its budget: a larger view would mean more
        // compactions, each a paid call.)
        let left = match reserved {
            Some(reserved) => left.max(reserved).max(grown.saturating_sub(used)),
            None => left,
        };
        if deterministic && left < LEDGER_LEAST_ROOM {
            // The handoff quotes what the ledger would; its headings and counts of
            // what it left out would only push the handoff over its budget. The
            // user's messages are still carried, unwritten, for the next
            // compaction to plan room for them.
            let mut carried = Ledger {
                instructions: std::mem::take(&mut ledger.instructions),
                ..Ledger::default()
            };
            carried.fit(user_room, counter.as_ref(), "");
            return Some((None, carried));
        }
        let room = if deterministic {
            left
        } else {
            left.max(planned)
        };
        // User text last: the ledger grows, within the view's room under the
        // trigger, before it shortens a user message the text above does not quote.
        let whole_users = ledger.instructions_tokens(counter.as_ref(), &shared);
        let room = room.max(whole_users.min(user_room.saturating_sub(used)));
        ledger.fit(room, counter.as_ref(), &shared);
        let joined = format!("{}\n\n{}", shared.trim_end(), ledger.render(&shared));
        Some((Some(joined), ledger))
    };
    match super::blocking::run(work).await.flatten() {
        Some((Some(joined), ledger)) => (joined, Some(ledger)),
        Some((None, carried)) => (Arc::unwrap_or_clone(text), Some(carried)),
        None => (Arc::unwrap_or_clone(text), None),
    }
}

/// The record of this pass: what it covers, the pair in the request's dialect, the
/// attempts and their usage, and its size as the request's model reads it.
#[allow(clippy::too_many_arguments)]
fn draft(
    compactor: &Compactor,
    job: &Job<'_>,
    view: &ModelView<'_>,
    plan: &Plan,
    before: u64,
    strategy: String,
    (text, ledger): &(String, Option<Ledger>),
    attempts: Vec<Attempt>,
) -> Result<CompactionRecord, CompactError> {
    let marker = needs_reasoning_marker(
        job.reasoning_marker,
        job.request.dialect,
        &job.request.messages,
    );
    let start = view.live_start;
    let end_exclusive = start + plan.cut;
    let prefix_digest = job.tracked.prefix[end_exclusive - 1];
    let mut history_hasher = blake3::Hasher::new();
    for digest in &view.live_digests[..plan.cut] {
        history_hasher.update(digest.to_hex().as_bytes());
    }
    let id = {
        let mut hasher = blake3::Hasher::new();
        hasher.update(job.id.as_str().as_bytes());
        hasher.update(prefix_digest.to_hex().as_bytes());
        hasher.update(format!("{:?}", SystemTime::now()).as_bytes());
        format!("cmp-{}", &hasher.finalize().to_hex()[..20])
    };
    let usage = sum_usage(&attempts);
    let mut record = CompactionRecord {
        v: FORMAT_VERSION,
        kind: "compaction".into(),
        id,
        at: humantime::format_rfc3339_millis(SystemTime::now()).to_string(),
        strategy,
        chain: job.chain.iter().map(|s| s.name.clone()).collect(),
        reason: job.reason,
        policy_version: POLICY_VERSION,
        source: RecordSource {
            start,
            end_exclusive,
            prefix_digest,
            tool_call_ids: view.live[..plan.cut]
                .iter()
                .flat_map(|m| m.tool_call_ids().map(str::to_owned))
                .collect(),
            history_digest: history_hasher.finalize().to_hex().to_string(),
            previous_compaction: view.compaction.as_ref().map(|a| a.record.id.clone()),
        },
        continuation: continuation_message(job.request.dialect),
        handoff: handoff_message(job.request.dialect, text, marker),
        tokens_before: before,
        tokens_after: plan.predicted,
        usage: if usage.as_object().is_some_and(|u| u.is_empty()) {
            json!(null)
        } else {
            usage
        },
        attempts,
        summary_calls: 0,
        took_over: None,
        ledger: ledger.clone(),
        prepared: None,
    };
    record.tokens_after = measured(compactor, job, view, plan, &record)?;
    Ok(record)
}

/// The view's tokens with `record`'s pair: pinned, tools, priming, the recent part
/// and the pair, as the upstream counts.
fn measured(
    compactor: &Compactor,
    job: &Job<'_>,
    view: &ModelView<'_>,
    plan: &Plan,
    record: &CompactionRecord,
) -> Result<u64, CompactError> {
    let adopted =
        Adopted::new(record.clone()).map_err(|err| CompactError::Store(StoreError::Encode(err)))?;
    let count = |m: &crate::dialect::Message| m.token_count(&compactor.tokens, job.tokenizer);
    let pinned: u64 = view.pinned.iter().map(|m| count(m.message)).sum();
    let recent: u64 = view.live[plan.cut..].iter().map(count).sum();
    let pair =
        compactor.tokens.count_message(
            job.tokenizer,
            &adopted.continuation_digest,
            &record.continuation,
        ) + compactor
            .tokens
            .count_message(job.tokenizer, &adopted.handoff_digest, &record.handoff);
    Ok(job
        .scale
        .tokens(pinned + job.tools_tokens + REPLY_PRIMING + recent + pair))
}

/// The items `item_reference`s name, by id, as the conversation logged them.
type Referenced = HashMap<String, serde_json::Value>;

/// The logged items the `item_reference`s among `messages` name: the upstream expands
/// a reference to its item, and a strategy must read the item, not its id. The
/// conversation's own log is read only when there is a reference.
async fn referenced_items(job: &Job<'_>, messages: &[Message]) -> Referenced {
    let wanted: HashSet<&str> = messages
        .iter()
        .filter(|m| m.item_type() == Some(REFERENCE_TYPE))
        .filter_map(|m| m.value().get("id").and_then(serde_json::Value::as_str))
        .collect();
    if wanted.is_empty() {
        return Referenced::new();
    }
    let log = match job.tracker.store().read(job.id).await {
        Ok(log) => log,
        Err(err) => {
            tracing::warn!(conversation = %job.id, error = %err, "cannot read the items references name; the strategies read the references");
            return Referenced::new();
        }
    };
    log.lines
        .iter()
        .filter_map(|line| match &line.entry {
            Entry::Message(message) => serde_json::from_str(message.message.get()).ok(),
            _ => None,
        })
        .filter_map(|item: serde_json::Value| {
            let id = item.get("id")?.as_str()?.to_owned();
            let named =
                wanted.contains(id.as_str()) && item.get("type")?.as_str()? != REFERENCE_TYPE;
            named.then_some((id, item))
        })
        .collect()
}

/// The message as a strategy reads it: a reference as the item it names, when logged.
fn resolved<'m>(message: &'m Message, referenced: &'m Referenced) -> &'m serde_json::Value {
    if message.item_type() == Some(REFERENCE_TYPE) {
        let id = message
            .value()
            .get("id")
            .and_then(serde_json::Value::as_str);
        if let Some(item) = id.and_then(|id| referenced.get(id)) {
            return item;
        }
    }
    message.value()
}

/// The history before `cut` as the strategies read it: units in the neutral form,
/// instruction messages left out (they stay verbatim in every view), references as
/// the items they name.
fn history_units(
    job: &Job<'_>,
    view: &ModelView<'_>,
    cut: usize,
    referenced: &Referenced,
) -> Vec<Unit> {
    let dialect = job.request.dialect();
    split_into_units(&view.live[..cut])
        .iter()
        .map(|u| Unit {
            messages: view.live[u.start..u.end]
                .iter()
                .filter(|m| !m.role.is_instruction())
                .flat_map(|m| dialect.neutral(resolved(m, referenced)))
                .collect(),
        })
        .filter(|unit| !unit.messages.is_empty())
        .collect()
}
