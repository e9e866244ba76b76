//! The tenants' series: how many are in each state, how long attaching one takes, what the platform's
//! limits changed in their specs, and the attach journal's writes and counted stops.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

use crate::engine::metrics::duration_histogram;

/// Labels of the tenant-state gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StateLabels {
    /// `attached`, `unreachable`, `over_limit` (detached for its cache limits), `paused` (`spec.paused`),
    /// `held_back` (a syncer process stopped while attaching it, [`crate::tenancy::journal`]) or `waiting`.
    pub state: &'static str,
}

/// The tenants' metrics.
#[derive(Debug)]
pub struct TenancyMetrics {
    /// Tenants by state.
    pub tenants: Family<StateLabels, Gauge>,
    /// Time from a tenant's attach until every cache of it has listed (its work waits until then).
    pub tenant_list_duration: Histogram,
    /// Fields of VirtualClusters' specs the platform's limits changed (counted when the limits newly apply
    /// or apply otherwise).
    pub spec_limited: Counter,
    /// Writes of this replica's attach journal ([`crate::tenancy::journal`]).
    pub journal_writes: Counter,
    /// Syncer stops counted against tenants (one per tenant a stopped process was attaching).
    pub attach_stops: Counter,
}

impl Default for TenancyMetrics {
    fn default() -> Self {
        Self {
            tenants: Family::default(),
            tenant_list_duration: duration_histogram(),
            spec_limited: Counter::default(),
            journal_writes: Counter::default(),
            attach_stops: Counter::default(),
        }
    }
}

impl TenancyMetrics {
    /// Registers the metrics in the syncer's (already prefixed) registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tenant_list_duration_seconds",
            "Time from a tenant's attach until every cache of it has listed",
            self.tenant_list_duration.clone(),
        );
        registry.register(
            "spec_limited_fields",
            "Fields of VirtualCluster specs the platform's limits changed (weight, quota, rate limit, ingress hosts, runtime class)",
            self.spec_limited.clone(),
        );
        registry.register("tenants", "Tenants by state", self.tenants.clone());
        registry.register(
            "attach_journal_writes",
            "Writes of this replica's attach journal (a few per attach wave, none in steady state)",
            self.journal_writes.clone(),
        );
        registry.register(
            "attach_stops",
            "Syncer processes' unclean stops counted against tenants they were attaching",
            self.attach_stops.clone(),
        );
    }
}
