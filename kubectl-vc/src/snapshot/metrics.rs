//! The snapshot scheduler's metrics (`kubectl vc snapshot schedule --admin-address`), all under
//! `vc_snapshots_`: snapshots taken and failed by what asked for them, how long they took, when the last one
//! succeeded, and how many tenants are scheduled and overdue. No label names a tenant: which tenant failed is
//! in its `status.snapshots`, its Events and the scheduler's log.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// The prefix of every series.
pub const PREFIX: &str = "vc_snapshots";

/// What asked for a snapshot.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TriggerLabels {
    /// `scheduled` (the tenant's interval passed) or `requested` (`snapshot create --to <store>`).
    pub trigger: &'static str,
}

/// The metrics. Cheap to clone; every clone updates the same series.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Snapshots written into the store.
    pub taken: Family<TriggerLabels, Counter>,
    /// Snapshots that failed (or took longer than `--snapshot-timeout`).
    pub failed: Family<TriggerLabels, Counter>,
    /// Seconds one snapshot took, successful or not.
    pub duration: Histogram,
    /// Unix time of the last successful snapshot of any tenant (0: none since the start).
    pub last_success: Gauge,
    /// VirtualClusters with `spec.snapshots` at the last poll.
    pub scheduled_tenants: Gauge,
    /// Of those that could be snapshotted (running, native, not paused): how many have no snapshot newer
    /// than twice their interval (or none at all after a failure).
    pub overdue_tenants: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            taken: Family::default(),
            failed: Family::default(),
            // 1 s to about 68 min: a small tenant takes seconds, a large etcd minutes.
            duration: Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                1.0, 2.0, 13,
            )),
            last_success: Gauge::default(),
            scheduled_tenants: Gauge::default(),
            overdue_tenants: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Registers every series under [`PREFIX`] in `registry`.
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix(PREFIX);
        registry.register(
            "taken",
            "Snapshots written into the store, by what asked for them",
            self.taken.clone(),
        );
        registry.register(
            "failed",
            "Snapshots that failed or timed out, by what asked for them",
            self.failed.clone(),
        );
        registry.register(
            "duration_seconds",
            "Time one snapshot took, successful or not",
            self.duration.clone(),
        );
        registry.register(
            "last_success_timestamp_seconds",
            "Unix time of the last successful snapshot (0: none since the scheduler started)",
            self.last_success.clone(),
        );
        registry.register(
            "scheduled_tenants",
            "VirtualClusters with spec.snapshots at the last poll",
            self.scheduled_tenants.clone(),
        );
        registry.register(
            "overdue_tenants",
            "Snapshotted VirtualClusters whose newest snapshot is older than twice their interval",
            self.overdue_tenants.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_is_exported_under_the_prefix() {
        let metrics = Metrics::default();
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        metrics
            .taken
            .get_or_create(&TriggerLabels { trigger: "scheduled" })
            .inc();
        metrics
            .failed
            .get_or_create(&TriggerLabels { trigger: "requested" })
            .inc();
        metrics.duration.observe(3.0);
        metrics.last_success.set(1_764_000_000);
        metrics.scheduled_tenants.set(2);
        metrics.overdue_tenants.set(1);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        for line in [
            "vc_snapshots_taken_total{trigger=\"scheduled\"} 1",
            "vc_snapshots_failed_total{trigger=\"requested\"} 1",
            "vc_snapshots_duration_seconds_count 1",
            "vc_snapshots_last_success_timestamp_seconds 1764000000",
            "vc_snapshots_scheduled_tenants 2",
            "vc_snapshots_overdue_tenants 1",
        ] {
            assert!(text.contains(line), "{line} missing from\n{text}");
        }
    }
}
