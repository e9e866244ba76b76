//! Fairness between tenants: a token bucket of queries per tenant, and a bound on each tenant's (and
//! everyone's) queries in flight to the upstream resolvers.
//!
//! A tenant over its rate gets REFUSED at once (as CoreDNS's rate limiting answers), costing the server a
//! hash lookup; its queries never wait in a queue that other tenants' queries would wait in. A tenant whose
//! upstream queries are all in flight gets SERVFAIL for the next one instead of a queue slot, so a tenant
//! asking slow names cannot hold every upstream connection.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
    time::Instant,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::index::Key;

/// A token bucket.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Per-tenant query rate and upstream concurrency.
#[derive(Debug)]
pub struct Limits {
    qps: f64,
    burst: f64,
    tenant_upstream: usize,
    buckets: Mutex<HashMap<Key, Bucket>>,
    upstream: Mutex<HashMap<Key, Arc<Semaphore>>>,
    all_upstream: Arc<Semaphore>,
}

/// What the limits say of an upstream query.
#[derive(Debug)]
pub enum UpstreamSlot {
    /// Go ahead; the permits free the slots when dropped.
    Granted(OwnedSemaphorePermit, OwnedSemaphorePermit),
    /// The tenant has as many queries in flight as it may.
    TenantBusy,
    /// Every upstream slot is taken.
    AllBusy,
}

impl Limits {
    /// `qps` and `burst` per tenant (0 `qps`: unlimited); `tenant_upstream` and `all_upstream` queries in
    /// flight upstream.
    pub fn new(qps: u32, burst: u32, tenant_upstream: usize, all_upstream: usize) -> Self {
        Self {
            qps: f64::from(qps),
            burst: f64::from(burst.max(qps).max(1)),
            tenant_upstream: tenant_upstream.max(1),
            buckets: Mutex::new(HashMap::new()),
            upstream: Mutex::new(HashMap::new()),
            all_upstream: Arc::new(Semaphore::new(all_upstream.max(1))),
        }
    }

    /// Takes a token of `tenant`'s bucket at `now`; `false` when it is empty.
    pub fn admit(&self, tenant: &Key, now: Instant) -> bool {
        if self.qps <= 0.0 {
            return true;
        }
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let bucket = buckets.entry(tenant.clone()).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let elapsed = now.saturating_duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.qps).min(self.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            true
        } else {
            false
        }
    }

    /// A slot for one upstream query of `tenant`, or why there is none.
    pub fn upstream(&self, tenant: &Key) -> UpstreamSlot {
        let semaphore = {
            let mut upstream = self.upstream.lock().unwrap_or_else(|e| e.into_inner());
            upstream
                .entry(tenant.clone())
                .or_insert_with(|| Arc::new(Semaphore::new(self.tenant_upstream)))
                .clone()
        };
        let Ok(own) = semaphore.try_acquire_owned() else {
            return UpstreamSlot::TenantBusy;
        };
        match self.all_upstream.clone().try_acquire_owned() {
            Ok(all) => UpstreamSlot::Granted(own, all),
            Err(_) => UpstreamSlot::AllBusy,
        }
    }

    /// Forgets tenants that are gone (their buckets and idle upstream slots).
    pub fn retain(&self, live: impl Fn(&str) -> bool) {
        self.buckets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, _| live(k));
        self.upstream
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|k, s| live(k) || s.available_permits() < self.tenant_upstream);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_tenant_over_its_rate_does_not_take_another_tenants_tokens() {
        let limits = Limits::new(10, 20, 2, 3);
        let (a, b): (Key, Key) = ("a".into(), "b".into());
        let start = Instant::now();
        let admitted = (0..100).filter(|_| limits.admit(&a, start)).count();
        assert_eq!(admitted, 20, "the burst");
        assert!(limits.admit(&b, start), "another tenant has its own bucket");
        assert!(!limits.admit(&a, start + Duration::from_millis(50)));
        // Ten per second refill.
        let later = start + Duration::from_millis(1000);
        let refilled = (0..100).filter(|_| limits.admit(&a, later)).count();
        assert_eq!(refilled, 10);
        assert!(Limits::new(0, 0, 1, 1).admit(&a, start), "0 qps: unlimited");
    }

    #[test]
    fn upstream_slots_are_bounded_per_tenant_and_overall() {
        let limits = Limits::new(0, 0, 2, 3);
        let (a, b): (Key, Key) = ("a".into(), "b".into());
        let first = limits.upstream(&a);
        let second = limits.upstream(&a);
        assert!(matches!(first, UpstreamSlot::Granted(..)));
        assert!(matches!(second, UpstreamSlot::Granted(..)));
        assert!(matches!(limits.upstream(&a), UpstreamSlot::TenantBusy));
        let third = limits.upstream(&b);
        assert!(matches!(third, UpstreamSlot::Granted(..)));
        assert!(matches!(limits.upstream(&b), UpstreamSlot::AllBusy));
        drop(first);
        assert!(matches!(limits.upstream(&b), UpstreamSlot::Granted(..)));
        limits.retain(|_| false);
        drop((second, third));
    }
}
