//! The usage series: one set per attached tenant (label `tenant`, `namespace/name` of the VirtualCluster,
//! never anything a tenant writes), removed when the tenant is detached.

use std::sync::atomic::AtomicU64;

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// Labels of per-tenant usage gauges (here and the syncer's request and quota gauges).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UsageLabels {
    /// `namespace/name` of the VirtualCluster.
    pub tenant: String,
}

/// Labels of the failure counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabels {
    /// `node` (a stats summary) or `apiserver` (a tenant apiserver's `/metrics`).
    pub source: &'static str,
}

/// Every usage metric.
#[derive(Debug)]
pub struct UsageMetrics {
    /// CPU the tenant's pods use, in cores.
    pub cpu_cores: Family<UsageLabels, Gauge<f64, AtomicU64>>,
    /// Working-set memory of the tenant's pods, in bytes.
    pub memory_bytes: Family<UsageLabels, Gauge>,
    /// Pods whose CPU and memory the kubelets reported.
    pub measured_pods: Family<UsageLabels, Gauge>,
    /// Claims (Pending or Bound).
    pub claims: Family<UsageLabels, Gauge>,
    /// Storage requested by those claims, in bytes.
    pub storage_bytes: Family<UsageLabels, Gauge>,
    /// LoadBalancer Services.
    pub load_balancers: Family<UsageLabels, Gauge>,
    /// Node ports allocated.
    pub node_ports: Family<UsageLabels, Gauge>,
    /// Requests the tenant apiserver served, as observed between readings.
    pub apiserver_requests: Family<UsageLabels, Counter<f64, AtomicU64>>,
    /// Reads that failed, by source.
    pub failures: Family<SourceLabels, Counter>,
    /// Duration of one measurement of every tenant.
    pub duration: Histogram,
}

impl Default for UsageMetrics {
    fn default() -> Self {
        Self {
            cpu_cores: Family::default(),
            memory_bytes: Family::default(),
            measured_pods: Family::default(),
            claims: Family::default(),
            storage_bytes: Family::default(),
            load_balancers: Family::default(),
            node_ports: Family::default(),
            apiserver_requests: Family::default(),
            failures: Family::default(),
            duration: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
        }
    }
}

impl UsageMetrics {
    /// Registers the metrics in the syncer's (already prefixed) registry.
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "tenant_cpu_usage_cores",
            "CPU the tenant's super pods use (kubelet summaries, usageNanoCores), in cores",
            self.cpu_cores.clone(),
        );
        registry.register(
            "tenant_memory_working_set_bytes",
            "Working-set memory of the tenant's super pods (kubelet summaries), in bytes",
            self.memory_bytes.clone(),
        );
        registry.register(
            "tenant_measured_pods",
            "Tenant pods whose CPU and memory the kubelets reported",
            self.measured_pods.clone(),
        );
        registry.register(
            "tenant_persistentvolumeclaims",
            "The tenant's Pending or Bound claims in the super cluster",
            self.claims.clone(),
        );
        registry.register(
            "tenant_storage_requests_bytes",
            "Storage the tenant's Pending or Bound claims request, in bytes",
            self.storage_bytes.clone(),
        );
        registry.register(
            "tenant_load_balancers",
            "The tenant's Services of type LoadBalancer",
            self.load_balancers.clone(),
        );
        registry.register(
            "tenant_node_ports",
            "Node ports allocated to the tenant's Services",
            self.node_ports.clone(),
        );
        registry.register(
            "tenant_apiserver_requests",
            "Requests the tenant apiserver served (apiserver_request_total, read every interval; native tenants)",
            self.apiserver_requests.clone(),
        );
        registry.register(
            "usage_read_failures",
            "Stats summaries and tenant apiserver metrics that could not be read",
            self.failures.clone(),
        );
        registry.register(
            "usage_measure_duration_seconds",
            "Duration of one usage measurement of every tenant",
            self.duration.clone(),
        );
    }

    /// Removes a tenant's series.
    pub fn forget(&self, labels: &UsageLabels) {
        self.cpu_cores.remove(labels);
        self.memory_bytes.remove(labels);
        self.measured_pods.remove(labels);
        self.claims.remove(labels);
        self.storage_bytes.remove(labels);
        self.load_balancers.remove(labels);
        self.node_ports.remove(labels);
        self.apiserver_requests.remove(labels);
    }
}
