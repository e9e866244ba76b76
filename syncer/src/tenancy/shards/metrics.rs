//! The shards' series: what this replica holds and sees, and its Leases' handovers.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge},
    registry::Registry,
};

/// Labels of tenant handovers between sharded replicas.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct HandoverLabels {
    /// `acquired` (a free or new Lease), `taken_over` (its holder's membership had expired), `released`
    /// (handed to the replica that should own it), `lost` (membership lapsed, or another replica holds it).
    pub reason: &'static str,
}

/// The shards' metrics (set by sharded replicas only).
#[derive(Debug, Default)]
pub struct ShardMetrics {
    /// Tenants this replica holds the Lease of.
    pub shard_owned_tenants: Gauge,
    /// Live replicas this replica sees, itself included.
    pub shard_members: Gauge,
    /// 1 while this replica runs the cluster-wide duties.
    pub shard_duties: Gauge,
    /// Tenant Leases this replica acquired, took over, released or lost.
    pub shard_handovers: Family<HandoverLabels, Counter>,
}

impl ShardMetrics {
    /// Registers the metrics in the syncer's (already prefixed) registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "shard_owned_tenants",
            "Tenants this replica holds the Lease of (sharded replicas)",
            self.shard_owned_tenants.clone(),
        );
        registry.register(
            "shard_members",
            "Live syncer replicas this replica sees, itself included (sharded replicas)",
            self.shard_members.clone(),
        );
        registry.register(
            "shard_duties",
            "1 while this replica runs the cluster-wide duties (sharded replicas)",
            self.shard_duties.clone(),
        );
        registry.register(
            "shard_handovers",
            "Tenant Leases acquired, taken over, released or lost, by reason",
            self.shard_handovers.clone(),
        );
    }
}
