//! vn-agent's metrics, registered under the `vn_agent` prefix.

/// The registry and encoder the metrics work with, for embedders (the binary, tests) that serve them.
pub use prometheus_client::{encoding::text::encode, registry::Registry};

use prometheus_client::{
    encoding::EncodeLabelSet,
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
};

/// Labels of a finished request.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The kubelet endpoint (`containerLogs`, `exec`, `attach`, `portForward`, `run`, `pods`,
    /// `statsSummary`, `metricsResource`, `unknown`).
    pub verb: &'static str,
    /// The caller's cluster key; empty when the caller was not authenticated.
    pub tenant: String,
    /// The HTTP status answered.
    pub code: u16,
}

/// Labels by endpoint.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerbLabels {
    /// The kubelet endpoint.
    pub verb: &'static str,
}

/// Labels of refusals for a cap.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LimitLabels {
    /// `connections`, `connections_per_source` or `streams_per_tenant`.
    pub limit: &'static str,
}

/// Labels of refused clients.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AuthFailureLabels {
    /// `no_certificate`, `malformed_certificate`, `unknown_issuer`, `invalid_certificate`,
    /// `common_name_mismatch`.
    pub reason: &'static str,
}

/// Labels of streamed bytes.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// The kubelet endpoint.
    pub verb: &'static str,
    /// `to_backend` (from the tenant apiserver) or `to_client`.
    pub direction: &'static str,
}

/// Every metric vn-agent exports.
#[derive(Clone, Debug)]
pub struct Metrics {
    /// Requests answered, by verb, tenant and status code.
    pub requests: Family<RequestLabels, Counter>,
    /// Requests being handled, until the response head is sent (open streams are `streams_open`).
    pub in_flight: Family<VerbLabels, Gauge>,
    /// Seconds until the response head was sent.
    pub latency: Family<VerbLabels, Histogram>,
    /// Upgraded streams (exec, attach, port-forward) open now.
    pub streams_open: Family<VerbLabels, Gauge>,
    /// Bytes copied through upgraded streams.
    pub stream_bytes: Family<StreamLabels, Counter>,
    /// Upgraded streams cut because their caller's certificate stopped being trusted.
    pub streams_revoked: Family<VerbLabels, Counter>,
    /// Refused clients, by reason.
    pub auth_failures: Family<AuthFailureLabels, Counter>,
    /// Connections and streams refused for a cap, by cap.
    pub limited: Family<LimitLabels, Counter>,
    /// Tenants whose kubelet-client CA is trusted now.
    pub trusted_tenants: Gauge,
    /// Entries of the kubelet-client CA bundle that do not make a tenant trusted (see the logs for why).
    pub untrusted_cas: Gauge,
    /// Rebuilds of the trust set.
    pub trust_rebuilds: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            requests: Family::default(),
            in_flight: Family::default(),
            latency: Family::new_with_constructor(|| Histogram::new(exponential_buckets(0.001, 2.0, 16))),
            streams_open: Family::default(),
            stream_bytes: Family::default(),
            streams_revoked: Family::default(),
            auth_failures: Family::default(),
            limited: Family::default(),
            trusted_tenants: Gauge::default(),
            untrusted_cas: Gauge::default(),
            trust_rebuilds: Counter::default(),
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them in `registry` under `vn_agent`.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Self::default();
        let registry = registry.sub_registry_with_prefix("vn_agent");
        registry.register(
            "requests",
            "Requests answered, by kubelet endpoint, tenant cluster key and status code",
            metrics.requests.clone(),
        );
        registry.register(
            "requests_in_flight",
            "Requests being handled, by kubelet endpoint",
            metrics.in_flight.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "Seconds until the response head was sent, by kubelet endpoint",
            metrics.latency.clone(),
        );
        registry.register(
            "streams_open",
            "Upgraded streams (exec, attach, port-forward) open now",
            metrics.streams_open.clone(),
        );
        registry.register(
            "streams_revoked",
            "Upgraded streams cut because their caller's certificate stopped being trusted",
            metrics.streams_revoked.clone(),
        );
        registry.register(
            "stream_bytes",
            "Bytes copied through upgraded streams, by endpoint and direction",
            metrics.stream_bytes.clone(),
        );
        registry.register(
            "auth_failures",
            "Refused clients, by reason",
            metrics.auth_failures.clone(),
        );
        registry.register(
            "limited",
            "Connections and streams refused for a cap, by cap",
            metrics.limited.clone(),
        );
        registry.register(
            "trusted_tenants",
            "Tenants whose kubelet-client CA is trusted",
            metrics.trusted_tenants.clone(),
        );
        registry.register(
            "untrusted_kubelet_client_cas",
            "Entries of the kubelet-client CA bundle that do not make a tenant trusted",
            metrics.untrusted_cas.clone(),
        );
        registry.register(
            "trust_rebuilds",
            "Rebuilds of the trusted tenant set",
            metrics.trust_rebuilds.clone(),
        );
        metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_exported_with_their_labels() {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        metrics
            .requests
            .get_or_create(&RequestLabels {
                verb: "exec",
                tenant: "default-abc123-vc".into(),
                code: 101,
            })
            .inc();
        metrics
            .latency
            .get_or_create(&VerbLabels { verb: "exec" })
            .observe(0.01);
        metrics.trusted_tenants.set(2);
        let mut text = String::new();
        encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains(r#"vn_agent_requests_total{verb="exec",tenant="default-abc123-vc",code="101"} 1"#),
            "{text}"
        );
        assert!(text.contains("vn_agent_trusted_tenants 2"), "{text}");
        assert!(
            text.contains("vn_agent_request_duration_seconds_bucket"),
            "{text}"
        );
    }
}
