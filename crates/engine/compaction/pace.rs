//! `compaction.prepare_at = "auto"`: when to start preparing a conversation's
//! compaction, from how fast it has grown (tokens per request, seconds between requests)
//! and how long its summariser has taken, so that the handoff is ready before the view
//! reaches the trigger.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

// The runtime's clock: paused in tests, the system's otherwise.
use tokio::time::Instant;

use crate::conversation::ConversationId;

/// The summariser's time assumed before one was measured.
const LATENCY_PRIOR: Duration = Duration::from_secs(10);

/// The mark used until a conversation has shown how it grows: as a fixed share would.
const SHARE_UNTIL_MEASURED: f64 = 0.8;

/// The earliest mark, as a share of the trigger. What arrives between a preparation
/// and its adoption stays verbatim, so one made at half the trigger leaves the view at
/// about half the trigger plus its handoff when adopted; earlier would leave it near
/// the trigger again. The latest mark is the trigger itself: a view that crosses it
/// with nothing prepared starts its compaction and is sent as it is, when it fits.
const EARLIEST: f64 = 0.5;

/// Margin on the growth expected while the summary is written: an agent's growth
/// comes in bursts (a user turn, then small tool round trips), an average does not.
const MARGIN: f64 = 1.5;

/// The longest summary worth waiting for at the trigger instead of preparing it: a
/// request that waits this long costs less than keeping verbatim, until the next
/// compaction, every message that arrives while a summary is written.
const QUICK: Duration = Duration::from_secs(2);

/// Weight of a new observation in the running averages.
const WEIGHT: f64 = 0.3;

/// Conversations whose pace is remembered.
const CONVERSATIONS: u64 = 100_000;

/// The two sizes a preparation is paced against, in calibrated tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Past it, a view adopts a prepared compaction (or compacts).
    pub trigger: u64,
    /// The largest view sent while its compaction is still being written: a
    /// preparation must land before the view grows past it.
    pub deadline: u64,
}

/// A view as sent: its estimate, and how many non-pinned originals it carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Settled {
    /// Its estimated tokens.
    pub tokens: u64,
    /// The non-pinned originals the request carries.
    pub messages: usize,
}

/// How one conversation has been growing.
#[derive(Debug, Clone, Copy)]
struct Growth {
    last_estimate: u64,
    last_at: Instant,
    /// Tokens a request adds, on average.
    per_request: f64,
    /// Seconds between requests, on average.
    interval: f64,
    /// Requests that showed growth.
    samples: u32,
}

/// The paces of conversations and the latencies of summarisers.
pub struct Pace {
    conversations: moka::sync::Cache<ConversationId, Growth>,
    latencies: Mutex<HashMap<String, f64>>,
    /// Each conversation's compaction in force, and its view when first sent.
    settled: moka::sync::Cache<ConversationId, (Arc<str>, Settled)>,
}

impl Default for Pace {
    fn default() -> Self {
        Self {
            conversations: moka::sync::Cache::new(CONVERSATIONS),
            latencies: Mutex::default(),
            settled: moka::sync::Cache::new(CONVERSATIONS),
        }
    }
}

impl Pace {
    /// `id`'s view when it was first sent on compaction `compact_id`, given that this
    /// view is `now`: where the conversation restarted from. `None` before its first
    /// compaction.
    pub fn settled(
        &self,
        id: &ConversationId,
        compact_id: Option<&str>,
        now: Settled,
    ) -> Option<Settled> {
        let compact_id = compact_id?;
        match self.settled.get(id) {
            Some((known, first)) if &*known == compact_id => Some(first),
            _ => {
                self.settled
                    .insert(id.clone(), (Arc::from(compact_id), now));
                Some(now)
            }
        }
    }

    /// Notes a request of `id` whose view was estimated at `estimate` tokens, now.
    pub fn observe(&self, id: &ConversationId, estimate: u64) {
        self.observe_at(id, estimate, Instant::now());
    }

    fn observe_at(&self, id: &ConversationId, estimate: u64, now: Instant) {
        let growth = match self.conversations.get(id) {
            None => Growth {
                last_estimate: estimate,
                last_at: now,
                per_request: 0.0,
                interval: 0.0,
                samples: 0,
            },
            // A smaller view (a compaction adopted, a branch) says nothing of growth.
            Some(last) if estimate <= last.last_estimate => Growth {
                last_estimate: estimate,
                last_at: now,
                ..last
            },
            Some(last) => {
                let added = (estimate - last.last_estimate) as f64;
                let seconds = now.duration_since(last.last_at).as_secs_f64();
                let average = |old: f64, new: f64| match last.samples {
                    0 => new,
                    _ => old + WEIGHT * (new - old),
                };
                Growth {
                    last_estimate: estimate,
                    last_at: now,
                    per_request: average(last.per_request, added),
                    interval: average(last.interval, seconds),
                    samples: last.samples.saturating_add(1),
                }
            }
        };
        self.conversations.insert(id.clone(), growth);
    }

    /// What one request of `id` adds, on average, once it has shown it.
    pub fn per_request(&self, id: &ConversationId) -> Option<u64> {
        let growth = self.conversations.get(id).filter(|g| g.samples >= 2)?;
        Some(growth.per_request as u64)
    }

    /// True when summaries by `model` were timed, and take well within `max_wait` and
    /// [`QUICK`] (with the margin): the request that crosses the trigger waits for one
    /// rather than go on without it.
    pub fn worth_waiting_for(&self, model: &str, max_wait: Duration) -> bool {
        let limit = max_wait.min(QUICK).as_secs_f64();
        self.latency(model)
            .is_some_and(|took| took.as_secs_f64() * MARGIN <= limit)
    }

    /// How long a summary by `model` was measured to take, if one was.
    pub fn latency(&self, model: &str) -> Option<Duration> {
        let latencies = self.latencies.lock().ok()?;
        latencies.get(model).map(|s| Duration::from_secs_f64(*s))
    }

    /// Notes that a summary by `model` took `took`.
    pub(crate) fn note_latency(&self, model: &str, took: Duration) {
        let Ok(mut latencies) = self.latencies.lock() else {
            return;
        };
        let took = took.as_secs_f64();
        latencies
            .entry(model.to_owned())
            .and_modify(|old| *old += WEIGHT * (took - *old))
            .or_insert(took);
    }

    /// `id`'s growth, once it has shown one, and how many of its requests arrive while
    /// a summary by `model` is written (its measured latency, or the prior).
    fn while_summarising(&self, id: &ConversationId, model: &str) -> Option<(Growth, f64)> {
        let growth = self.conversations.get(id).filter(|g| g.samples >= 2)?;
        let latency = self
            .latencies
            .lock()
            .ok()
            .and_then(|l| l.get(model).copied())
            .unwrap_or(LATENCY_PRIOR.as_secs_f64());
        Some((growth, latency / growth.interval.max(0.05)))
    }

    /// The latest estimate at which `id`'s compaction can start and still land before
    /// the view passes `limits.deadline`, by the growth expected while a summary by
    /// `model` is written (no margin), and never past the trigger; `None` until the
    /// conversation has shown how it grows.
    pub fn latest_start(&self, id: &ConversationId, limits: Limits, model: &str) -> Option<u64> {
        let (growth, requests) = self.while_summarising(id, model)?;
        let coming = (growth.per_request * (requests.ceil() + 1.0)) as u64;
        Some(limits.deadline.saturating_sub(coming).min(limits.trigger))
    }

    /// The estimate past which `id`'s compaction should be prepared, for a summary by
    /// `model`: as late as lets it land before the view passes `limits.deadline`, given
    /// what the conversation adds while the summary is written (with a margin), and
    /// never past the trigger. The later it starts, the less arrives before it is
    /// adopted, and the less the view keeps verbatim beyond `keep_recent`: each
    /// compaction then removes as much as an inline one, and the conversation
    /// compacts (and rewrites its prompt cache) no more often.
    ///
    /// A summariser [worth waiting for](Self::worth_waiting_for) is not prepared for:
    /// the request that crosses the trigger waits for it, as inline, and the view keeps
    /// no more than `keep_recent` verbatim.
    pub fn mark(
        &self,
        id: &ConversationId,
        limits: Limits,
        model: &str,
        max_wait: Duration,
    ) -> u64 {
        if self.worth_waiting_for(model, max_wait) {
            return limits.trigger;
        }
        let share = |s: f64| (limits.trigger as f64 * s) as u64;
        let Some((growth, requests)) = self.while_summarising(id, model) else {
            return share(SHARE_UNTIL_MEASURED);
        };
        // The requests that arrive while it is written (with the margin), and the one
        // that then reaches the deadline.
        let coming = growth.per_request * (requests * MARGIN + 1.0);
        let mark = limits.deadline as f64 - coming;
        (mark.max(0.0) as u64).clamp(share(EARLIEST), limits.trigger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> ConversationId {
        ConversationId::parse(crate::base::tenant::TenantId::legacy(), name).unwrap()
    }

    fn id() -> ConversationId {
        named("c-pace")
    }

    /// `requests` requests of `id`, each `tokens` more than the one before, `every`
    /// apart from `start`.
    fn grow(pace: &Pace, id: &ConversationId, requests: u64, tokens: u64, every: Duration) {
        let start = Instant::now();
        for n in 0..requests {
            pace.observe_at(id, 1_000 + tokens * n, start + every * n as u32);
        }
    }

    /// The wait a crossing request accepts: shorter than every latency below.
    const WAIT: Duration = Duration::from_millis(500);

    /// A trigger of 10,000 tokens and a deadline 1,000 past it.
    const LIMITS: Limits = Limits {
        trigger: 10_000,
        deadline: 11_000,
    };

    #[test]
    fn a_fast_conversation_with_a_slow_summariser_prepares_early_and_a_slow_one_late() {
        let pace = Pace::default();
        assert_eq!(
            pace.mark(&id(), LIMITS, "m", WAIT),
            8_000,
            "unmeasured: 0.8"
        );
        // 300 tokens a request, a request every 0.5 s; summaries take 4 s.
        grow(&pace, &id(), 6, 300, Duration::from_millis(500));
        pace.note_latency("m", Duration::from_secs(4));
        // 8 requests of 300 tokens with the margin, and the one that reaches the
        // deadline: 3,900 before it.
        assert_eq!(pace.mark(&id(), LIMITS, "m", WAIT), 7_100);
        // A slower summariser: prepared earlier, never before half the trigger.
        pace.note_latency("slow", Duration::from_secs(60));
        assert_eq!(pace.mark(&id(), LIMITS, "slow", WAIT), 5_000);
        // A conversation that barely grows: prepared when it crosses the trigger.
        let calm = named("c-calm");
        grow(&pace, &calm, 6, 10, Duration::from_secs(30));
        assert_eq!(pace.mark(&calm, LIMITS, "m", WAIT), 10_000);
    }

    #[test]
    fn the_latest_start_is_the_deadline_less_the_growth_while_a_summary_is_written() {
        let pace = Pace::default();
        assert_eq!(pace.latest_start(&id(), LIMITS, "m"), None, "unmeasured");
        // 300 tokens a request, a request every 0.5 s; summaries take 2 s.
        grow(&pace, &id(), 4, 300, Duration::from_millis(500));
        pace.note_latency("m", Duration::from_secs(2));
        // 4 requests while it is written and the one that crosses, no margin.
        assert_eq!(pace.latest_start(&id(), LIMITS, "m"), Some(11_000 - 1_500));
        // Never past the trigger.
        let late = Limits {
            deadline: 20_000,
            ..LIMITS
        };
        assert_eq!(pace.latest_start(&id(), late, "m"), Some(10_000));
    }

    #[test]
    fn a_view_that_shrinks_is_no_growth() {
        let pace = Pace::default();
        let start = Instant::now();
        for (n, estimate) in [1_000u64, 1_500, 2_000, 600, 1_100].iter().enumerate() {
            pace.observe_at(&id(), *estimate, start + Duration::from_secs(n as u64));
        }
        pace.note_latency("m", Duration::from_secs(1));
        // 500 tokens a request, one a second: one request with the margin, and one.
        assert_eq!(pace.mark(&id(), LIMITS, "m", WAIT), 11_000 - 1_250);
    }

    #[test]
    fn a_quick_summariser_is_waited_for_at_the_trigger() {
        let pace = Pace::default();
        grow(&pace, &id(), 6, 1_000, Duration::from_millis(500));
        pace.note_latency("m", Duration::from_millis(600));
        let wait = Duration::from_secs(2);
        assert!(pace.worth_waiting_for("m", wait));
        assert_eq!(pace.mark(&id(), LIMITS, "m", wait), 10_000);
        // Within the wait only without the margin: prepared by the pace, 1.2 requests
        // of 1,000 tokens with the margin, and one, before the deadline.
        assert!(!pace.worth_waiting_for("m", Duration::from_millis(800)));
        let mark = pace.mark(&id(), LIMITS, "m", Duration::from_millis(800));
        assert_eq!(mark, 11_000 - 2_800);
        // Never timed: never waited for. Nor one slower than QUICK, whatever max_wait.
        assert!(!pace.worth_waiting_for("other", wait));
        pace.note_latency("slow", Duration::from_secs(3));
        assert!(!pace.worth_waiting_for("slow", Duration::from_secs(60)));
    }
}
