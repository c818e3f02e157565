//! Where a run cuts: the recent part kept verbatim and the room the handoff pair gets,
//! tried at shrinking shares of `keep_recent`, never inside a unit, never past a
//! provider's compaction item.

use std::sync::Arc;

use handoff_plugin_api::ModelInfo;

use super::budget::ScaledCounter;
use super::job::{CompactError, Job};
use super::split::split_at_unit_boundary;
use super::unit::split_into_units;
use crate::dialect::{Message, Role};
use crate::projection::ModelView;
use crate::tokens::{Tokens, MESSAGE_OVERHEAD, REPLY_PRIMING};

/// Shares of `keep_recent` tried, largest first, before keeping only the last unit.
const KEEP_STEPS: [f64; 4] = [1.0, 0.5, 0.25, 0.0];

/// Tokens a user message costs in a handoff past its text: its item mark, and a share
/// of its section's heading.
const USER_ITEM_TOKENS: u64 = 4;

/// Where a run cuts, and what it predicts of the view after it.
pub(super) struct Plan {
    /// Where the recent part starts in the view's live messages.
    pub(super) cut: usize,
    /// The view's predicted tokens after the run.
    pub(super) predicted: u64,
    /// Local tokens of the view but the pair: pinned, tools, lifted and recent.
    pub(super) rest: u64,
    /// Local tokens every view of the request carries: pinned messages and tools.
    pub(super) fixed: u64,
    /// Local tokens of the user's words the handoff must carry: the compacted span's
    /// user messages and those the previous ledger held, up to [`users_kept_whole`].
    pub(super) users: u64,
}

/// The plan of `job`'s run over `view`, keeping only its newest unit when
/// `keep_only_last`; [`CompactError::TooLarge`] when no cut can make the view fit, and
/// [`CompactError::Uncompactable`] when its tool pairs are broken.
pub(super) fn plan(
    tokens: &Arc<Tokens>,
    job: &Job<'_>,
    view: &ModelView<'_>,
    keep_only_last: bool,
) -> Result<Plan, CompactError> {
    // A history whose tool pairs are broken cannot be cut into valid units.
    job.request
        .dialect()
        .check_pairs(&view.live)
        .map_err(CompactError::Uncompactable)?;
    let units = split_into_units(&view.live);
    let unit_tokens: Vec<u64> = units
        .iter()
        .map(|u| {
            (u.start..u.end)
                .map(|i| view.live[i].token_count(tokens, job.tokenizer))
                .sum()
        })
        .collect();
    let count = |m: &Message| m.token_count(tokens, job.tokenizer);
    let pinned: u64 = view.pinned.iter().map(|m| count(m.message)).sum::<u64>()
        + view.lifted.iter().map(|m| count(m)).sum::<u64>();
    let scale = |local: u64| job.scale.tokens(local);
    let fixed = pinned + job.tools_tokens + REPLY_PRIMING;
    let last = unit_tokens.last().copied().unwrap_or(0);
    let pair_tokens = handoff_budget(&job.model) + 2 * MESSAGE_OVERHEAD + 64;
    if scale(fixed + last) > job.hard_limit() {
        return Err(job.too_large(format!(
            "pinned messages ({}) + tools ({}) + the newest unit ({}) = {} tokens",
            scale(pinned),
            scale(job.tools_tokens),
            scale(last),
            scale(fixed + last)
        )));
    }
    // The newest unit alone keeps the view over the aim: everything before it goes.
    let keep_only_last = keep_only_last || scale(fixed + pair_tokens + last) > job.threshold;
    // The user's words are never cut to keep a recent part: the pair is planned at
    // least as large as the user text it must carry, and a smaller recent part is
    // kept when that text is large.
    let carried_users: u64 = view
        .compaction
        .as_ref()
        .and_then(|adopted| adopted.record.ledger.as_ref())
        .map_or(0, |ledger| {
            let counter = tokens.counter(job.tokenizer);
            (ledger.instructions.iter())
                .map(|text| counter.count_text(text) + USER_ITEM_TOKENS)
                .sum()
        });
    let users_before = |cut: usize| -> u64 {
        carried_users
            + (view.live[..cut].iter())
                .filter(|m| m.role == Role::User && m.is_text_message() && !m.is_tool_answer())
                .map(|m| count(m) + USER_ITEM_TOKENS)
                .sum::<u64>()
    };
    let dialect = job.request.dialect();
    let steps: &[f64] = if keep_only_last { &[0.0] } else { &KEEP_STEPS };
    let mut chosen = None;
    // A provider's compaction artefact is the provider's: no history handoff
    // compacts holds one, so it keeps its bytes and its place.
    let boundary = (view.live.iter())
        .position(Message::is_provider_compaction)
        .unwrap_or(view.live.len());
    for step in steps {
        let keep = ((job.keep_recent * step * job.input_budget as f64) as u64)
            .saturating_sub(job.keep_less);
        let allowed = |at: usize| at <= boundary && dialect.may_cut_at(job.request, &view.live, at);
        // A cut after `cut_from` where there is one (a preparation's: after what the
        // upstream has cached), any allowed cut otherwise.
        let past_cached = |at: usize| view.live_start + at >= job.cut_from && allowed(at);
        let cut = split_at_unit_boundary(&view.live, &units, &unit_tokens, keep, past_cached)
            .or_else(|| split_at_unit_boundary(&view.live, &units, &unit_tokens, keep, allowed));
        let Some(cut) = cut else {
            break;
        };
        let recent: u64 = units
            .iter()
            .zip(&unit_tokens)
            .filter(|(u, _)| u.start >= cut)
            .map(|(_, t)| t)
            .sum();
        // Instruction messages of the new history are lifted into the view, not summarised.
        let lifted: u64 = view.live[..cut]
            .iter()
            .filter(|m| m.role.is_instruction())
            .map(count)
            .sum();
        let recent = recent + lifted;
        let users = users_before(cut).min(users_kept_whole(job.input_budget));
        let pair = pair_tokens.max(users + user_slack(&job.model) + 2 * MESSAGE_OVERHEAD + 64);
        let predicted = scale(fixed + pair + recent);
        chosen = Some(Plan {
            cut,
            predicted,
            rest: fixed + recent,
            fixed,
            users,
        });
        if predicted <= job.threshold {
            break;
        }
    }
    chosen.ok_or_else(|| {
        let total = scale(fixed + unit_tokens.iter().sum::<u64>());
        job.too_large(if units.len() <= 1 {
            format!("nothing left to compact: the view is one unit, {total} tokens")
        } else {
            format!(
                "no cut of the view's {} units can open a valid recent part; it is {total} tokens",
                units.len()
            )
        })
    })
}

/// The counter of what the request's model reads: its tokenizer, its calibration.
pub(super) fn handoff_counter(
    tokens: &Arc<Tokens>,
    job: &Job<'_>,
) -> Arc<dyn handoff_plugin_api::TokenCounter> {
    Arc::new(ScaledCounter {
        inner: tokens.counter(job.tokenizer),
        scale: job.scale.clone(),
    })
}

/// Share of the input budget that the user's words may take in a handoff however
/// large the recent part: the plan keeps a smaller recent part for them. Past it (pasted
/// documents, a long session's worth of instructions) they are shortened to fit half
/// the trigger, so that the conversation keeps room to go on.
const USER_TEXT_SHARE: f64 = 0.25;

/// Local tokens of user text a handoff keeps whole however large the recent part.
pub(super) fn users_kept_whole(input_budget: u64) -> u64 {
    (input_budget as f64 * USER_TEXT_SHARE) as u64
}

/// Tokens a handoff carrying all the user's words needs past them: its headings, the
/// floor of tool results, the last assistant message (a third of the handoff budget).
pub(super) fn user_slack(model: &ModelInfo) -> u64 {
    handoff_budget(model) / 3
}

/// The largest handoff: `min(8192, window/10)` of the request model's window. A summary
/// model with a smaller window writes less (its own output budget bounds its reply),
/// but the deterministic fallback, and the ledger, still get the request model's room.
pub(crate) fn handoff_budget(model: &ModelInfo) -> u64 {
    8192.min(model.context_window / 10)
}
