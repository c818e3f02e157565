//! Per-key rate limits: requests per minute and estimated input tokens per minute, as
//! token buckets that refill continuously, so a burst is allowed up to the minute's
//! allowance and the wait after it is exact.

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
pub struct RateLimiter {
    buckets: Mutex<HashMap<(String, &'static str), Bucket>>,
}

/// A limit that was hit: which, and how long until the request would pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Exceeded {
    /// `rpm` or `tpm`.
    pub limit: &'static str,
    /// The per-minute allowance.
    pub per_minute: u64,
    /// How long to wait.
    pub retry_after: Duration,
}

impl RateLimiter {
    /// Takes one request and `tokens` estimated tokens from `key`'s buckets, or says
    /// which limit is hit; a refused request takes nothing.
    pub fn admit(
        &self,
        key: &str,
        rpm: Option<u32>,
        tpm: Option<u64>,
        tokens: u64,
        now: Instant,
    ) -> Result<(), Exceeded> {
        let Ok(mut buckets) = self.buckets.lock() else {
            // A poisoned lock must not take the proxy down: limits lapse, requests pass.
            return Ok(());
        };
        let wants = [("rpm", rpm.map(u64::from), 1), ("tpm", tpm, tokens)];
        for (limit, per_minute, amount) in wants {
            let Some(per_minute) = per_minute else {
                continue;
            };
            let bucket = refill(&mut buckets, key, limit, per_minute, now);
            // A request larger than a whole minute's allowance waits for a full bucket.
            let needed = (amount as f64).min(per_minute as f64);
            if bucket.level < needed {
                let rate = per_minute as f64 / 60.0;
                let wait = ((needed - bucket.level) / rate).max(0.001);
                return Err(Exceeded {
                    limit,
                    per_minute,
                    retry_after: Duration::from_secs_f64(wait),
                });
            }
        }
        for (limit, per_minute, amount) in wants {
            if let Some(per_minute) = per_minute {
                let bucket = refill(&mut buckets, key, limit, per_minute, now);
                bucket.level -= (amount as f64).min(per_minute as f64);
            }
        }
        Ok(())
    }

    /// Takes `tokens` more from `key`'s `tpm` bucket, below empty if need be (at most a
    /// minute's allowance of debt): what a body turned out to hold beyond its estimate.
    /// The next requests wait until the debt is paid.
    pub fn charge(&self, key: &str, tpm: Option<u64>, tokens: u64, now: Instant) {
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
            assert!(limiter.admit("a", Some(3), None, 0, start).is_ok());
        }
        let refused = limiter.admit("a", Some(3), None, 0, start).unwrap_err();
        assert_eq!(refused.limit, "rpm");
        assert_eq!(refused.retry_after.as_secs(), 20, "one request every 20 s");
        assert!(
            limiter.admit("b", Some(3), None, 0, start).is_ok(),
            "keys are separate"
        );
        assert!(limiter
            .admit("a", Some(3), None, 0, start + Duration::from_secs(20))
            .is_ok());
    }

    #[test]
    fn tokens_are_counted_and_a_refused_request_takes_nothing() {
        let limiter = RateLimiter::default();
        let now = Instant::now();
        assert!(limiter.admit("a", Some(100), Some(1000), 900, now).is_ok());
        let refused = limiter
            .admit("a", Some(100), Some(1000), 200, now)
            .unwrap_err();
        assert_eq!(refused.limit, "tpm");
        assert!(limiter.admit("a", Some(100), Some(1000), 100, now).is_ok());
    }
}
