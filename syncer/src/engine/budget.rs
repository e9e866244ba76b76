//! Per-tenant limits on what the syncer caches: one tenant cannot fill the shared syncer's memory.
//!
//! Every cache of a tenant charges the tenant's [`CacheBudget`] with each object it holds (its size is
//! the length of its JSON after trimming, close to what it takes in memory). An object that would take the
//! tenant past its limit is not cached, the tenant's work is held (its caches are no longer complete, and
//! an object missing from them must not read as deleted), and the supervisor detaches the tenant with
//! `TenantLimitExceeded`. Nothing of the tenant is deleted in the super cluster; it is attached again, with
//! the usual backoff, and stays attached once it fits.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use kube::{Resource, runtime::watcher};
use serde::Serialize;

use crate::engine::items::ObjectKey;

/// Reason of the `TenantSynced` condition of a tenant over its cache limits.
pub const REASON_LIMIT_EXCEEDED: &str = "TenantLimitExceeded";

/// How much of a tenant the syncer caches at most: its flags, and what attach gives each tenant's budget.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::Args)]
pub struct CacheLimits {
    /// Most objects the syncer caches of one tenant (over every kind); a tenant with more is detached with
    /// `TenantLimitExceeded` until it fits.
    #[arg(
        id = "tenant_cache_max_objects",
        long = "tenant-cache-max-objects",
        env = "TENANT_CACHE_MAX_OBJECTS",
        default_value_t = CacheLimits::default().max_objects,
        value_parser = crate::engine::config::values::at_least_one
    )]
    pub max_objects: u64,
    /// Most bytes (objects' JSON length) the syncer caches of one tenant; a tenant with more is detached
    /// with `TenantLimitExceeded` until it fits.
    #[arg(
        id = "tenant_cache_max_bytes",
        long = "tenant-cache-max-bytes",
        env = "TENANT_CACHE_MAX_BYTES",
        default_value_t = CacheLimits::default().max_bytes,
        value_parser = crate::engine::config::values::at_least_one
    )]
    pub max_bytes: u64,
}

impl Default for CacheLimits {
    fn default() -> Self {
        Self {
            max_objects: 50_000,
            max_bytes: 128 * 1024 * 1024,
        }
    }
}

#[derive(Default)]
struct Usage {
    objects: u64,
    bytes: u64,
    /// The first refusal: which object did not fit, and which limit.
    exceeded: Option<String>,
}

/// One tenant's cache usage against its limits, shared by all of its caches.
pub struct CacheBudget {
    limits: CacheLimits,
    tenant: String,
    usage: Mutex<Usage>,
    exceeded: tokio::sync::Notify,
}

impl CacheBudget {
    /// An empty budget for the tenant `tenant` (`namespace/name` of its VirtualCluster, for messages).
    pub fn new(tenant: String, limits: CacheLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            tenant,
            usage: Mutex::default(),
            exceeded: tokio::sync::Notify::new(),
        })
    }

    fn usage(&self) -> std::sync::MutexGuard<'_, Usage> {
        self.usage.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What did not fit, once something did not.
    pub fn exceeded(&self) -> Option<String> {
        self.usage().exceeded.clone()
    }

    /// Objects and bytes charged now.
    pub fn used(&self) -> (u64, u64) {
        let usage = self.usage();
        (usage.objects, usage.bytes)
    }

    /// Resolves once something did not fit (at once if something already did not).
    pub async fn wait_exceeded(&self) {
        loop {
            let notified = self.exceeded.notified();
            if self.exceeded().is_some() {
                return;
            }
            notified.await;
        }
    }

    /// Charges `bytes` for an object that took `old` before (if it was cached); refuses when the tenant
    /// would go over a limit, and remembers `what` did not fit.
    fn charge(&self, old: Option<u64>, bytes: u64, what: impl FnOnce() -> String) -> bool {
        let mut usage = self.usage();
        let objects = usage.objects + u64::from(old.is_none());
        let total = usage.bytes - old.unwrap_or(0) + bytes;
        if objects <= self.limits.max_objects && total <= self.limits.max_bytes {
            usage.objects = objects;
            usage.bytes = total;
            return true;
        }
        if usage.exceeded.is_none() {
            let message = format!(
                "the tenant has more than the syncer caches for one tenant: {} did not fit ({objects} objects of at most {}, {total} bytes of at most {}; the platform sets these with --tenant-cache-max-objects and --tenant-cache-max-bytes). Nothing is synced until the tenant fits again; nothing it has in the super cluster is deleted. Delete objects in the tenant (large ConfigMaps and Secrets first); the syncer tries again with a growing delay",
                what(),
                self.limits.max_objects,
                self.limits.max_bytes
            );
            tracing::warn!(tenant = %self.tenant, objects, bytes = total, max_objects = self.limits.max_objects, max_bytes = self.limits.max_bytes, "tenant over its cache limits; holding its work");
            usage.exceeded = Some(message);
            self.exceeded.notify_waiters();
        }
        false
    }

    fn release(&self, bytes: u64, objects: u64) {
        let mut usage = self.usage();
        usage.objects = usage.objects.saturating_sub(objects);
        usage.bytes = usage.bytes.saturating_sub(bytes);
    }

    /// A ledger for one cache of kind `kind`, charging this budget.
    pub fn ledger<K>(self: &Arc<Self>, kind: &'static str) -> Ledger<K> {
        Ledger {
            budget: self.clone(),
            kind,
            sizes: HashMap::new(),
            _kind: std::marker::PhantomData,
        }
    }
}

/// Counts the bytes written through it.
struct Counter(u64);

impl std::io::Write for Counter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0 += buf.len() as u64;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The size an object is charged: the length of its JSON.
pub fn size_of<K: Serialize>(object: &K) -> u64 {
    let mut counter = Counter(0);
    // Kubernetes objects always serialize; a failure would charge nothing but the object itself.
    let _ = serde_json::to_writer(&mut counter, object);
    counter.0.max(1)
}

/// An object's key in a ledger, read from its metadata without copying its name first (once per watch event).
fn key_of<K: Resource>(object: &K) -> ObjectKey {
    let meta = object.meta();
    ObjectKey::new(
        meta.namespace.as_deref().unwrap_or(""),
        meta.name.as_deref().unwrap_or(""),
    )
}

/// What one cache holds, by namespace and name, and the size it was charged for each.
pub struct Ledger<K> {
    budget: Arc<CacheBudget>,
    kind: &'static str,
    sizes: HashMap<ObjectKey, u64>,
    _kind: std::marker::PhantomData<fn(K)>,
}

impl<K: Resource + Serialize> Ledger<K> {
    /// Whether the cache may take this watch event. A listing anew releases what the cache held (the list
    /// replaces it); an object that does not fit is refused.
    pub fn admit(&mut self, event: &watcher::Event<K>) -> bool {
        match event {
            watcher::Event::Init => {
                let bytes = self.sizes.values().sum();
                self.budget.release(bytes, self.sizes.len() as u64);
                self.sizes.clear();
                true
            }
            watcher::Event::InitDone => true,
            watcher::Event::Apply(object) | watcher::Event::InitApply(object) => {
                let key = key_of(object);
                let size = size_of(object);
                let old = self.sizes.get(&key).copied();
                let kind = self.kind;
                let admitted = self.budget.charge(old, size, || match key.parts() {
                    ("", name) => format!("{kind} {name} ({size} bytes)"),
                    (namespace, name) => format!("{kind} {namespace}/{name} ({size} bytes)"),
                });
                if admitted {
                    self.sizes.insert(key, size);
                }
                admitted
            }
            watcher::Event::Delete(object) => {
                let key = key_of(object);
                if let Some(size) = self.sizes.remove(&key) {
                    self.budget.release(size, 1);
                }
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ConfigMap;

    use super::*;

    fn config_map(name: &str, bytes: usize) -> ConfigMap {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "flood"},
            "data": {"blob": "x".repeat(bytes)}
        }))
        .expect("config map")
    }

    #[test]
    fn objects_past_the_byte_limit_are_refused_and_named() {
        let budget = CacheBudget::new(
            "team/vc".into(),
            CacheLimits {
                max_objects: 100,
                max_bytes: 3_000,
            },
        );
        let mut ledger = budget.ledger::<ConfigMap>("configmap");
        assert!(ledger.admit(&watcher::Event::Apply(config_map("a", 1_000))));
        assert!(ledger.admit(&watcher::Event::Apply(config_map("b", 1_000))));
        assert!(budget.exceeded().is_none());
        assert!(!ledger.admit(&watcher::Event::Apply(config_map("c", 1_000))));
        let message = budget.exceeded().expect("exceeded");
        assert!(message.contains("configmap flood/c"), "{message}");
        assert_eq!(budget.used().0, 2, "the refused object is not charged");

        // Deleting one makes room; changing one to a larger size is charged the difference.
        assert!(ledger.admit(&watcher::Event::Delete(config_map("b", 1_000))));
        assert!(ledger.admit(&watcher::Event::Apply(config_map("a", 1_900))));
        assert!(!ledger.admit(&watcher::Event::Apply(config_map("a", 3_000))));
    }

    #[test]
    fn the_object_limit_counts_every_cache_of_the_tenant_and_a_relist_starts_over() {
        let budget = CacheBudget::new(
            "team/vc".into(),
            CacheLimits {
                max_objects: 2,
                max_bytes: u64::MAX,
            },
        );
        let mut first = budget.ledger::<ConfigMap>("configmap");
        let mut second = budget.ledger::<ConfigMap>("configmap");
        assert!(first.admit(&watcher::Event::InitApply(config_map("a", 1))));
        assert!(second.admit(&watcher::Event::Apply(config_map("b", 1))));
        // The same object again is no new object.
        assert!(first.admit(&watcher::Event::Apply(config_map("a", 2))));
        assert!(!second.admit(&watcher::Event::Apply(config_map("c", 1))));
        // A relist releases the cache's earlier list before the new one is charged.
        let budget = CacheBudget::new(
            "team/vc".into(),
            CacheLimits {
                max_objects: 2,
                max_bytes: u64::MAX,
            },
        );
        let mut ledger = budget.ledger::<ConfigMap>("configmap");
        for _ in 0..3 {
            assert!(ledger.admit(&watcher::Event::Init));
            assert!(ledger.admit(&watcher::Event::InitApply(config_map("a", 1))));
            assert!(ledger.admit(&watcher::Event::InitApply(config_map("b", 1))));
            assert!(ledger.admit(&watcher::Event::InitDone));
        }
        assert_eq!(budget.used().0, 2);
        assert!(budget.exceeded().is_none());
    }
}
