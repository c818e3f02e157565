//! Per-key rate limits: requests per minute and estimated input tokens per minute, as
//! token buckets that refill continuously, so a burst is allowed up to the minute's
//! allowance and the wait after it is exact. Tokens are reserved before a request is
//! admitted (by its declared length, or an estimate for a chunked body) and settled
//! once its size is known, so requests in flight at once share one allowance.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One bucket: `capacity` per minute, refilled continuously.
#[derive(Debug)]
struct Bucket {
    level: f64,
    at: Instant,
}

/// The buckets of every key, kept across config reloads.
#[derive(Debug, Default)]
pub(crate) struct RateLimiter {
    buckets: Mutex<HashMap<(String, &'static str), Bucket>>,
}

/// A limit that was hit: which, and how long until the request would pass.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Exceeded {
    /// `rpm` or `tpm`.
    pub limit: &'static str,
    /// The per-minute allowance.
    pub per_minute: u64,
    /// How long to wait.
    pub retry_after: Duration,
    /// True when the request alone is larger than a minute's allowance: waiting does
    /// not help.
    pub oversize: bool,
}

/// What a request asks of a key's `tpm` bucket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Want {
    /// Estimated input tokens.
    pub tokens: u64,
    /// How they were estimated.
    pub kind: WantKind,
}

/// How a [`Want`]'s tokens were estimated, and so how a shortfall is met.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WantKind {
    /// From the declared length: more than a minute's allowance is refused.
    Declared,
    /// Declared, and the key lets an oversize request wait for a full bucket.
    OversizeAllowed,
    /// A guess for a body of unknown length: takes what the bucket holds, up to it.
    Estimate,
}

impl Want {
    /// Nothing but the request itself.
    #[cfg(test)]
    pub(crate) const NOTHING: Want = Want {
        tokens: 0,
        kind: WantKind::Declared,
    };
}

impl RateLimiter {
    /// Takes one request and reserves `want`'s tokens from `key`'s buckets, or says
    /// which limit is hit; a refused request takes nothing. Returns the tokens
    /// reserved: an estimate takes what is there, up to itself, and needs one.
    pub(crate) fn admit(
        &self,
        key: &str,
        rpm: Option<u32>,
        tpm: Option<u64>,
        want: Want,
        now: Instant,
    ) -> Result<u64, Exceeded> {
        let tokens = want.tokens;
        if let Some(per_minute) = tpm.filter(|per_minute| tokens > *per_minute) {
            if want.kind == WantKind::Declared {
                return Err(too_large(per_minute));
            }
        }
        let Ok(mut buckets) = self.buckets.lock() else {
            // A poisoned lock must not take the proxy down: limits lapse, requests pass.
            return Ok(0);
        };
        if let Some(per_minute) = rpm.map(u64::from) {
            let bucket = refill(&mut buckets, key, "rpm", per_minute, now);
            if bucket.level < 1.0 {
                return Err(wait_for("rpm", per_minute, 1.0 - bucket.level));
            }
        }
        let reserved = match tpm {
            None => 0,
            Some(per_minute) => {
                let bucket = refill(&mut buckets, key, "tpm", per_minute, now);
                // An oversize body allowed to wait waits for a full bucket.
                let needed = match want.kind {
                    WantKind::Estimate => 1.0_f64.min(tokens as f64),
                    _ => (tokens as f64).min(per_minute as f64),
                };
                if bucket.level < needed {
                    return Err(wait_for("tpm", per_minute, needed - bucket.level));
                }
                let reserved = match want.kind {
                    WantKind::Estimate => (tokens as f64).min(bucket.level.floor()),
                    _ => needed,
                };
                bucket.level -= reserved;
                reserved as u64
            }
        };
        if let Some(per_minute) = rpm.map(u64::from) {
            refill(&mut buckets, key, "rpm", per_minute, now).level -= 1.0;
        }
        Ok(reserved)
    }

    /// Takes `tokens` more from `key`'s `tpm` bucket for a body that held more than was
    /// reserved, or says how long until they would be there; nothing is taken then.
    pub(crate) fn take(
        &self,
        key: &str,
        tpm: Option<u64>,
        tokens: u64,
        now: Instant,
    ) -> Result<(), Exceeded> {
        let (Some(per_minute), true) = (tpm, tokens > 0) else {
            return Ok(());
        };
        let Ok(mut buckets) = self.buckets.lock() else {
            return Ok(());
        };
        let bucket = refill(&mut buckets, key, "tpm", per_minute, now);
        if bucket.level < tokens as f64 {
            return Err(wait_for("tpm", per_minute, tokens as f64 - bucket.level));
        }
        bucket.level -= tokens as f64;
        Ok(())
    }

    /// Gives `tokens` back to `key`'s `tpm` bucket: a reservation the body did not use.
    pub(crate) fn refund(&self, key: &str, tpm: Option<u64>, tokens: u64, now: Instant) {
        let (Some(per_minute), true) = (tpm, tokens > 0) else {
            return;
        };
        let Ok(mut buckets) = self.buckets.lock() else {
            return;
        };
        let bucket = refill(&mut buckets, key, "tpm", per_minute, now);
        bucket.level = (bucket.level + tokens as f64).min(per_minute as f64);
    }

    /// Takes `tokens` more from `key`'s `tpm` bucket, below empty if need be (at most a
    /// minute's allowance of debt): what an admitted oversize body, or a summary call
    /// made for the key's conversation, cost. The next requests wait until it is paid.
    pub(crate) fn charge(&self, key: &str, tpm: Option<u64>, tokens: u64, now: Instant) {
        let (Some(per_minute), true) = (tpm, tokens > 0) else {
            return;
        };
        let Ok(mut buckets) = self.buckets.lock() else {
            return;
        };
        let bucket = refill(&mut buckets, key, "tpm", per_minute, now);
        bucket.level = (bucket.level - tokens as f64).max(-(per_minute as f64));
    }
}

/// The wait until `missing` of `limit` have refilled.
fn wait_for(limit: &'static str, per_minute: u64, missing: f64) -> Exceeded {
    let rate = per_minute as f64 / 60.0;
    Exceeded {
        limit,
        per_minute,
        retry_after: Duration::from_secs_f64((missing / rate).max(0.001)),
        oversize: false,
    }
}

/// A request over a whole minute's `tpm`: told to wait the minute, which will not do.
pub(crate) fn too_large(per_minute: u64) -> Exceeded {
    Exceeded {
        limit: "tpm",
        per_minute,
        retry_after: Duration::from_secs(60),
        oversize: true,
    }
}

fn refill<'a>(
    buckets: &'a mut HashMap<(String, &'static str), Bucket>,
    key: &str,
    limit: &'static str,
    per_minute: u64,
    now: Instant,
) -> &'a mut Bucket {
    let capacity = per_minute as f64;
    let bucket = buckets.entry((key.to_owned(), limit)).or_insert(Bucket {
        level: capacity,
        at: now,
    });
    let elapsed = now.saturating_duration_since(bucket.at).as_secs_f64();
    bucket.level = (bucket.level + elapsed * capacity / 60.0).min(capacity);
    bucket.at = now;
    bucket
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_minute_of_requests_passes_then_the_wait_is_exact() {
        let limiter = RateLimiter::default();
        let start = Instant::now();
        for _ in 0..3 {
            assert!(limiter
                .admit("a", Some(3), None, Want::NOTHING, start)
                .is_ok());
        }
        let refused = limiter
            .admit("a", Some(3), None, Want::NOTHING, start)
            .unwrap_err();
        assert_eq!(refused.limit, "rpm");
        assert_eq!(refused.retry_after.as_secs(), 20, "one request every 20 s");
        assert!(
            limiter
                .admit("b", Some(3), None, Want::NOTHING, start)
                .is_ok(),
            "keys are separate"
        );
        assert!(limiter
            .admit(
                "a",
                Some(3),
                None,
                Want::NOTHING,
                start + Duration::from_secs(20)
            )
            .is_ok());
    }

    #[test]
    fn tokens_are_counted_and_a_refused_request_takes_nothing() {
        let limiter = RateLimiter::default();
        let now = Instant::now();
        assert!(limiter
            .admit("a", Some(100), Some(1000), declared(900), now)
            .is_ok());
        let refused = limiter
            .admit("a", Some(100), Some(1000), declared(200), now)
            .unwrap_err();
        assert_eq!(refused.limit, "tpm");
        assert!(limiter
            .admit("a", Some(100), Some(1000), declared(100), now)
            .is_ok());
    }

    fn declared(tokens: u64) -> Want {
        Want {
            tokens,
            kind: WantKind::Declared,
        }
    }

    #[test]
    fn a_reservation_is_shared_settled_and_refused_past_a_minute() {
        let limiter = RateLimiter::default();
        let now = Instant::now();
        let tpm = Some(1000);
        // Larger than a minute: refused at once, unless allowed to wait and owe.
        let oversize = limiter
            .admit("a", None, tpm, declared(1001), now)
            .unwrap_err();
        assert!(oversize.oversize);
        let allowed = Want {
            tokens: 1001,
            kind: WantKind::OversizeAllowed,
        };
        assert_eq!(limiter.admit("a", None, tpm, allowed, now), Ok(1000));
        // Concurrent reservations share the bucket.
        let b = "b";
        assert_eq!(limiter.admit(b, None, tpm, declared(600), now), Ok(600));
        assert!(limiter.admit(b, None, tpm, declared(600), now).is_err());
        // An estimate takes what is left, and needs something left.
        let guess = Want {
            tokens: 16_384,
            kind: WantKind::Estimate,
        };
        assert_eq!(limiter.admit(b, None, tpm, guess, now), Ok(400));
        assert!(limiter.admit(b, None, tpm, guess, now).is_err());
        // A body smaller than reserved gives the rest back; a larger one takes more.
        limiter.refund(b, tpm, 500, now);
        assert!(limiter.take(b, tpm, 600, now).is_err(), "only 500 are left");
        assert!(limiter.take(b, tpm, 500, now).is_ok());
        limiter.refund(b, tpm, 5000, now);
        assert!(
            limiter.take(b, tpm, 1000, now).is_ok(),
            "a refund fills the bucket, no more"
        );
        assert!(limiter.take(b, tpm, 1, now).is_err());
    }
}
