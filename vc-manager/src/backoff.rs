//! Per-object exponential backoff after failed reconciles (kube-runtime has none). Failures are never
//! terminal: the delay doubles up to a ceiling and a success resets it. A watch event on the object or its
//! children still reconciles it at once, so a fixed cause is picked up without waiting for the delay.

use std::{collections::HashMap, sync::Mutex, time::Duration};

/// Consecutive failures per object and the delays they lead to.
#[derive(Debug)]
pub struct Backoff {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<String, u32>>,
}

impl Backoff {
    /// Delays `base`, `2 base`, `4 base`, ... up to `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            failures: Mutex::default(),
        }
    }

    /// Records a failure of `key` and returns how long to wait before the next attempt.
    pub fn failed(&self, key: &str) -> Duration {
        let failures = match self.failures.lock() {
            Ok(mut map) => {
                let count = map.entry(key.to_owned()).or_default();
                *count = count.saturating_add(1);
                *count
            }
            Err(_) => 1,
        };
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(30));
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Forgets the failures of `key` (after a success or deletion).
    pub fn reset(&self, key: &str) {
        if let Ok(mut map) = self.failures.lock() {
            map.remove(key);
        }
    }

    /// Consecutive failures of `key`.
    pub fn failures(&self, key: &str) -> u32 {
        self.failures
            .lock()
            .ok()
            .and_then(|m| m.get(key).copied())
            .unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_ceiling_and_reset_on_success() {
        let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let delays: Vec<u64> = (0..6).map(|_| backoff.failed("ns/a").as_secs()).collect();
        assert_eq!(delays, [1, 2, 4, 8, 10, 10]);
        assert_eq!(
            backoff.failed("ns/b"),
            Duration::from_secs(1),
            "objects back off independently"
        );
        assert_eq!(backoff.failures("ns/a"), 6);
        backoff.reset("ns/a");
        assert_eq!(backoff.failures("ns/a"), 0);
        assert_eq!(backoff.failed("ns/a"), Duration::from_secs(1));
        // Many failures do not overflow.
        for _ in 0..100 {
            backoff.failed("ns/c");
        }
        assert_eq!(backoff.failed("ns/c"), Duration::from_secs(10));
    }
}
