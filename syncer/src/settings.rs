//! Per-tenant settings, taken from the VirtualCluster's spec.

use crds::{PodPolicy, TenantQuota, VirtualCluster};

/// What the syncer needs to know about a VirtualCluster beyond its identity.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TenantSettings {
    /// DNS domain of the tenant.
    pub cluster_domain: String,
    /// Share of the work queues.
    pub weight: u32,
    /// `(qps, burst)` on writes to the super cluster.
    pub rate_limit: Option<(u32, u32)>,
    /// Aggregate limits on super pods.
    pub quota: Option<TenantQuota>,
    /// RuntimeClass forced onto pods.
    pub runtime_class_name: Option<String>,
    /// Host access allowed to pods.
    pub pod_policy: PodPolicy,
    /// Label/annotation prefixes owned by the super cluster.
    pub opaque_prefixes: Vec<String>,
    /// Label/annotation prefixes copied up from super objects.
    pub transparent_prefixes: Vec<String>,
}

impl TenantSettings {
    /// The settings of a VirtualCluster.
    pub fn of(vc: &VirtualCluster) -> Self {
        let spec = &vc.spec;
        Self {
            cluster_domain: spec.cluster_domain.clone(),
            weight: spec.weight,
            rate_limit: spec.rate_limit.as_ref().map(|r| (r.qps, r.effective_burst())),
            quota: spec.quota.clone(),
            runtime_class_name: spec.runtime_class_name.clone(),
            pod_policy: spec.pod_policy.clone().unwrap_or_default(),
            opaque_prefixes: spec.opaque_meta_prefixes.clone(),
            transparent_prefixes: spec.transparent_meta_prefixes.clone(),
        }
    }
}
