//! Per-key exponential backoff after failures, for the retries of vc-manager's reconciles and the syncer's
//! work items (kube-runtime's controller has none). Failures are never terminal: the delay doubles up to a
//! ceiling and a success resets it.

use std::{borrow::Borrow, collections::HashMap, hash::Hash, sync::Mutex, time::Duration};

/// Consecutive failures per key and the delays they lead to.
#[derive(Debug)]
pub struct Backoff<K> {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Eq + Hash> Backoff<K> {
    /// Delays `base`, `2 base`, `4 base`, ... up to `max` (at least `base`).
    pub fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max: max.max(base),
            failures: Mutex::default(),
        }
    }

    /// Records a failure of `key` and returns how long to wait before the next attempt.
    pub fn failed<Q>(&self, key: &Q) -> Duration
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ToOwned<Owned = K> + ?Sized,
    {
        let failures = {
            let mut map = self.lock();
            let count = match map.get_mut(key) {
                Some(count) => count,
                None => map.entry(key.to_owned()).or_default(),
            };
            *count = count.saturating_add(1);
            *count
        };
        // Past 2^30 the product saturates anyway; the cap keeps the power from overflowing.
        let factor = 2u32.saturating_pow(failures.saturating_sub(1).min(30));
        self.base.saturating_mul(factor).min(self.max)
    }

    /// Forgets the failures of `key` (after a success or deletion).
    pub fn reset<Q>(&self, key: &Q)
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.lock().remove(key);
    }

    /// Consecutive failures of `key`.
    pub fn failures<Q>(&self, key: &Q) -> u32
    where
        K: Borrow<Q>,
        Q: Eq + Hash + ?Sized,
    {
        self.lock().get(key).copied().unwrap_or(0)
    }

    // A panic while holding the lock leaves the counts consistent (each update is one statement).
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<K, u32>> {
        self.failures
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_ceiling_and_reset_on_success() {
        let backoff: Backoff<String> = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
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

    #[test]
    fn sub_second_delays_reach_the_ceiling_and_keys_can_be_compound() {
        let backoff: Backoff<(String, u8)> =
            Backoff::new(Duration::from_millis(200), Duration::from_secs(120));
        let key = ("tenant".to_owned(), 1);
        let delays: Vec<u128> = (0..12).map(|_| backoff.failed(&key).as_millis()).collect();
        assert_eq!(
            delays,
            [
                200, 400, 800, 1_600, 3_200, 6_400, 12_800, 25_600, 51_200, 102_400, 120_000, 120_000
            ]
        );
        assert_eq!(backoff.failures(&("tenant".to_owned(), 2)), 0);
        backoff.reset(&key);
        assert_eq!(backoff.failed(&key), Duration::from_millis(200));
    }

    #[test]
    fn a_ceiling_below_the_base_is_the_base() {
        let backoff: Backoff<String> = Backoff::new(Duration::from_secs(5), Duration::from_secs(1));
        assert_eq!(backoff.failed("a"), Duration::from_secs(5));
        assert_eq!(backoff.failed("a"), Duration::from_secs(5));
    }
}
