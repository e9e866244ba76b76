//! The quota ledger's series: what each tenant's super pods request and how many its quota holds back,
//! one set per attached tenant (label `tenant`), removed when the tenant is detached.

use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Registry,
};

use crate::accounting::usage::metrics::UsageLabels;

/// The ledger's metrics (clones share the series).
#[derive(Clone, Debug, Default)]
pub struct QuotaMetrics {
    /// Non-terminal super pods per tenant.
    pub tenant_pods: Family<UsageLabels, Gauge>,
    /// Sum of CPU requests of super pods per tenant, in millicores.
    pub tenant_cpu_requests_millicores: Family<UsageLabels, Gauge>,
    /// Sum of memory requests of super pods per tenant, in bytes.
    pub tenant_memory_requests_bytes: Family<UsageLabels, Gauge>,
    /// Pods held back by the tenant's quota.
    pub quota_waiting_pods: Family<UsageLabels, Gauge>,
}

impl QuotaMetrics {
    /// Registers the metrics in the syncer's (already prefixed) registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tenant_pods",
            "Non-terminal super pods per tenant",
            self.tenant_pods.clone(),
        );
        registry.register(
            "tenant_cpu_requests_millicores",
            "CPU requests of super pods per tenant",
            self.tenant_cpu_requests_millicores.clone(),
        );
        registry.register(
            "tenant_memory_requests_bytes",
            "Memory requests of super pods per tenant",
            self.tenant_memory_requests_bytes.clone(),
        );
        registry.register(
            "quota_waiting_pods",
            "Pods held back by the tenant's quota",
            self.quota_waiting_pods.clone(),
        );
    }

    /// Removes a tenant's series.
    pub fn forget(&self, labels: &UsageLabels) {
        self.tenant_pods.remove(labels);
        self.tenant_cpu_requests_millicores.remove(labels);
        self.tenant_memory_requests_bytes.remove(labels);
        self.quota_waiting_pods.remove(labels);
    }
}
