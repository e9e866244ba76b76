//! What a pod counts against a tenant's `spec.quota`, as the scheduler counts it: its containers summed, its
//! largest init container instead when that is more, plus the pod overhead. One definition for the syncer's
//! quota ledger and `kubectl vc describe`, so the two never disagree.

use std::collections::BTreeMap;

use k8s_openapi::{api::core::v1::ResourceRequirements, apimachinery::pkg::api::resource::Quantity};

use crate::quantity::parse_quantity;

/// Pods, CPU in millicores and memory in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Usage {
    /// Pods.
    pub pods: i64,
    /// CPU requests, millicores.
    pub requests_cpu: i64,
    /// Memory requests, bytes.
    pub requests_memory: i64,
    /// CPU limits, millicores.
    pub limits_cpu: i64,
    /// Memory limits, bytes.
    pub limits_memory: i64,
}

impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, other: Self) {
        self.pods += other.pods;
        self.requests_cpu += other.requests_cpu;
        self.requests_memory += other.requests_memory;
        self.limits_cpu += other.limits_cpu;
        self.limits_memory += other.limits_memory;
    }
}

impl std::ops::SubAssign for Usage {
    fn sub_assign(&mut self, other: Self) {
        self.pods -= other.pods;
        self.requests_cpu -= other.requests_cpu;
        self.requests_memory -= other.requests_memory;
        self.limits_cpu -= other.limits_cpu;
        self.limits_memory -= other.limits_memory;
    }
}

/// Quantities by resource name (a pod's overhead, a container's requests or its limits), however the caller
/// keeps them: the apiserver's maps, or the syncer's compact cached form.
pub trait Amounts {
    /// The quantity stated for `resource`, as written.
    fn amount(&self, resource: &str) -> Option<&str>;
}

impl Amounts for BTreeMap<String, Quantity> {
    fn amount(&self, resource: &str) -> Option<&str> {
        self.get(resource).map(|q| q.0.as_str())
    }
}

/// A container's requests and limits, however the caller keeps them.
pub trait Requirements {
    /// Requests.
    fn requests(&self) -> Option<&dyn Amounts>;
    /// Limits.
    fn limits(&self) -> Option<&dyn Amounts>;
}

impl Requirements for ResourceRequirements {
    fn requests(&self) -> Option<&dyn Amounts> {
        self.requests.as_ref().map(|r| r as &dyn Amounts)
    }

    fn limits(&self) -> Option<&dyn Amounts> {
        self.limits.as_ref().map(|l| l as &dyn Amounts)
    }
}

fn amount(amounts: Option<&dyn Amounts>, name: &str, scale: f64) -> i64 {
    amounts
        .and_then(|a| a.amount(name))
        .and_then(|q| parse_quantity(q, scale))
        .unwrap_or(0)
}

fn container_usage<R: Requirements + ?Sized>(resources: Option<&R>) -> Usage {
    let requests = resources.and_then(|r| r.requests());
    let limits = resources.and_then(|r| r.limits());
    Usage {
        pods: 0,
        requests_cpu: amount(requests, "cpu", 1000.0),
        requests_memory: amount(requests, "memory", 1.0),
        limits_cpu: amount(limits, "cpu", 1000.0),
        limits_memory: amount(limits, "memory", 1.0),
    }
}

/// What one pod counts, from its containers' and init containers' resources and its overhead. Quantities
/// that do not parse count as zero (the apiserver has validated them already).
pub fn pod_usage<'a, R: Requirements + ?Sized + 'a, O: Amounts>(
    containers: impl IntoIterator<Item = Option<&'a R>>,
    init_containers: impl IntoIterator<Item = Option<&'a R>>,
    overhead: Option<&O>,
) -> Usage {
    let mut total = Usage::default();
    for resources in containers {
        total += container_usage(resources);
    }
    for resources in init_containers {
        let usage = container_usage(resources);
        total.requests_cpu = total.requests_cpu.max(usage.requests_cpu);
        total.requests_memory = total.requests_memory.max(usage.requests_memory);
        total.limits_cpu = total.limits_cpu.max(usage.limits_cpu);
        total.limits_memory = total.limits_memory.max(usage.limits_memory);
    }
    let overhead = overhead.map(|o| o as &dyn Amounts);
    total.requests_cpu += amount(overhead, "cpu", 1000.0);
    total.requests_memory += amount(overhead, "memory", 1.0);
    total.pods = 1;
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn resources(value: serde_json::Value) -> ResourceRequirements {
        serde_json::from_value(value).expect("valid resources")
    }

    #[test]
    fn containers_add_up_and_the_largest_init_container_wins_when_larger() {
        let web = resources(serde_json::json!({
            "requests": {"cpu": "250m", "memory": "64Mi"},
            "limits": {"cpu": "1", "memory": "128Mi"}
        }));
        let sidecar = resources(serde_json::json!({"requests": {"cpu": "250m", "memory": "64Mi"}}));
        let init = resources(serde_json::json!({"requests": {"cpu": "2", "memory": "1Mi"}}));
        let overhead: BTreeMap<String, Quantity> = [("cpu".to_owned(), Quantity("10m".into()))].into();
        let usage = pod_usage([Some(&web), Some(&sidecar), None], [Some(&init)], Some(&overhead));
        assert_eq!(
            usage,
            Usage {
                pods: 1,
                // The init container's 2 cores exceed the containers' 500m; the overhead comes on top.
                requests_cpu: 2010,
                requests_memory: 128 << 20,
                limits_cpu: 1000,
                limits_memory: 128 << 20,
            }
        );
    }

    #[test]
    fn sums_and_differences() {
        let one = pod_usage::<ResourceRequirements, BTreeMap<String, Quantity>>([None], [], None);
        let mut total = Usage::default();
        total += one;
        total += one;
        total -= one;
        assert_eq!(total, one);
        assert_eq!(one.pods, 1);
    }
}
