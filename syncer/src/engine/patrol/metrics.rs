//! The patrol's series: what it found, what it repaired, how long a scan took.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, histogram::Histogram},
    registry::Registry,
};

use crate::engine::metrics::duration_histogram;

/// Labels of patrol counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PatrolLabels {
    /// Resource.
    pub resource: &'static str,
    /// `missing`, `drifted`, `orphaned`, `stale-vnode`.
    pub finding: &'static str,
}

/// The patrol's metrics.
#[derive(Debug)]
pub struct PatrolMetrics {
    /// Patrol findings.
    pub patrol_findings: Family<PatrolLabels, Counter>,
    /// Patrol remedies queued or done.
    pub patrol_remedies: Family<PatrolLabels, Counter>,
    /// Patrol scan duration.
    pub patrol_duration: Histogram,
}

impl Default for PatrolMetrics {
    fn default() -> Self {
        Self {
            patrol_findings: Family::default(),
            patrol_remedies: Family::default(),
            patrol_duration: duration_histogram(),
        }
    }
}

impl PatrolMetrics {
    /// Registers the metrics in the syncer's (already prefixed) registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "patrol_findings",
            "Differences the patrol found",
            self.patrol_findings.clone(),
        );
        registry.register(
            "patrol_remedies",
            "Repairs the patrol queued",
            self.patrol_remedies.clone(),
        );
        registry.register(
            "patrol_duration_seconds",
            "Duration of a patrol scan",
            self.patrol_duration.clone(),
        );
    }
}
