//! vc-dns's metrics: queries by tenant and response code, answer latency, refusals, and the size of the
//! index.

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::Registry,
};

/// Tenant label of queries from an address no tenant pod has.
pub const UNKNOWN_TENANT: &str = "unknown";

/// Labels of a query.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct QueryLabels {
    /// Cluster key, or `unknown`.
    pub tenant: String,
    /// Response code (`NOERROR`, `NXDOMAIN`, `REFUSED`, `SERVFAIL`, ...).
    pub rcode: String,
}

/// Labels of a tenant-level event.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabels {
    /// Cluster key.
    pub tenant: String,
}

/// Labels of the latency histogram.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LatencyLabels {
    /// `local` (answered from the index, refused) or `upstream` (forwarded).
    pub source: &'static str,
}

/// Labels of a query from an address the index did not know when it arrived.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct UnknownSourceLabels {
    /// `learned` (the pod watch delivered the address while the query waited), `unknown` (still unknown
    /// after the wait: refused), `busy` (every waiting slot taken: refused at once) or `range_busy` (the
    /// source's range holds its share of the slots: refused at once).
    pub outcome: &'static str,
}

/// The metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Queries answered, by tenant and response code.
    pub queries: Family<QueryLabels, Counter>,
    /// Time from receiving a query to handing its answer to the socket.
    pub latency: Family<LatencyLabels, Histogram>,
    /// Queries refused because the tenant was over its rate.
    pub rate_limited: Family<TenantLabels, Counter>,
    /// Upstream queries refused (SERVFAIL) because the tenant, or everyone, had too many in flight.
    pub upstream_busy: Family<TenantLabels, Counter>,
    /// Queries from addresses the index did not know when they arrived, by what became of them.
    pub unknown_sources: Family<UnknownSourceLabels, Counter>,
    /// Objects in the index.
    pub records: Gauge,
    /// Tenants with a cluster domain.
    pub tenants: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            queries: Family::default(),
            latency: Family::new_with_constructor(|| {
                // 25 µs to ~3 s.
                Histogram::new(prometheus_client::metrics::histogram::exponential_buckets(
                    0.000_025, 2.0, 18,
                ))
            }),
            rate_limited: Family::default(),
            upstream_busy: Family::default(),
            unknown_sources: Family::default(),
            records: Gauge::default(),
            tenants: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Metrics registered under `vc_dns_`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let registry = registry.sub_registry_with_prefix("vc_dns");
        registry.register(
            "queries",
            "DNS queries answered, by tenant (cluster key) and response code",
            metrics.queries.clone(),
        );
        registry.register(
            "query_duration_seconds",
            "Time from a query's arrival to its answer, by where the answer came from",
            metrics.latency.clone(),
        );
        registry.register(
            "rate_limited",
            "Queries refused because the tenant was over its query rate",
            metrics.rate_limited.clone(),
        );
        registry.register(
            "upstream_busy",
            "Forwarded queries answered SERVFAIL because the tenant's (or every) upstream slot was taken",
            metrics.upstream_busy.clone(),
        );
        registry.register(
            "unknown_source_queries",
            "Queries from addresses no known tenant pod had when they arrived, by outcome (learned while waiting, still unknown, no waiting slot, no slot left for the source's range)",
            metrics.unknown_sources.clone(),
        );
        registry.register(
            "index_objects",
            "Super-cluster objects in the index (namespaces, Services, EndpointSlices, pods)",
            metrics.records.clone(),
        );
        registry.register(
            "tenants",
            "Tenants (VirtualClusters) whose names are served",
            metrics.tenants.clone(),
        );
        metrics
    }
}
