//! Prometheus metrics (prefix `vc_manager_`):
//!
//! - `reconcile_total{controller, result}` and `reconcile_duration_seconds{controller, result}`: every
//!   reconcile, `result` being `success` or the failure's reason;
//! - `virtual_clusters{phase}`: VirtualClusters by `status.phase` (`None` before the first status);
//! - `certificate_expiry_seconds{namespace, name, secret}`: seconds until the certificate in each Secret of
//!   a VirtualCluster expires (negative once expired);
//! - `leader`: 1 while this replica holds the Lease.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
    time::Duration,
};

use crds::VirtualCluster;
use kube::runtime::reflector::{ObjectRef, Store};
use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric},
    metrics::{
        counter::Counter,
        family::Family,
        gauge::Gauge,
        histogram::{Histogram, exponential_buckets},
    },
    registry::Registry,
};

/// Labels of the reconcile metrics.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReconcileLabels {
    /// `virtualcluster` or `clusterversion`.
    pub controller: String,
    /// `success` or the failure's reason.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CertificateLabels {
    namespace: String,
    name: String,
    secret: String,
}

type HistogramFamily = Family<ReconcileLabels, Histogram, fn() -> Histogram>;

fn duration_histogram() -> Histogram {
    // 5 ms .. ~40 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Certificate expiry times (Unix seconds) per VirtualCluster and Secret.
type Expiries = BTreeMap<(String, String), BTreeMap<String, i64>>;

/// vc-manager's metrics.
#[derive(Clone, Debug)]
pub struct Metrics {
    reconciles: Family<ReconcileLabels, Counter>,
    durations: HistogramFamily,
    expiries: Arc<Mutex<Expiries>>,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            durations: Family::new_with_constructor(duration_histogram as fn() -> Histogram),
            expiries: Arc::default(),
            leader: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Empty metrics.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers everything; `virtual_clusters` counts the objects in `store` at each scrape.
    pub fn register(&self, registry: &mut Registry, store: Store<VirtualCluster>) {
        registry.register(
            "reconcile",
            "Reconciles by controller and result (success or the failure's reason)",
            self.reconciles.clone(),
        );
        registry.register(
            "reconcile_duration_seconds",
            "Time spent in one reconcile, by controller and result",
            self.durations.clone(),
        );
        registry.register(
            "leader",
            "Whether this replica holds the leader Lease (1) or waits as a standby (0)",
            self.leader.clone(),
        );
        registry.register_collector(Box::new(PhaseCollector { store }));
        registry.register_collector(Box::new(ExpiryCollector {
            expiries: self.expiries.clone(),
        }));
    }

    /// Records one reconcile.
    pub fn observe(&self, controller: &str, result: &str, duration: Duration) {
        let labels = ReconcileLabels {
            controller: controller.to_owned(),
            result: result.to_owned(),
        };
        self.reconciles.get_or_create(&labels).inc();
        self.durations
            .get_or_create(&labels)
            .observe(duration.as_secs_f64());
    }

    /// How many reconciles ended with `result`.
    pub fn reconcile_count(&self, controller: &str, result: &str) -> u64 {
        self.reconciles
            .get_or_create(&ReconcileLabels {
                controller: controller.to_owned(),
                result: result.to_owned(),
            })
            .get()
    }

    /// Replaces the certificate expiries of a VirtualCluster.
    pub fn set_expiries(&self, vc: &ObjectRef<VirtualCluster>, expiries: BTreeMap<String, i64>) {
        let key = (vc.namespace.clone().unwrap_or_default(), vc.name.clone());
        if let Ok(mut all) = self.expiries.lock() {
            all.insert(key, expiries);
        }
    }

    /// Forgets a deleted VirtualCluster.
    pub fn forget(&self, vc: &ObjectRef<VirtualCluster>) {
        let key = (vc.namespace.clone().unwrap_or_default(), vc.name.clone());
        if let Ok(mut all) = self.expiries.lock() {
            all.remove(&key);
        }
    }

    /// The recorded expiries of a VirtualCluster.
    pub fn expiries_of(&self, vc: &ObjectRef<VirtualCluster>) -> BTreeMap<String, i64> {
        let key = (vc.namespace.clone().unwrap_or_default(), vc.name.clone());
        self.expiries
            .lock()
            .ok()
            .and_then(|all| all.get(&key).cloned())
            .unwrap_or_default()
    }

    /// Sets the `leader` gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }
}

#[derive(Debug)]
struct PhaseCollector {
    store: Store<VirtualCluster>,
}

impl Collector for PhaseCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = Family::<PhaseLabels, Gauge>::default();
        for phase in ["Pending", "Running", "Updating", "Error", "None"] {
            let _ = family.get_or_create(&PhaseLabels { phase: phase.into() });
        }
        for vc in self.store.state() {
            let phase = vc.phase().map_or("None", |p| p.as_str());
            family.get_or_create(&PhaseLabels { phase: phase.into() }).inc();
        }
        let metric = encoder.encode_descriptor(
            "virtual_clusters",
            "VirtualClusters by status.phase",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

#[derive(Debug)]
struct ExpiryCollector {
    expiries: Arc<Mutex<Expiries>>,
}

impl Collector for ExpiryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = k8s_openapi::jiff::Timestamp::now().as_second();
        let family = Family::<CertificateLabels, Gauge>::default();
        if let Ok(all) = self.expiries.lock() {
            for ((namespace, name), secrets) in all.iter() {
                for (secret, not_after) in secrets {
                    family
                        .get_or_create(&CertificateLabels {
                            namespace: namespace.clone(),
                            name: name.clone(),
                            secret: secret.clone(),
                        })
                        .set(not_after - now);
                }
            }
        }
        let metric = encoder.encode_descriptor(
            "certificate_expiry_seconds",
            "Seconds until the certificate in a tenant Secret expires, by VirtualCluster and Secret",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

#[cfg(test)]
mod tests {
    use crds::{ClusterPhase, VirtualClusterStatus};
    use kube::runtime::{reflector, watcher};

    use super::*;

    #[test]
    fn metrics_encode_with_phases_and_expiries() {
        let (store, mut writer) = reflector::store::<VirtualCluster>();
        let mut running = VirtualCluster::new("a", Default::default());
        running.metadata.namespace = Some("ns".into());
        running.status = Some(VirtualClusterStatus {
            phase: Some(ClusterPhase::Running),
            ..Default::default()
        });
        let mut fresh = VirtualCluster::new("b", Default::default());
        fresh.metadata.namespace = Some("ns".into());
        writer.apply_watcher_event(&watcher::Event::Apply(running));
        writer.apply_watcher_event(&watcher::Event::Apply(fresh));

        let metrics = Metrics::new();
        let mut registry = Registry::with_prefix("vc_manager");
        metrics.register(&mut registry, store);
        metrics.observe("virtualcluster", "success", Duration::from_millis(20));
        metrics.observe("virtualcluster", "SecretApplyFailed", Duration::from_millis(20));
        let vc = ObjectRef::new("a").within("ns");
        let in_an_hour = k8s_openapi::jiff::Timestamp::now().as_second() + 3600;
        metrics.set_expiries(&vc, [("root-ca".to_owned(), in_an_hour)].into());
        metrics.set_leader(true);

        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(
            text.contains("vc_manager_reconcile_total{controller=\"virtualcluster\",result=\"success\"} 1"),
            "{text}"
        );
        assert!(text.contains("result=\"SecretApplyFailed\"} 1"), "{text}");
        assert!(
            text.contains("vc_manager_reconcile_duration_seconds_bucket"),
            "{text}"
        );
        assert!(
            text.contains("vc_manager_virtual_clusters{phase=\"Running\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("vc_manager_virtual_clusters{phase=\"None\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("vc_manager_virtual_clusters{phase=\"Error\"} 0"),
            "{text}"
        );
        assert!(text.contains("vc_manager_leader 1"), "{text}");
        let line = text
            .lines()
            .find(|l| {
                l.starts_with(
                    "vc_manager_certificate_expiry_seconds{namespace=\"ns\",name=\"a\",secret=\"root-ca\"}",
                )
            })
            .unwrap_or_else(|| panic!("expiry line in {text}"));
        let seconds: i64 = line
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse().ok())
            .expect("value");
        assert!((3590..=3600).contains(&seconds), "{seconds}");

        metrics.forget(&vc);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        assert!(!text.contains("secret=\"root-ca\""), "{text}");
        assert_eq!(metrics.reconcile_count("virtualcluster", "success"), 1);
    }
}
