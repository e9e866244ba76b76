//! The kinds' series: writes to either side, tenant objects refused, super events not copied up.
//!
//! Labels are fixed words the kinds write (resource, verb, event reason), never anything a tenant writes.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family},
    registry::Registry,
};

/// Labels of writes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct WriteLabels {
    /// Resource.
    pub resource: &'static str,
    /// `apply` or `delete` (super), or the tenant-side verb.
    pub verb: &'static str,
}

/// Labels of the refusal counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// Resource refused.
    pub resource: &'static str,
    /// Event reason the tenant saw: `PodPolicyViolation`, `ResourcesRequired`, `StorageClassNotPublished`,
    /// `ClaimRefused`, `IngressRefused`, `LoadBalancerClassRefused`, `TenantQuotaExceeded`, ...
    pub reason: &'static str,
}

/// The kinds' metrics.
#[derive(Debug, Default)]
pub struct ResourceMetrics {
    /// Writes to the super cluster.
    pub super_writes: Family<WriteLabels, Counter>,
    /// Writes to tenant apiservers.
    pub tenant_writes: Family<WriteLabels, Counter>,
    /// Tenant objects refused (not written to the super cluster) by resource and reason.
    pub refusals: Family<RefusalLabels, Counter>,
    /// Super events not copied up because their tenant had too many waiting.
    pub events_dropped: Counter,
}

impl ResourceMetrics {
    /// Registers the metrics in the syncer's (already prefixed) registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "super_writes",
            "Writes to the super cluster",
            self.super_writes.clone(),
        );
        registry.register(
            "tenant_writes",
            "Writes to tenant apiservers",
            self.tenant_writes.clone(),
        );
        registry.register(
            "refusals",
            "Tenant objects refused by resource and event reason (nothing written)",
            self.refusals.clone(),
        );
        registry.register(
            "events_dropped",
            "Super events not copied up because their tenant had too many waiting",
            self.events_dropped.clone(),
        );
    }

    /// Counts a write to the super cluster.
    pub fn super_write(&self, resource: &'static str, verb: &'static str) {
        self.super_writes
            .get_or_create(&WriteLabels { resource, verb })
            .inc();
    }

    /// Counts a tenant object the syncer refused to write.
    pub fn refused(&self, resource: &'static str, reason: &'static str) {
        self.refusals
            .get_or_create(&RefusalLabels { resource, reason })
            .inc();
    }

    /// Counts a write to a tenant.
    pub fn tenant_write(&self, resource: &'static str, verb: &'static str) {
        self.tenant_writes
            .get_or_create(&WriteLabels { resource, verb })
            .inc();
    }

    /// Writes to the super cluster so far, by resource and verb (non-zero only).
    pub fn super_write_counts(&self) -> Vec<(&'static str, &'static str, u64)> {
        const RESOURCES: [&str; 10] = [
            "namespace",
            "pod",
            "service",
            "endpoints",
            "configmap",
            "secret",
            "serviceaccount",
            "persistentvolumeclaim",
            "ingress",
            "networkpolicy",
        ];
        let mut counts = Vec::new();
        for resource in RESOURCES {
            for verb in [
                "apply",
                "create",
                "patch",
                "delete",
                "resize",
                "ephemeralcontainers",
            ] {
                if let Some(counter) = self.super_writes.get(&WriteLabels { resource, verb }) {
                    let count = counter.get();
                    if count > 0 {
                        counts.push((resource, verb, count));
                    }
                }
            }
        }
        counts
    }

    /// Total writes to the super cluster so far.
    pub fn super_writes_total(&self) -> u64 {
        self.super_write_counts().iter().map(|(_, _, n)| n).sum()
    }
}
