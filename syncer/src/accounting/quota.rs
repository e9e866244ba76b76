//! Per-tenant aggregate quota on super pods, Services and PersistentVolumeClaims.
//!
//! The ledger follows super pods from the cache and reserves a pod's resources at admission, so that
//! workers creating pods at the same time cannot overshoot. A pod that does not fit waits; it is queued
//! again as soon as a pod of the same tenant ends or goes away, when the tenant's quota changes
//! ([`Quota::requeue_waiting`]), and by every patrol.

pub mod metrics;

use std::{
    collections::{HashMap, HashSet},
    sync::{Arc, Mutex},
};

use crds::{TenantQuota, quantity::parse_quantity};
use k8s_openapi::{
    api::core::v1::{PersistentVolumeClaimSpec, Pod, ServiceSpec},
    apimachinery::pkg::api::resource::Quantity,
};

use self::metrics::QuotaMetrics;
use crate::{
    accounting::usage::metrics::UsageLabels,
    cache::{
        meta::Tagged,
        pods::{CachedPodSpec, SuperPod},
        stores::Change,
    },
    engine::{
        items::{DownItem, Kind, ObjectKey},
        queue::{FairQueue, TenantId},
    },
    tenancy::identity,
};

pub use crds::usage::Usage;

/// Reason of the event (and of the tenant pod's PodScheduled condition) while a tenant's quota holds an
/// object back.
pub const REASON_QUOTA_EXCEEDED: &str = "TenantQuotaExceeded";

/// What a pod counts against quota (see [`crds::usage::pod_usage`]).
pub fn pod_usage(spec: &CachedPodSpec) -> Usage {
    crds::usage::pod_usage(
        spec.containers.iter().map(|c| Some(&c.resources)),
        spec.init_containers.iter().map(|c| Some(&c.resources)),
        Some(&spec.overhead),
    )
}

fn counts(pod: &SuperPod) -> bool {
    !matches!(pod.phase().as_deref(), Some("Succeeded" | "Failed"))
}

/// Why a pod does not fit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exceeded {
    /// The quota key, e.g. `requests.cpu`.
    pub resource: &'static str,
    /// Used (including reservations), in the quota's unit.
    pub used: i64,
    /// Asked for by the pod.
    pub requested: i64,
    /// The limit.
    pub limit: i64,
}

impl std::fmt::Display for Exceeded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tenant quota {} exceeded: {} in use, {} asked for, limit {}",
            self.resource, self.used, self.requested, self.limit
        )
    }
}

/// The limits of a tenant's quota in ledger units; `None` for unlimited dimensions.
fn limits(quota: &TenantQuota) -> [(&'static str, Option<i64>); 5] {
    let parse = |q: &Option<Quantity>, scale| q.as_ref().and_then(|q| parse_quantity(&q.0, scale));
    [
        ("pods", parse(&quota.pods, 1.0)),
        ("requests.cpu", parse(&quota.requests_cpu, 1000.0)),
        ("requests.memory", parse(&quota.requests_memory, 1.0)),
        ("limits.cpu", parse(&quota.limits_cpu, 1000.0)),
        ("limits.memory", parse(&quota.limits_memory, 1.0)),
    ]
}

fn dimensions(usage: &Usage) -> [i64; 5] {
    [
        usage.pods,
        usage.requests_cpu,
        usage.requests_memory,
        usage.limits_cpu,
        usage.limits_memory,
    ]
}

/// Whether `usage` fits next to what a ledger counts.
fn fits(ledger: &Ledger, quota: Option<&TenantQuota>, usage: Usage) -> Result<(), Exceeded> {
    let Some(quota) = quota else {
        return Ok(());
    };
    let used = dimensions(&ledger.used);
    let asked = dimensions(&usage);
    for (i, (resource, limit)) in limits(quota).into_iter().enumerate() {
        if let Some(limit) = limit
            && used[i] + asked[i] > limit
        {
            return Err(Exceeded {
                resource,
                used: used[i],
                requested: asked[i],
                limit,
            });
        }
    }
    Ok(())
}

/// What a Service or PersistentVolumeClaim counts against the object quotas.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ObjectUsage {
    /// Services.
    pub services: i64,
    /// Node ports of NodePort and LoadBalancer Services.
    pub node_ports: i64,
    /// LoadBalancer Services.
    pub load_balancers: i64,
    /// PersistentVolumeClaims.
    pub claims: i64,
    /// Storage requested by claims, bytes.
    pub storage: i64,
}

impl ObjectUsage {
    fn dimensions(&self) -> [i64; 5] {
        [
            self.services,
            self.node_ports,
            self.load_balancers,
            self.claims,
            self.storage,
        ]
    }

    fn add(&mut self, other: &Self, sign: i64) {
        self.services += sign * other.services;
        self.node_ports += sign * other.node_ports;
        self.load_balancers += sign * other.load_balancers;
        self.claims += sign * other.claims;
        self.storage += sign * other.storage;
    }
}

/// What a super Service counts: one Service, its node ports (as ResourceQuota counts
/// `services.nodeports`), and one load balancer when it is one.
pub fn service_usage(spec: Option<&ServiceSpec>) -> ObjectUsage {
    let node_ports = match needs_node_ports(spec) {
        true => spec.and_then(|s| s.ports.as_ref()).map_or(0, |p| p.len() as i64),
        false => 0,
    };
    ObjectUsage {
        services: 1,
        node_ports,
        load_balancers: i64::from(spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")),
        ..Default::default()
    }
}

/// Whether a Service of this spec has node ports: `NodePort`, and `LoadBalancer` unless it opts out.
pub fn needs_node_ports(spec: Option<&ServiceSpec>) -> bool {
    spec.is_some_and(|s| match s.type_.as_deref() {
        Some("NodePort") => true,
        Some("LoadBalancer") => s.allocate_load_balancer_node_ports != Some(false),
        _ => false,
    })
}

/// What a super PersistentVolumeClaim counts: one claim and the storage it requests.
pub fn claim_usage(spec: Option<&PersistentVolumeClaimSpec>) -> ObjectUsage {
    let storage = spec
        .and_then(|s| s.resources.as_ref())
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| parse_quantity(&q.0, 1.0))
        .unwrap_or(0);
    ObjectUsage {
        claims: 1,
        storage,
        ..Default::default()
    }
}

/// The object-count limits of a tenant's quota; `None` for unlimited dimensions.
fn object_limits(quota: &TenantQuota) -> [(&'static str, Option<i64>); 5] {
    let parse = |q: &Option<Quantity>| q.as_ref().and_then(|q| parse_quantity(&q.0, 1.0));
    [
        ("services", parse(&quota.services)),
        ("services.nodeports", parse(&quota.services_node_ports)),
        ("services.loadbalancers", parse(&quota.services_load_balancers)),
        ("persistentvolumeclaims", parse(&quota.persistentvolumeclaims)),
        ("requests.storage", parse(&quota.requests_storage)),
    ]
}

/// The quota dimensions a pod must state for every container: a container that leaves one out would not
/// count against it (the same rule as a ResourceQuota's). `(resource, container kind and name)` pairs.
pub fn unstated_resources(quota: Option<&TenantQuota>, pod: &Pod) -> Vec<String> {
    let Some(quota) = quota else {
        return Vec::new();
    };
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let required: Vec<(&str, &str, &str)> = [
        (quota.requests_cpu.is_some(), "requests.cpu", "requests", "cpu"),
        (
            quota.requests_memory.is_some(),
            "requests.memory",
            "requests",
            "memory",
        ),
        (quota.limits_cpu.is_some(), "limits.cpu", "limits", "cpu"),
        (quota.limits_memory.is_some(), "limits.memory", "limits", "memory"),
    ]
    .into_iter()
    .filter(|(set, ..)| *set)
    .map(|(_, name, side, resource)| (name, side, resource))
    .collect();
    let containers = spec.containers.iter().map(|c| ("container", c)).chain(
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| ("init container", c)),
    );
    let mut missing = Vec::new();
    for (kind, container) in containers {
        for (name, side, resource) in &required {
            let resources = container.resources.as_ref();
            let values = match *side {
                "requests" => resources.and_then(|r| r.requests.as_ref()),
                _ => resources.and_then(|r| r.limits.as_ref()),
            };
            if !values.is_some_and(|v| v.contains_key(*resource)) {
                missing.push(format!("{name} of {kind} {:?}", container.name));
            }
        }
    }
    missing
}

#[derive(Default)]
struct Ledger {
    label: String,
    pods: HashMap<ObjectKey, Usage>,
    reserved: HashMap<ObjectKey, Usage>,
    used: Usage,
    waiting: HashSet<ObjectKey>,
    objects: HashMap<DownItem, ObjectUsage>,
    reserved_objects: HashMap<DownItem, ObjectUsage>,
    used_objects: ObjectUsage,
    waiting_objects: HashSet<DownItem>,
}

impl Ledger {
    /// What an object counts now: seen in the super cluster, or reserved on its way there.
    fn counted(&self, item: &DownItem) -> ObjectUsage {
        self.reserved_objects
            .get(item)
            .or_else(|| self.objects.get(item))
            .copied()
            .unwrap_or_default()
    }
}

/// Every tenant's usage.
pub struct Quota {
    tenants: Mutex<HashMap<TenantId, Ledger>>,
    down: Arc<FairQueue<DownItem>>,
    metrics: QuotaMetrics,
}

impl Quota {
    /// An empty ledger that re-queues waiting pods on `down`.
    pub fn new(down: Arc<FairQueue<DownItem>>, metrics: QuotaMetrics) -> Self {
        Self {
            tenants: Mutex::default(),
            down,
            metrics,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<TenantId, Ledger>> {
        self.tenants.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Follows a super pod from the cache.
    pub fn observe(&self, pod: &SuperPod, change: Change) {
        let meta = pod.meta();
        let (Some(cluster), Some(namespace)) =
            (identity::owner_cluster(meta), identity::tenant_namespace(meta))
        else {
            return;
        };
        let tenant: TenantId = Arc::from(cluster);
        let key = ObjectKey::new(namespace, meta.object_name().unwrap_or_default());
        let usage = match change {
            Change::Applied if counts(pod) => Some(pod_usage(&pod.spec)),
            _ => None,
        };
        let mut tenants = self.lock();
        let ledger = tenants.entry(tenant.clone()).or_default();
        if ledger.label.is_empty() {
            let labels = pod.meta();
            ledger.label = format!(
                "{}/{}",
                labels.label(crds::wellknown::LABEL_VC_NAMESPACE).unwrap_or(""),
                labels.label(crds::wellknown::LABEL_VC_NAME).unwrap_or("")
            );
        }
        if let Some(reserved) = ledger.reserved.remove(&key) {
            ledger.used -= reserved;
        }
        let previous = ledger.pods.remove(&key);
        if let Some(previous) = previous {
            ledger.used -= previous;
        }
        if let Some(usage) = usage {
            ledger.used += usage;
            ledger.pods.insert(key, usage);
        }
        let freed = previous.is_some() && usage.is_none();
        let waiting: Vec<ObjectKey> = if freed {
            ledger.waiting.drain().collect()
        } else {
            Vec::new()
        };
        self.publish(ledger);
        drop(tenants);
        for key in waiting {
            let (namespace, name) = key.parts();
            self.down.add(&tenant, DownItem::new(Kind::Pod, namespace, name));
        }
    }

    /// Admits a pod about to be created: reserves its usage, or says which limit it would exceed (and
    /// remembers it, to queue it again when usage drops).
    pub fn admit(
        &self,
        tenant: &TenantId,
        quota: Option<&TenantQuota>,
        namespace: &str,
        name: &str,
        usage: Usage,
    ) -> Result<(), Exceeded> {
        let key = ObjectKey::new(namespace, name);
        let mut tenants = self.lock();
        let ledger = tenants.entry(tenant.clone()).or_default();
        if ledger.pods.contains_key(&key) || ledger.reserved.contains_key(&key) {
            return Ok(());
        }
        if let Err(exceeded) = fits(ledger, quota, usage) {
            ledger.waiting.insert(key);
            self.publish(ledger);
            return Err(exceeded);
        }
        ledger.waiting.remove(&key);
        ledger.used += usage;
        ledger.reserved.insert(key, usage);
        self.publish(ledger);
        Ok(())
    }

    /// Whether a pod would be admitted now, without reserving anything: lets a pod that waits be looked
    /// at again cheaply (from the cache, before its whole spec is read).
    pub fn check(
        &self,
        tenant: &TenantId,
        quota: Option<&TenantQuota>,
        namespace: &str,
        name: &str,
        usage: Usage,
    ) -> Result<(), Exceeded> {
        let key = ObjectKey::new(namespace, name);
        let tenants = self.lock();
        let Some(ledger) = tenants.get(tenant) else {
            return fits(&Ledger::default(), quota, usage);
        };
        if ledger.pods.contains_key(&key) || ledger.reserved.contains_key(&key) {
            return Ok(());
        }
        fits(ledger, quota, usage)
    }

    /// Queues every pod of a tenant that waits for quota, to be admitted again: its quota changed, or the
    /// patrol looks. Pods stay marked as waiting until they are admitted. Returns how many were queued.
    pub fn requeue_waiting(&self, tenant: &TenantId) -> usize {
        let (waiting, objects): (Vec<ObjectKey>, Vec<DownItem>) = self
            .lock()
            .get(tenant)
            .map(|l| {
                (
                    l.waiting.iter().cloned().collect(),
                    l.waiting_objects.iter().cloned().collect(),
                )
            })
            .unwrap_or_default();
        for key in &waiting {
            let (namespace, name) = key.parts();
            self.down.add(tenant, DownItem::new(Kind::Pod, namespace, name));
        }
        for item in &objects {
            self.down.add(tenant, item.clone());
        }
        waiting.len() + objects.len()
    }

    /// Counts a tenant's super pods again from the cache (when the tenant is attached again after its
    /// ledger was forgotten): pods that keep running send no events that would count them.
    pub fn recount<'a>(&self, tenant: &TenantId, pods: impl IntoIterator<Item = &'a SuperPod>) {
        for pod in pods {
            if identity::owner_cluster(pod.meta()) == Some(&**tenant) {
                self.observe(pod, Change::Applied);
            }
        }
    }

    /// Follows a super Service or PersistentVolumeClaim from the cache (`usage` `None`: it is gone).
    pub fn observe_object(&self, meta: &kube::api::ObjectMeta, kind: Kind, usage: Option<ObjectUsage>) {
        let (Some(cluster), Some(namespace), Some(name)) = (
            identity::owner_cluster(meta),
            identity::tenant_namespace(meta),
            meta.name.as_deref(),
        ) else {
            return;
        };
        let tenant: TenantId = Arc::from(cluster);
        let item = DownItem::new(kind, namespace, name);
        let mut tenants = self.lock();
        let ledger = tenants.entry(tenant.clone()).or_default();
        // `used_objects` is the sum of what every object counts (`Ledger::counted`): what the cache shows
        // replaces both the reservation and what it showed before.
        let before = ledger.counted(&item);
        ledger.reserved_objects.remove(&item);
        ledger.objects.remove(&item);
        let after = usage.unwrap_or_default();
        ledger.used_objects.add(&before, -1);
        ledger.used_objects.add(&after, 1);
        if let Some(usage) = usage {
            ledger.objects.insert(item, usage);
        }
        let freed = before
            .dimensions()
            .iter()
            .zip(after.dimensions())
            .any(|(b, a)| a < *b);
        let waiting: Vec<DownItem> = match freed {
            true => ledger.waiting_objects.drain().collect(),
            false => Vec::new(),
        };
        drop(tenants);
        for item in waiting {
            self.down.add(&tenant, item);
        }
    }

    /// Admits a Service or PersistentVolumeClaim about to be created or changed to `usage`: reserves it,
    /// or says which object quota it would exceed (and remembers it, to queue it again when usage drops).
    /// Only dimensions that grow are checked, so an object already counted can always shrink or stay.
    pub fn admit_object(
        &self,
        tenant: &TenantId,
        quota: Option<&TenantQuota>,
        item: &DownItem,
        usage: ObjectUsage,
    ) -> Result<(), Exceeded> {
        let mut tenants = self.lock();
        let ledger = tenants.entry(tenant.clone()).or_default();
        let counted = ledger.counted(item);
        if let Some(quota) = quota {
            let used = ledger.used_objects.dimensions();
            let (before, after) = (counted.dimensions(), usage.dimensions());
            for (i, (resource, limit)) in object_limits(quota).into_iter().enumerate() {
                let grows = after[i] > before[i];
                if let Some(limit) = limit
                    && grows
                    && used[i] - before[i] + after[i] > limit
                {
                    ledger.waiting_objects.insert(item.clone());
                    return Err(Exceeded {
                        resource,
                        used: used[i] - before[i],
                        requested: after[i],
                        limit,
                    });
                }
            }
        }
        ledger.waiting_objects.remove(item);
        // The reservation counts instead of what the cache shows until the cache shows the change.
        ledger.used_objects.add(&counted, -1);
        ledger.used_objects.add(&usage, 1);
        ledger.reserved_objects.insert(item.clone(), usage);
        Ok(())
    }

    /// Drops the reservation of an object that was not written: it counts as the cache shows it again.
    pub fn release_object(&self, tenant: &TenantId, item: &DownItem) {
        let mut tenants = self.lock();
        if let Some(ledger) = tenants.get_mut(tenant)
            && let Some(reserved) = ledger.reserved_objects.remove(item)
        {
            let seen = ledger.counted(item);
            ledger.used_objects.add(&reserved, -1);
            ledger.used_objects.add(&seen, 1);
        }
    }

    /// Forgets a Service or claim that no longer waits for room (deleted in the tenant).
    pub fn stop_waiting_object(&self, tenant: &TenantId, item: &DownItem) {
        if let Some(ledger) = self.lock().get_mut(tenant) {
            ledger.waiting_objects.remove(item);
        }
    }

    /// A tenant's object usage, reservations included.
    pub fn used_objects(&self, tenant: &TenantId) -> ObjectUsage {
        self.lock()
            .get(tenant)
            .map(|l| l.used_objects)
            .unwrap_or_default()
    }

    /// Drops a reservation whose pod was not created.
    pub fn release(&self, tenant: &TenantId, namespace: &str, name: &str) {
        let mut tenants = self.lock();
        if let Some(ledger) = tenants.get_mut(tenant)
            && let Some(reserved) = ledger.reserved.remove(&ObjectKey::new(namespace, name))
        {
            ledger.used -= reserved;
            self.publish(ledger);
        }
    }

    /// Forgets a pod that no longer waits (deleted in the tenant).
    pub fn stop_waiting(&self, tenant: &TenantId, namespace: &str, name: &str) {
        if let Some(ledger) = self.lock().get_mut(tenant) {
            ledger.waiting.remove(&ObjectKey::new(namespace, name));
        }
    }

    /// Whether a pod waits for quota.
    pub fn is_waiting(&self, tenant: &TenantId, namespace: &str, name: &str) -> bool {
        self.lock()
            .get(tenant)
            .is_some_and(|l| l.waiting.contains(&ObjectKey::new(namespace, name)))
    }

    /// A tenant's current usage, reservations included.
    pub fn used(&self, tenant: &TenantId) -> Usage {
        self.lock().get(tenant).map(|l| l.used).unwrap_or_default()
    }

    /// Forgets a detached tenant.
    pub fn forget(&self, tenant: &TenantId) {
        self.lock().remove(tenant);
    }

    fn publish(&self, ledger: &Ledger) {
        if ledger.label.is_empty() {
            return;
        }
        let labels = UsageLabels {
            tenant: ledger.label.clone(),
        };
        self.metrics
            .tenant_pods
            .get_or_create(&labels)
            .set(ledger.used.pods);
        self.metrics
            .tenant_cpu_requests_millicores
            .get_or_create(&labels)
            .set(ledger.used.requests_cpu);
        self.metrics
            .tenant_memory_requests_bytes
            .get_or_create(&labels)
            .set(ledger.used.requests_memory);
        self.metrics
            .quota_waiting_pods
            .get_or_create(&labels)
            .set(ledger.waiting.len() as i64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(cpu: &str, memory: &str) -> CachedPodSpec {
        let pod: k8s_openapi::api::core::v1::Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "n"},
            "spec": {
                "containers": [
                    {"name": "a", "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"cpu": "1"}}},
                    {"name": "b", "resources": {"requests": {"cpu": cpu}}}
                ],
                "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "3"}}}]
            }
        }))
        .expect("pod");
        crate::resources::pod::convert::cached_spec(&pod)
    }

    #[test]
    fn pod_usage_counts_containers_and_the_largest_init_container() {
        let usage = pod_usage(&pod("500m", "1Gi"));
        assert_eq!(
            usage,
            Usage {
                pods: 1,
                requests_cpu: 3000,
                requests_memory: 1 << 30,
                limits_cpu: 1000,
                limits_memory: 0
            }
        );
        let usage = pod_usage(&pod("2", "1Gi"));
        assert_eq!(usage.requests_cpu, 4000);
    }

    #[tokio::test]
    async fn admission_reserves_and_refuses_over_the_limit() {
        let down = Arc::new(FairQueue::new());
        let quota = Quota::new(down.clone(), QuotaMetrics::default());
        let tenant: TenantId = Arc::from("t");
        let limit = TenantQuota {
            pods: Some(Quantity("2".into())),
            ..Default::default()
        };
        let one = Usage {
            pods: 1,
            ..Default::default()
        };
        assert!(quota.admit(&tenant, Some(&limit), "ns", "a", one).is_ok());
        assert!(quota.admit(&tenant, Some(&limit), "ns", "b", one).is_ok());
        // Admitting the same pod again does not count it twice.
        assert!(quota.admit(&tenant, Some(&limit), "ns", "a", one).is_ok());
        let refused = quota
            .admit(&tenant, Some(&limit), "ns", "c", one)
            .expect_err("third pod");
        assert_eq!(refused.resource, "pods");
        assert_eq!((refused.used, refused.limit), (2, 2));
        assert_eq!(quota.used(&tenant).pods, 2);

        // The super pod of "a" appears, then finishes: "c" is queued again.
        let mut super_pod: SuperPod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "a", "namespace": "t-ns", "annotations": {
                "tenancy.x-k8s.io/cluster": "t", "tenancy.x-k8s.io/namespace": "ns"}},
            "spec": {"containers": [{"name": "c"}]}
        }))
        .expect("pod");
        quota.observe(&super_pod, Change::Applied);
        assert_eq!(quota.used(&tenant).pods, 2);
        super_pod.status = Some(crate::cache::pods::PackedStatus::new(r#"{"phase":"Succeeded"}"#));
        quota.observe(&super_pod, Change::Applied);
        assert_eq!(quota.used(&tenant).pods, 1);
        let work = down.next().await.expect("requeued");
        assert_eq!(work.item, DownItem::new(Kind::Pod, "ns", "c"));

        // A failed creation gives its reservation back.
        quota.release(&tenant, "ns", "b");
        assert_eq!(quota.used(&tenant).pods, 0);
    }

    #[tokio::test]
    async fn waiting_pods_are_queued_again_on_demand_and_checked_without_reserving() {
        let down = Arc::new(FairQueue::new());
        let quota = Quota::new(down.clone(), QuotaMetrics::default());
        let tenant: TenantId = Arc::from("t");
        down.configure_tenant(&tenant, 1, None);
        let one_pod = TenantQuota {
            pods: Some(Quantity("1".into())),
            ..Default::default()
        };
        let one = Usage {
            pods: 1,
            ..Default::default()
        };
        assert!(quota.admit(&tenant, Some(&one_pod), "ns", "a", one).is_ok());
        assert!(quota.admit(&tenant, Some(&one_pod), "ns", "b", one).is_err());
        assert!(quota.is_waiting(&tenant, "ns", "b"));

        // A check reserves nothing and keeps the pod waiting.
        assert!(quota.check(&tenant, Some(&one_pod), "ns", "b", one).is_err());
        let two_pods = TenantQuota {
            pods: Some(Quantity("2".into())),
            ..Default::default()
        };
        assert!(quota.check(&tenant, Some(&two_pods), "ns", "b", one).is_ok());
        assert!(quota.check(&tenant, None, "ns", "b", one).is_ok());
        assert_eq!(quota.used(&tenant).pods, 1);
        assert!(quota.is_waiting(&tenant, "ns", "b"));
        // A counted pod always passes.
        assert!(quota.check(&tenant, Some(&one_pod), "ns", "a", one).is_ok());

        // Queued again (and still waiting until admitted).
        assert_eq!(quota.requeue_waiting(&tenant), 1);
        let work = down.next().await.expect("requeued");
        assert_eq!(work.item, DownItem::new(Kind::Pod, "ns", "b"));
        down.done(&work);
        assert!(quota.is_waiting(&tenant, "ns", "b"));
        assert!(quota.admit(&tenant, Some(&two_pods), "ns", "b", one).is_ok());
        assert!(!quota.is_waiting(&tenant, "ns", "b"));
        assert_eq!(quota.requeue_waiting(&tenant), 0);
        assert_eq!(quota.requeue_waiting(&Arc::from("other")), 0);
    }

    #[test]
    fn a_forgotten_tenant_is_counted_again_from_its_super_pods() {
        let quota = Quota::new(Arc::new(FairQueue::new()), QuotaMetrics::default());
        let tenant: TenantId = Arc::from("t");
        let pod = |name: &str, cluster: &str, phase: &str| -> SuperPod {
            let mut pod: SuperPod = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": format!("{cluster}-ns"), "annotations": {
                    "tenancy.x-k8s.io/cluster": cluster, "tenancy.x-k8s.io/namespace": "ns"}},
                "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": "250m"}}}]}
            }))
            .expect("pod");
            pod.status = Some(crate::cache::pods::PackedStatus::new(&format!(
                r#"{{"phase":"{phase}"}}"#
            )));
            pod
        };
        let pods = [
            pod("a", "t", "Running"),
            pod("b", "t", "Pending"),
            pod("done", "t", "Succeeded"),
            pod("theirs", "u", "Running"),
        ];
        for p in &pods {
            quota.observe(p, Change::Applied);
        }
        assert_eq!(quota.used(&tenant).pods, 2);
        quota.forget(&tenant);
        assert_eq!(quota.used(&tenant).pods, 0);
        quota.recount(&tenant, pods.iter());
        quota.recount(&tenant, pods.iter());
        let used = quota.used(&tenant);
        assert_eq!((used.pods, used.requests_cpu), (2, 500));
        assert_eq!(quota.used(&Arc::from("u")).pods, 1);
    }

    #[test]
    fn objects_count_once_across_reservations_updates_and_deletions() {
        let down = Arc::new(FairQueue::new());
        let quota = Quota::new(down, QuotaMetrics::default());
        let tenant: TenantId = Arc::from("t");
        let limit = TenantQuota {
            persistentvolumeclaims: Some(Quantity("2".into())),
            requests_storage: Some(Quantity("1Gi".into())),
            ..Default::default()
        };
        let claim = |size: &str| -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "small", "namespace": "t-ns", "annotations": {
                    "tenancy.x-k8s.io/cluster": "t", "tenancy.x-k8s.io/namespace": "ns"}},
                "spec": {"resources": {"requests": {"storage": size}}}
            }))
            .expect("claim")
        };
        let small = DownItem::new(Kind::PersistentVolumeClaim, "ns", "small");
        let big = DownItem::new(Kind::PersistentVolumeClaim, "ns", "big");
        let usage = |size: &str| claim_usage(claim(size).spec.as_ref());
        assert_eq!(usage("600Mi").storage, 600 << 20);

        // Reserved, then seen; an update reserves over what is seen, and an unchanged object is seen again.
        quota
            .admit_object(&tenant, Some(&limit), &small, usage("600Mi"))
            .expect("fits");
        let seen = claim("600Mi");
        quota.observe_object(&seen.metadata, Kind::PersistentVolumeClaim, Some(usage("600Mi")));
        quota
            .admit_object(&tenant, Some(&limit), &small, usage("600Mi"))
            .expect("unchanged");
        quota.observe_object(&seen.metadata, Kind::PersistentVolumeClaim, Some(usage("600Mi")));
        quota.observe_object(&seen.metadata, Kind::PersistentVolumeClaim, Some(usage("600Mi")));
        assert_eq!(quota.used_objects(&tenant).storage, 600 << 20);
        assert_eq!(quota.used_objects(&tenant).claims, 1);

        // Another claim would exceed the storage; growing this one too; shrinking always fits.
        let refused = quota
            .admit_object(&tenant, Some(&limit), &big, usage("600Mi"))
            .expect_err("over");
        assert_eq!(refused.resource, "requests.storage");
        assert!(
            quota
                .admit_object(&tenant, Some(&limit), &small, usage("2Gi"))
                .is_err()
        );
        quota
            .admit_object(&tenant, Some(&limit), &small, usage("100Mi"))
            .expect("shrinks");
        // A write that failed gives the reservation back: the claim counts as seen.
        quota.release_object(&tenant, &small);
        assert_eq!(quota.used_objects(&tenant).storage, 600 << 20);

        // Deleted: the room is back and the refused claim is queued again.
        quota.observe_object(&seen.metadata, Kind::PersistentVolumeClaim, None);
        assert_eq!(quota.used_objects(&tenant), ObjectUsage::default());
        assert!(
            quota
                .admit_object(&tenant, Some(&limit), &big, usage("600Mi"))
                .is_ok()
        );
    }

    #[test]
    fn services_count_their_node_ports_and_load_balancers() {
        let spec = |value: serde_json::Value| -> ServiceSpec { serde_json::from_value(value).expect("spec") };
        let two_ports = json_ports();
        let node_port = service_usage(Some(&spec(
            serde_json::json!({"type": "NodePort", "ports": two_ports}),
        )));
        assert_eq!(
            (node_port.services, node_port.node_ports, node_port.load_balancers),
            (1, 2, 0)
        );
        let balancer = service_usage(Some(&spec(
            serde_json::json!({"type": "LoadBalancer", "allocateLoadBalancerNodePorts": false, "ports": json_ports()}),
        )));
        assert_eq!((balancer.node_ports, balancer.load_balancers), (0, 1));
        assert_eq!(service_usage(None).services, 1);
    }

    fn json_ports() -> serde_json::Value {
        serde_json::json!([{"port": 80}, {"port": 443}])
    }

    #[test]
    fn every_container_states_what_the_quota_limits() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p"},
            "spec": {
                "containers": [{"name": "a", "resources": {"requests": {"cpu": "1"}, "limits": {"memory": "1Gi"}}}],
                "initContainers": [{"name": "init", "resources": {"requests": {"cpu": "1"}}}]
            }
        }))
        .expect("pod");
        let limit = TenantQuota {
            requests_cpu: Some(Quantity("4".into())),
            limits_memory: Some(Quantity("4Gi".into())),
            ..Default::default()
        };
        assert_eq!(
            unstated_resources(Some(&limit), &pod),
            vec!["limits.memory of init container \"init\"".to_owned()]
        );
        // Quotas on pods only, or none: nothing needs stating.
        let pods_only = TenantQuota {
            pods: Some(Quantity("4".into())),
            ..Default::default()
        };
        assert!(unstated_resources(Some(&pods_only), &pod).is_empty());
        assert!(unstated_resources(None, &pod).is_empty());
    }
}
