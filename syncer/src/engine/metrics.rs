//! The engine's series: reconciles the workers ran, the fair queues' depth and wait, and the write gate's
//! slots ([`crate::engine::write_gate::GateMetrics`]).
//!
//! Labels are fixed words (resource, direction, operation, result) plus the tenant, `namespace/name` of a
//! VirtualCluster: its queue series are removed when the tenant is detached ([`EngineMetrics::forget_tenant`]).

use prometheus_client::{
    encoding::{EncodeLabelSet, EncodeLabelValue},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

use crate::engine::write_gate::GateMetrics;

/// Which way an object flows.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Direction {
    /// Tenant to super.
    Down,
    /// Super to tenant.
    Up,
}

/// What a reconcile did.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Operation {
    /// Created an object.
    Create,
    /// Updated an object.
    Update,
    /// Deleted an object.
    Delete,
    /// Found everything in sync.
    None,
    /// Held back (quota, policy, waiting for a dependency).
    Wait,
}

/// Labels of reconcile counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    /// Resource, e.g. `pod`.
    pub resource: &'static str,
    /// Direction.
    pub direction: Direction,
    /// What was done.
    pub operation: Operation,
    /// `success` or an error category.
    pub result: &'static str,
}

/// Labels of per-resource histograms.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResourceLabels {
    /// Resource.
    pub resource: &'static str,
    /// Direction.
    pub direction: Direction,
}

/// Labels of per-tenant queue series.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    /// `namespace/name` of the VirtualCluster.
    pub tenant: String,
    /// Direction of the queue.
    pub direction: Direction,
}

/// The syncer's duration buckets: 1 ms to about 2 min.
pub fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.001, 2.0, 18))
}

/// The workers', queues' and write gate's metrics.
#[derive(Debug)]
pub struct EngineMetrics {
    /// Reconciles by resource, direction, operation and result.
    pub operations: Family<OperationLabels, Counter>,
    /// Reconcile duration.
    pub operation_duration: Family<ResourceLabels, Histogram>,
    /// Items waiting per tenant and direction.
    pub queue_depth: Family<TenantLabels, Gauge>,
    /// Time items waited in the queue.
    pub queue_wait: Family<TenantLabels, Histogram>,
    /// The bound on in-flight super writes ([`crate::engine::write_gate`]).
    pub write_slots: GateMetrics,
}

impl Default for EngineMetrics {
    fn default() -> Self {
        Self {
            operations: Family::default(),
            operation_duration: Family::new_with_constructor(duration_histogram),
            queue_depth: Family::default(),
            queue_wait: Family::new_with_constructor(duration_histogram),
            write_slots: GateMetrics::default(),
        }
    }
}

impl EngineMetrics {
    /// Registers the metrics in the syncer's (already prefixed) registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "operations",
            "Reconciles by resource, direction, operation and result",
            self.operations.clone(),
        );
        registry.register(
            "operation_duration_seconds",
            "Reconcile duration by resource and direction",
            self.operation_duration.clone(),
        );
        registry.register(
            "queue_depth",
            "Items waiting per tenant and direction",
            self.queue_depth.clone(),
        );
        registry.register(
            "queue_wait_seconds",
            "Time items waited in the queue",
            self.queue_wait.clone(),
        );
        self.write_slots.register(registry);
    }

    /// Removes a detached tenant's queue series.
    pub fn forget_tenant(&self, tenant: &str) {
        for direction in [Direction::Down, Direction::Up] {
            let labels = TenantLabels {
                tenant: tenant.to_owned(),
                direction,
            };
            self.queue_depth.remove(&labels);
            self.queue_wait.remove(&labels);
        }
    }
}
