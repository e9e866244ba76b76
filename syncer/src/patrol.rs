//! The patrol: a periodic comparison of every tenant with the super cluster that queues repairs for
//! missing, drifted and orphaned objects, stale vNodes and status that did not flow up, looks again at
//! pods waiting for quota, and removes the namespaces of tenants that no longer exist.

use std::{collections::HashMap, sync::Arc, time::Instant};

use k8s_openapi::api::{
    core::v1::{ConfigMap, Endpoints, Namespace, PersistentVolumeClaim, Secret, Service, ServiceAccount},
    networking::v1::{Ingress, NetworkPolicy},
    policy::v1::PodDisruptionBudget,
};
use kube::{Resource, ResourceExt};

use crate::{
    attach,
    context::Context,
    identity,
    items::{DownItem, Kind, UpItem},
    metrics::PatrolLabels,
    resources::{Conversion, Downward, in_sync, network, pod::token},
    tenant::Tenant,
};

/// What one scan found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Findings {
    /// Tenant objects without a super copy.
    pub missing: usize,
    /// Super copies that differ from their tenant object.
    pub drifted: usize,
    /// Super objects whose tenant object is gone.
    pub orphaned: usize,
    /// vNodes to look at again.
    pub stale_vnodes: usize,
    /// Status that did not reach the tenant.
    pub status: usize,
    /// Pods waiting for quota, queued to be admitted again (a safety net: they are also queued when a pod
    /// of their tenant ends and when the tenant's quota changes).
    pub quota_waiting: usize,
}

impl std::ops::AddAssign for Findings {
    fn add_assign(&mut self, other: Self) {
        self.missing += other.missing;
        self.drifted += other.drifted;
        self.orphaned += other.orphaned;
        self.stale_vnodes += other.stale_vnodes;
        self.status += other.status;
        self.quota_waiting += other.quota_waiting;
    }
}

fn found(ctx: &Context, resource: &'static str, finding: &'static str) {
    let labels = PatrolLabels { resource, finding };
    ctx.metrics.patrol_findings.get_or_create(&labels).inc();
    ctx.metrics.patrol_remedies.get_or_create(&labels).inc();
}

/// Runs a scan every `config.patrol_interval`.
pub async fn run(ctx: Arc<Context>) {
    let mut tick = tokio::time::interval(ctx.config.patrol_interval);
    tick.tick().await;
    loop {
        tick.tick().await;
        let findings = scan(&ctx).await;
        tracing::info!(
            missing = findings.missing,
            drifted = findings.drifted,
            orphaned = findings.orphaned,
            stale_vnodes = findings.stale_vnodes,
            status = findings.status,
            quota_waiting = findings.quota_waiting,
            "patrol done"
        );
    }
}

/// Compares every attached tenant with the super cluster once and queues repairs.
pub async fn scan(ctx: &Context) -> Findings {
    let started = Instant::now();
    let mut findings = Findings::default();
    for tenant in ctx.tenants.all() {
        if !tenant.is_ready() {
            continue;
        }
        findings += scan_namespaces(ctx, &tenant);
        findings += scan_kind::<ServiceAccount>(ctx, &tenant);
        findings += scan_kind::<ConfigMap>(ctx, &tenant);
        findings += scan_kind::<Secret>(ctx, &tenant);
        findings += scan_kind::<Service>(ctx, &tenant);
        findings += scan_kind::<Endpoints>(ctx, &tenant);
        findings += scan_kind::<PersistentVolumeClaim>(ctx, &tenant);
        if ctx.config.sync_ingresses {
            findings += scan_kind::<Ingress>(ctx, &tenant);
        }
        findings += scan_kind::<NetworkPolicy>(ctx, &tenant);
        findings += scan_kind::<PodDisruptionBudget>(ctx, &tenant);
        findings += scan_pods(ctx, &tenant);
        findings += scan_vnodes(ctx, &tenant);
    }
    findings.orphaned += remove_orphaned_tenants(ctx).await;
    ctx.metrics
        .patrol_duration
        .observe(started.elapsed().as_secs_f64());
    findings
}

/// Super objects of one tenant, by tenant namespace and name.
fn super_objects<K: Resource + Clone>(
    objects: Vec<Arc<K>>,
    cluster_key: &str,
) -> HashMap<(String, String), Arc<K>> {
    objects
        .into_iter()
        .filter(|o| identity::belongs_to(o.meta(), cluster_key))
        .filter_map(|o| {
            let namespace = identity::tenant_namespace(o.meta())?.to_owned();
            Some(((namespace, o.meta().name.clone()?), o))
        })
        .collect()
}

fn scan_namespaces(ctx: &Context, tenant: &Tenant) -> Findings {
    let mut findings = Findings::default();
    let mut supers: HashMap<String, Arc<Namespace>> = ctx
        .supers
        .namespaces
        .state()
        .into_iter()
        .filter(|ns| identity::belongs_to(ns.meta(), &tenant.identity.cluster_key))
        .filter_map(|ns| Some((identity::tenant_namespace(ns.meta())?.to_owned(), ns)))
        .collect();
    for namespace in tenant.stores.namespaces.state() {
        let name = namespace.name_any();
        let live = namespace.meta().deletion_timestamp.is_none();
        match supers.remove(&name) {
            None if live => {
                findings.missing += 1;
                found(ctx, "namespace", "missing");
                ctx.queues.down.add(&tenant.id, DownItem::namespace(&name));
            }
            Some(existing)
                if identity::tenant_uid(existing.meta()) != namespace.uid().as_deref() || !live =>
            {
                findings.drifted += 1;
                found(ctx, "namespace", "drifted");
                ctx.queues.down.add(&tenant.id, DownItem::namespace(&name));
            }
            Some(_) if live && isolation_drifted(ctx, tenant, &name) => {
                findings.drifted += 1;
                found(ctx, "networkpolicy", "drifted");
                ctx.queues.down.add(&tenant.id, DownItem::namespace(&name));
            }
            _ => {}
        }
    }
    for (name, namespace) in supers {
        if namespace.meta().deletion_timestamp.is_none() {
            findings.orphaned += 1;
            found(ctx, "namespace", "orphaned");
            ctx.queues.down.add(&tenant.id, DownItem::namespace(&name));
        }
    }
    findings
}

/// Whether the isolating NetworkPolicy of a tenant namespace's super namespace is missing, changed, or
/// there although isolation is off.
fn isolation_drifted(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> bool {
    let super_namespace = tenant.identity.super_namespace(tenant_namespace);
    let existing = ctx.supers.network_policies.get(
        &kube::runtime::reflector::ObjectRef::new(network::ISOLATION_POLICY_NAME).within(&super_namespace),
    );
    match (ctx.config.network_isolation.enabled, existing) {
        (true, None) => true,
        (true, Some(existing)) => !network::isolation_in_sync(
            &network::isolation_policy(ctx, tenant, tenant_namespace),
            &existing,
        ),
        (false, existing) => existing.is_some_and(|e| network::isolates(e.meta()).is_some()),
    }
}

fn scan_kind<K: Downward>(ctx: &Context, tenant: &Tenant) -> Findings {
    let mut findings = Findings::default();
    let (Some(tenant_store), Some(super_store)) =
        (K::tenant_store(&tenant.stores), K::super_store(&ctx.supers))
    else {
        return findings;
    };
    let resource = K::KIND.as_str();
    let mut supers = super_objects(super_store.state(), &tenant.identity.cluster_key);
    // Token Secrets belong to their pods, not to a tenant Secret.
    supers.retain(|_, o| {
        o.meta()
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(token::ANNOTATION_TOKEN_FOR_POD))
    });
    let settings = tenant.settings();
    let opaque = ctx.opaque_prefixes(&settings.opaque_prefixes);
    for object in tenant_store.state() {
        if object.meta().deletion_timestamp.is_some() {
            continue;
        }
        let namespace = object.namespace().unwrap_or_default();
        let name = object.name_any();
        let super_namespace = tenant.identity.super_namespace(&namespace);
        let cx = Conversion {
            ctx,
            tenant,
            opaque_prefixes: &opaque,
            super_namespace: &super_namespace,
        };
        let Ok(Some(mut desired)) = K::to_super(&object, &cx) else {
            continue;
        };
        identity::stamp(&mut desired, |o| o.meta_mut());
        let finding = match supers.remove(&(namespace.clone(), name.clone())) {
            None => Some("missing"),
            Some(existing) if identity::tenant_uid(existing.meta()) != object.uid().as_deref() => {
                Some("drifted")
            }
            Some(existing) if !in_sync(&desired, &existing) => Some("drifted"),
            Some(existing) => {
                if let Some(up) = K::pending_up(&object, &existing) {
                    findings.status += 1;
                    found(ctx, resource, "status");
                    ctx.queues.up.add(&tenant.id, up);
                }
                None
            }
        };
        match finding {
            Some("missing") => findings.missing += 1,
            Some(_) => findings.drifted += 1,
            None => continue,
        }
        found(ctx, resource, finding.unwrap_or("drifted"));
        ctx.queues
            .down
            .add(&tenant.id, DownItem::new(K::KIND, &namespace, &name));
    }
    for ((namespace, name), _) in supers {
        findings.orphaned += 1;
        found(ctx, resource, "orphaned");
        ctx.queues
            .down
            .add(&tenant.id, DownItem::new(K::KIND, &namespace, &name));
    }
    findings
}

fn scan_pods(ctx: &Context, tenant: &Tenant) -> Findings {
    let mut findings = Findings::default();
    let mut supers = super_objects(ctx.supers.pods.state(), &tenant.identity.cluster_key);
    for pod in tenant.stores.pods.state() {
        let namespace = pod.namespace().unwrap_or_default();
        let name = pod.name_any();
        let item = DownItem::new(Kind::Pod, &namespace, &name);
        match supers.remove(&(namespace.clone(), name.clone())) {
            None => {
                let unbound = pod.spec.node_name.is_none();
                let waiting = ctx.quota.is_waiting(&tenant.id, &namespace, &name);
                if pod.meta().deletion_timestamp.is_some() || (unbound && !waiting) {
                    findings.missing += 1;
                    found(ctx, "pod", "missing");
                    ctx.queues.down.add(&tenant.id, item);
                } else if unbound {
                    // Waiting for quota: admission is looked at again (from the cache, without writes
                    // while nothing changed), in case an event that should have woken it was missed.
                    findings.quota_waiting += 1;
                    found(ctx, "pod", "quota-waiting");
                    ctx.queues.down.add(&tenant.id, item);
                }
            }
            Some(existing) if identity::tenant_uid(existing.meta()) != pod.uid().as_deref() => {
                findings.drifted += 1;
                found(ctx, "pod", "drifted");
                ctx.queues.down.add(&tenant.id, item);
            }
            Some(existing) => {
                let bound = pod.spec.node_name.clone();
                let super_node = existing.spec.node_name.clone();
                let super_phase = existing.phase();
                let tenant_phase = pod.status.phase.clone();
                if (super_node.is_some() && bound.is_none()) || super_phase != tenant_phase {
                    findings.status += 1;
                    found(ctx, "pod", "status");
                    ctx.queues.up.add(&tenant.id, UpItem::Pod { namespace, name });
                }
            }
        }
    }
    for ((namespace, name), _) in supers {
        findings.orphaned += 1;
        found(ctx, "pod", "orphaned");
        ctx.queues
            .down
            .add(&tenant.id, DownItem::new(Kind::Pod, &namespace, &name));
    }
    findings
}

fn scan_vnodes(ctx: &Context, tenant: &Tenant) -> Findings {
    let mut findings = Findings::default();
    let used: std::collections::HashSet<String> = tenant
        .stores
        .pods
        .state()
        .iter()
        .filter_map(|p| p.spec.node_name.clone())
        .collect();
    for vnode in tenant.stores.vnodes.state() {
        let name = vnode.name_any();
        let super_node = ctx
            .supers
            .nodes
            .get(&kube::runtime::reflector::ObjectRef::new(&name));
        let wanted = super_node
            .as_ref()
            .is_some_and(|node| crate::resources::vnode::wanted(ctx, tenant, node));
        if super_node.is_none() || (!used.contains(&name) && !wanted) {
            findings.stale_vnodes += 1;
            found(ctx, "node", "stale-vnode");
            ctx.queues.up.add(&tenant.id, UpItem::Node { name });
        }
    }
    // Nodes the tenant should see but does not (outside `pods` mode).
    for node in ctx.supers.nodes.state() {
        let name = node.name_any();
        let missing = tenant
            .stores
            .vnodes
            .get(&kube::runtime::reflector::ObjectRef::new(&name))
            .is_none();
        if missing && crate::resources::vnode::wanted(ctx, tenant, &node) {
            findings.stale_vnodes += 1;
            found(ctx, "node", "missing-vnode");
            ctx.queues.up.add(&tenant.id, UpItem::Node { name });
        }
    }
    findings
}

/// Deletes super namespaces of tenants whose VirtualCluster no longer exists.
async fn remove_orphaned_tenants(ctx: &Context) -> usize {
    attach::delete_namespaces(ctx, |namespace| {
        let orphaned = attach::orphaned(ctx, namespace);
        if orphaned {
            found(ctx, "namespace", "orphaned-tenant");
        }
        orphaned
    })
    .await
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        cached::TenantPod,
        context::testing::{self, from_json, put},
        quota::Usage,
        settings::TenantSettings,
    };

    fn tenant_pod(name: &str) -> TenantPod {
        from_json(json!({
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}")},
            "spec": {"containers": [{"name": "c", "image": "busybox"}]},
            "status": {"phase": "Pending"}
        }))
    }

    #[tokio::test]
    async fn pods_waiting_for_quota_are_looked_at_again() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let quota = crds::TenantQuota {
            pods: Some(k8s_openapi::apimachinery::pkg::api::resource::Quantity(
                "1".into(),
            )),
            ..Default::default()
        };
        let one = Usage {
            pods: 1,
            ..Default::default()
        };
        assert!(
            ctx.quota
                .admit(&tenant.id, Some(&quota), "ns", "admitted", one)
                .is_ok()
        );
        assert!(
            ctx.quota
                .admit(&tenant.id, Some(&quota), "ns", "waiting", one)
                .is_err()
        );
        put(&mut caches.pods, tenant_pod("admitted"));
        put(&mut caches.pods, tenant_pod("waiting"));

        let findings = scan(&ctx).await;
        // The admitted pod is being created (no copy yet): missing. The waiting one is queued as well.
        assert_eq!((findings.missing, findings.quota_waiting), (1, 1));
        let mut queued = testing::drain_down(&ctx).await;
        queued.sort_by(|a, b| a.name.cmp(&b.name));
        assert_eq!(
            queued,
            [
                DownItem::new(Kind::Pod, "ns", "admitted"),
                DownItem::new(Kind::Pod, "ns", "waiting")
            ]
        );
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn node_ports_that_did_not_reach_the_tenant_are_queued_up_and_nothing_drifts() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        let tenant_service = |node_port: i32, super_ip: Option<&str>| -> Service {
            let mut service: Service = from_json(json!({
                "metadata": {"name": "web", "namespace": "shop", "uid": "svc-uid", "resourceVersion": "5"},
                "spec": {"type": "NodePort", "clusterIP": "10.32.0.10", "selector": {"app": "web"},
                    "ports": [{"port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": node_port}]}
            }));
            if let Some(ip) = super_ip {
                service.metadata.annotations = Some(
                    [(
                        crds::wellknown::ANNOTATION_SUPER_CLUSTER_IP.to_owned(),
                        ip.to_owned(),
                    )]
                    .into(),
                );
            }
            service
        };
        // The super copy as the syncer made it (from the tenant Service with the port its apiserver picked),
        // with the node port and IP the super cluster allocated.
        let original = tenant_service(30080, None);
        let super_namespace = tenant.identity.super_namespace("shop");
        let opaque = ctx.opaque_prefixes(&[]);
        let cx = Conversion {
            ctx: &ctx,
            tenant: &tenant,
            opaque_prefixes: &opaque,
            super_namespace: &super_namespace,
        };
        let mut copy = Service::to_super(&original, &cx)
            .expect("convert")
            .expect("synced");
        identity::stamp(&mut copy, |o| o.meta_mut());
        let spec = copy.spec.as_mut().expect("spec");
        spec.cluster_ip = Some("10.96.0.9".into());
        spec.ports.as_mut().expect("ports")[0].node_port = Some(31000);
        put(&mut super_caches.services, copy);

        put(&mut caches.services, original);
        let findings = scan(&ctx).await;
        assert_eq!(
            findings,
            Findings {
                status: 1,
                ..Default::default()
            }
        );
        assert!(testing::drain_down(&ctx).await.is_empty());
        assert_eq!(
            testing::drain_up(&ctx).await,
            [UpItem::Service {
                namespace: "shop".into(),
                name: "web".into()
            }]
        );

        // Once the tenant Service shows them, the patrol finds nothing: the copied-up values do not make the
        // super copy drift either.
        put(&mut caches.services, tenant_service(31000, Some("10.96.0.9")));
        assert_eq!(scan(&ctx).await, Findings::default());
        assert!(testing::drain_down(&ctx).await.is_empty());
        assert!(testing::drain_up(&ctx).await.is_empty());
        supers.idle().await;
        tenants.idle().await;
    }
}
