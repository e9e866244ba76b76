//! Status flowing up: pods (binding, status, completed deletions), services (super cluster IP, node ports,
//! status) and claims (status), plus the labels and annotations under the tenant's transparent prefixes.

use std::collections::BTreeMap;

use crds::wellknown::ANNOTATION_SUPER_CLUSTER_IP;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodStatus, Service, ServicePort, ServiceSpec};
use kube::{
    Api, Resource, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::reflector::ObjectRef,
};
use serde::{Serialize, de::DeserializeOwned};

use super::{Outcome, kinds::needs_node_ports, pod::finalize_tenant_pod, vnode};
use crate::{
    cached::{CachedCondition, POD_SCHEDULED, TenantPodStatus, container_statuses_hash},
    context::Context,
    error::{Result, on_tenant},
    events, identity,
    tenant::Tenant,
};

fn params() -> PatchParams {
    PatchParams::apply(crds::wellknown::FIELD_MANAGER_SYNCER).force()
}

/// The super copy of a tenant object, if it exists and was made from this very tenant object.
fn matching_super<K: Resource + Clone>(
    super_object: Option<std::sync::Arc<K>>,
    tenant: &Tenant,
    tenant_uid: Option<String>,
) -> Option<std::sync::Arc<K>> {
    super_object.filter(|s| {
        identity::belongs_to(s.meta(), &tenant.identity.cluster_key)
            && identity::tenant_uid(s.meta()) == tenant_uid.as_deref()
    })
}

/// Applies `labels`/`annotations` under the transparent prefixes onto a tenant object, if missing.
async fn transparent<K>(
    ctx: &Context,
    tenant: &Tenant,
    tenant_meta: &ObjectMeta,
    super_meta: &ObjectMeta,
) -> Result<u32>
where
    K: Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + Serialize
        + DeserializeOwned
        + std::fmt::Debug
        + Default,
{
    let prefixes = tenant.settings().transparent_prefixes.clone();
    if prefixes.is_empty() {
        return Ok(0);
    }
    let (labels, annotations) = identity::transparent_metadata(super_meta, &prefixes);
    let present = |want: &BTreeMap<String, String>, have: &Option<BTreeMap<String, String>>| {
        want.iter()
            .all(|(k, v)| have.as_ref().and_then(|h| h.get(k)) == Some(v))
    };
    if present(&labels, &tenant_meta.labels) && present(&annotations, &tenant_meta.annotations) {
        return Ok(0);
    }
    let name = tenant_meta.name.clone().unwrap_or_default();
    let mut patch = K::default();
    *patch.meta_mut() = ObjectMeta {
        name: Some(name.clone()),
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    };
    let api: Api<K> = Api::namespaced(
        tenant.client.clone(),
        tenant_meta.namespace.as_deref().unwrap_or_default(),
    );
    api.patch(
        &name,
        &PatchParams::apply(TRANSPARENT_MANAGER).force(),
        &Patch::Apply(&patch),
    )
    .await
    .map_err(on_tenant(
        &tenant.identity.cluster_key,
        format!("copying transparent metadata to {name}"),
    ))?;
    ctx.metrics.tenant_write(super::kind_label::<K>(), "apply");
    Ok(1)
}

/// A manager of its own for copied-up metadata, so that applying it never drops what the syncer applies
/// to the same object's status.
const TRANSPARENT_MANAGER: &str = "vc-syncer-transparent";

/// The tenant pod's status as the super pod reports it; condition types the tenant's own controllers
/// manage (readiness gates) stay theirs.
fn status_from_super(super_status: PodStatus, gates: &[String]) -> PodStatus {
    PodStatus {
        phase: super_status.phase,
        message: super_status.message,
        reason: super_status.reason,
        host_ip: super_status.host_ip,
        pod_ip: super_status.pod_ip,
        pod_ips: super_status.pod_ips,
        start_time: super_status.start_time,
        conditions: super_status
            .conditions
            .map(|cs| cs.into_iter().filter(|c| !gates.contains(&c.type_)).collect()),
        container_statuses: super_status.container_statuses,
        init_container_statuses: super_status.init_container_statuses,
        ephemeral_container_statuses: super_status.ephemeral_container_statuses,
        ..Default::default()
    }
}

/// Whether every field of `want` is already on the cached tenant status.
fn status_matches(want: &PodStatus, have: &TenantPodStatus) -> bool {
    let conditions_present = want.conditions.iter().flatten().all(|w| {
        have.conditions
            .iter()
            .any(|h| h.type_ == w.type_ && h.status == w.status && h.reason == w.reason)
    });
    want.phase == have.phase
        && want.pod_ip == have.pod_ip
        && want.host_ip == have.host_ip
        && want.message == have.message
        && want.reason == have.reason
        && container_statuses_hash(want.container_statuses.as_deref().unwrap_or_default())
            == have.container_statuses
        && container_statuses_hash(want.init_container_statuses.as_deref().unwrap_or_default())
            == have.init_container_statuses
        && conditions_present
}

/// A tenant pod's status after its binding: the apiserver sets `PodScheduled=True` (no reason) itself, as
/// for any bound pod, so a super status that says no more than that costs no status write of its own.
fn bound_status(before: &TenantPodStatus) -> TenantPodStatus {
    let mut status = before.clone();
    status.conditions.retain(|c| c.type_ != POD_SCHEDULED);
    status.conditions.push(CachedCondition {
        type_: POD_SCHEDULED.to_owned(),
        status: "True".to_owned(),
        reason: None,
        message: None,
    });
    status
}

/// Syncs one tenant pod up: binding to a vNode, status, completed deletion.
pub async fn pod(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str) -> Result<Outcome> {
    let Some(tenant_pod) = tenant.stores.pods.get(&ObjectRef::new(name).within(namespace)) else {
        return Ok(Outcome::InSync);
    };
    let super_namespace = tenant.identity.super_namespace(namespace);
    let super_pod = ctx
        .supers
        .pods
        .get(&ObjectRef::new(name).within(&super_namespace));
    let Some(super_pod) = matching_super(super_pod, tenant, tenant_pod.uid()) else {
        if tenant_pod.meta().deletion_timestamp.is_some() {
            finalize_tenant_pod(ctx, tenant, tenant_pod.meta()).await?;
            return Ok(Outcome::Deleted);
        }
        return Ok(Outcome::InSync);
    };
    let mut writes = 0;
    let api: Api<Pod> = Api::namespaced(tenant.client.clone(), namespace);

    let mut bound = false;
    let tenant_node = &tenant_pod.spec.node_name;
    let super_node = &super_pod.spec.node_name;
    if let (None, Some(node), None) = (tenant_node, super_node, &tenant_pod.meta().deletion_timestamp) {
        writes += vnode::ensure(ctx, tenant, node).await?;
        let binding = serde_json::json!({
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": { "name": name, "uid": tenant_pod.uid() },
            "target": { "apiVersion": "v1", "kind": "Node", "name": node },
        });
        ctx.metrics.tenant_write("pod", "bind");
        match api
            .create_subresource::<_, serde_json::Value>("binding", name, &PostParams::default(), &binding)
            .await
        {
            Ok(_) => {
                writes += 1;
                bound = true;
            }
            // Bound meanwhile (409) or gone (404): the next event shows the current state.
            Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {}
            Err(e) => {
                return Err(on_tenant(
                    &tenant.identity.cluster_key,
                    format!("binding pod {namespace}/{name} to {node}"),
                )(e));
            }
        }
    }

    if let Some(super_status) = super_pod.parsed_status() {
        let want = status_from_super(super_status, &tenant_pod.spec.readiness_gates);
        let after_binding;
        let have = if bound {
            after_binding = bound_status(&tenant_pod.status);
            &after_binding
        } else {
            &tenant_pod.status
        };
        if !status_matches(&want, have) {
            let patch = Pod {
                metadata: ObjectMeta {
                    name: Some(name.to_owned()),
                    ..Default::default()
                },
                spec: None,
                status: Some(want),
            };
            ctx.metrics.tenant_write("pod", "status");
            match api.patch_status(name, &params(), &Patch::Apply(&patch)).await {
                Ok(_) => writes += 1,
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => {
                    return Err(on_tenant(
                        &tenant.identity.cluster_key,
                        format!("updating status of pod {namespace}/{name}"),
                    )(e));
                }
            }
        }
    }
    writes += transparent::<Pod>(ctx, tenant, tenant_pod.meta(), super_pod.meta()).await?;
    Ok(match writes {
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}

/// What the upward sync keeps on a tenant Service's main resource: the super cluster IP as an annotation,
/// and the node ports the super cluster allocated (those are the ones open on the nodes). Applied whole
/// under one field manager: whatever an apply leaves out that the manager set before would be removed.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceUp {
    /// The super cluster IP.
    pub super_ip: Option<String>,
    /// Ports as `{port, protocol, nodePort}`, for the tenant ports the super Service has under the same
    /// name, port and protocol.
    pub node_ports: Vec<ServicePort>,
}

fn port_key(port: &ServicePort) -> (&str, i32, &str) {
    (
        port.name.as_deref().unwrap_or_default(),
        port.port,
        port.protocol.as_deref().unwrap_or("TCP"),
    )
}

/// What `tenant` should carry of `super_service`.
pub fn service_up(tenant: &Service, super_service: &Service) -> ServiceUp {
    // An ExternalName Service has no cluster IP: its super stub's `None` is not one.
    let external_name = tenant.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("ExternalName");
    let super_ip = super_service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty() && !external_name);
    let mut node_ports = Vec::new();
    // Both must have node ports: while a type change has not reached the super Service, its ports are not
    // the tenant's to take (and a tenant Service without node ports refuses them).
    if needs_node_ports(tenant.spec.as_ref()) && needs_node_ports(super_service.spec.as_ref()) {
        let super_ports = super_service.spec.as_ref().and_then(|s| s.ports.as_ref());
        for port in tenant
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .into_iter()
            .flatten()
        {
            let allocated = super_ports
                .into_iter()
                .flatten()
                .find(|p| port_key(p) == port_key(port))
                .and_then(|p| p.node_port)
                .filter(|n| *n != 0);
            if let Some(node_port) = allocated {
                node_ports.push(ServicePort {
                    port: port.port,
                    protocol: Some(port_key(port).2.to_owned()),
                    node_port: Some(node_port),
                    ..Default::default()
                });
            }
        }
    }
    ServiceUp { super_ip, node_ports }
}

/// Whether `tenant` lacks some of `wanted`.
fn lacks(tenant: &Service, wanted: &ServiceUp) -> bool {
    let ip_missing = wanted
        .super_ip
        .as_ref()
        .is_some_and(|ip| tenant.annotations().get(ANNOTATION_SUPER_CLUSTER_IP) != Some(ip));
    let ports = tenant.spec.as_ref().and_then(|s| s.ports.as_ref());
    let port_missing = wanted.node_ports.iter().any(|want| {
        !ports.into_iter().flatten().any(|have| {
            have.port == want.port && port_key(have).2 == port_key(want).2 && have.node_port == want.node_port
        })
    });
    ip_missing || port_missing
}

/// Whether the tenant Service lacks something of its super copy that the upward sync writes (for the
/// patrol). The super copy must be the tenant Service's.
pub fn service_pending(tenant: &Service, super_service: &Service) -> bool {
    lacks(tenant, &service_up(tenant, super_service))
}

/// Applies `wanted` to tenant Service `name`. Node ports are written only onto the version of the tenant
/// Service they were matched against (`resource_version`): applied to a newer one whose ports changed,
/// they could add a port entry the tenant does not have.
async fn apply_service_up(
    api: &Api<Service>,
    name: &str,
    wanted: &ServiceUp,
    resource_version: Option<String>,
) -> kube::Result<()> {
    let with_ports = !wanted.node_ports.is_empty();
    let patch = Service {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            resource_version: resource_version.filter(|_| with_ports),
            annotations: wanted
                .super_ip
                .clone()
                .map(|ip| [(ANNOTATION_SUPER_CLUSTER_IP.to_owned(), ip)].into()),
            ..Default::default()
        },
        spec: with_ports.then(|| ServiceSpec {
            ports: Some(wanted.node_ports.clone()),
            ..Default::default()
        }),
        status: None,
    };
    api.patch(name, &params(), &Patch::Apply(&patch))
        .await
        .map(|_| ())
}

/// Reason of the event on a tenant Service whose super node ports its apiserver refuses.
pub const REASON_NODE_PORT_NOT_COPIED: &str = "NodePortNotCopied";

/// Syncs one tenant service up: the super cluster IP as an annotation, the super cluster's node ports, and
/// the load-balancer status.
pub async fn service(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str) -> Result<Outcome> {
    let Some(tenant_service) = tenant
        .stores
        .services
        .get(&ObjectRef::new(name).within(namespace))
    else {
        return Ok(Outcome::InSync);
    };
    let super_namespace = tenant.identity.super_namespace(namespace);
    let super_service = ctx
        .supers
        .services
        .get(&ObjectRef::new(name).within(&super_namespace));
    let Some(super_service) = matching_super(super_service, tenant, tenant_service.uid()) else {
        return Ok(Outcome::InSync);
    };
    let api: Api<Service> = Api::namespaced(tenant.client.clone(), namespace);
    let mut writes = 0;
    let mut refused = None;
    let wanted = service_up(&tenant_service, &super_service);
    if lacks(&tenant_service, &wanted) {
        ctx.metrics.tenant_write("service", "apply");
        let resource_version = tenant_service.resource_version();
        match apply_service_up(&api, name, &wanted, resource_version).await {
            Ok(()) => writes += 1,
            // The tenant apiserver refuses a node port: outside its --service-node-port-range, or held by
            // another of its Services (which gets its own super value in turn). The patrol tries again.
            Err(kube::Error::Api(status))
                if status.code == 422
                    && !wanted.node_ports.is_empty()
                    && status.message.contains("nodePort") =>
            {
                tracing::info!(tenant = %tenant.identity.vc_ref(), service = %format!("{namespace}/{name}"), message = %status.message, "the tenant refuses the super cluster's node ports");
                events::warn(
                    tenant,
                    &tenant_service.object_ref(&()),
                    REASON_NODE_PORT_NOT_COPIED,
                    &format!(
                        "the node ports open on the nodes for this Service could not be recorded on it: {}",
                        status.message
                    ),
                )
                .await;
                let without_ports = ServiceUp {
                    node_ports: Vec::new(),
                    ..wanted.clone()
                };
                if lacks(&tenant_service, &without_ports) {
                    ctx.metrics.tenant_write("service", "apply");
                    apply_service_up(&api, name, &without_ports, None)
                        .await
                        .map_err(on_tenant(
                            &tenant.identity.cluster_key,
                            format!("annotating service {namespace}/{name}"),
                        ))?;
                    writes += 1;
                }
                refused = Some(status.message.clone());
            }
            Err(error) => {
                return Err(on_tenant(
                    &tenant.identity.cluster_key,
                    format!("updating service {namespace}/{name} from its super copy"),
                )(error));
            }
        }
    }
    let load_balancer = super_service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.clone());
    let current = tenant_service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.clone());
    if load_balancer
        .as_ref()
        .and_then(|l| l.ingress.as_ref())
        .is_some_and(|i| !i.is_empty())
        && load_balancer != current
    {
        let patch = Service {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            status: Some(k8s_openapi::api::core::v1::ServiceStatus {
                load_balancer,
                conditions: None,
            }),
            ..Default::default()
        };
        api.patch_status(name, &params(), &Patch::Apply(&patch))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("updating status of service {namespace}/{name}"),
            ))?;
        ctx.metrics.tenant_write("service", "status");
        writes += 1;
    }
    writes += transparent::<Service>(ctx, tenant, tenant_service.meta(), super_service.meta()).await?;
    if let Some(reason) = refused {
        return Ok(Outcome::Waiting {
            reason: format!("the tenant refuses the super cluster's node ports: {reason}"),
            retry_after: None,
        });
    }
    Ok(match writes {
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}

/// Syncs one tenant claim up: its status as the super claim reports it.
pub async fn claim(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str) -> Result<Outcome> {
    let Some(tenant_claim) = tenant.stores.claims.get(&ObjectRef::new(name).within(namespace)) else {
        return Ok(Outcome::InSync);
    };
    let super_namespace = tenant.identity.super_namespace(namespace);
    let super_claim = ctx
        .supers
        .claims
        .get(&ObjectRef::new(name).within(&super_namespace));
    let Some(super_claim) = matching_super(super_claim, tenant, tenant_claim.uid()) else {
        return Ok(Outcome::InSync);
    };
    let Some(status) = super_claim.status.clone() else {
        return Ok(Outcome::InSync);
    };
    let current = tenant_claim.status.clone().unwrap_or_default();
    let mut writes = 0;
    if status.phase != current.phase
        || status.capacity != current.capacity
        || status.access_modes != current.access_modes
    {
        let patch = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            spec: None,
            status: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
                phase: status.phase,
                capacity: status.capacity,
                access_modes: status.access_modes,
                conditions: status.conditions,
                ..Default::default()
            }),
        };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(tenant.client.clone(), namespace);
        api.patch_status(name, &params(), &Patch::Apply(&patch))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("updating status of claim {namespace}/{name}"),
            ))?;
        ctx.metrics.tenant_write("persistentvolumeclaim", "status");
        writes += 1;
    }
    writes +=
        transparent::<PersistentVolumeClaim>(ctx, tenant, tenant_claim.meta(), super_claim.meta()).await?;
    Ok(match writes {
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::json;

    use super::*;
    use crate::{
        context::testing::{self, from_json, put},
        settings::TenantSettings,
    };

    const SUPER_IP: &str = "10.96.0.9";

    fn tenant_service(type_: &str, ports: serde_json::Value, super_ip: Option<&str>) -> Service {
        let mut service: Service = from_json(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "svc-uid", "resourceVersion": "5"},
            "spec": {"type": type_, "clusterIP": "10.32.0.10", "selector": {"app": "web"}, "ports": ports}
        }));
        if let Some(ip) = super_ip {
            service.metadata.annotations =
                Some([(ANNOTATION_SUPER_CLUSTER_IP.to_owned(), ip.to_owned())].into());
        }
        service
    }

    fn super_service(ports: serde_json::Value) -> Service {
        from_json(json!({
            "metadata": {"name": "web", "namespace": "team-abc123-vc-shop", "uid": "super-uid",
                "annotations": {"tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/uid": "svc-uid",
                    "tenancy.x-k8s.io/namespace": "shop"}},
            "spec": {"type": "NodePort", "clusterIP": SUPER_IP, "selector": {"app": "web"}, "ports": ports}
        }))
    }

    const APPLY: &str = "/api/v1/namespaces/shop/services/web?&force=true&fieldManager=vc-syncer";

    /// A tenant pod on no node yet and its super copy, bound to `node-1` (a vNode the tenant already has),
    /// with `status`.
    fn bound_below(
        status: serde_json::Value,
    ) -> (Context, Arc<Tenant>, testing::ApiServer, testing::ApiServer) {
        let (super_client, supers) = testing::mock();
        let (tenant_client, tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        put(
            &mut caches.pods,
            from_json(json!({
                "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid"},
                "spec": {"containers": [{"name": "app", "image": "nginx"}]},
                "status": {"phase": "Pending", "qosClass": "BestEffort"}
            })),
        );
        put(
            &mut super_caches.pods,
            from_json(json!({
                "metadata": {"name": "web", "namespace": "team-abc123-vc-shop", "uid": "super-pod-uid",
                    "annotations": {"tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/uid": "pod-uid",
                        "tenancy.x-k8s.io/namespace": "shop"}},
                "spec": {"nodeName": "node-1", "containers": [{"name": "app", "image": "nginx"}]},
                "status": status
            })),
        );
        put(
            &mut caches.vnodes,
            from_json(json!({"metadata": {"name": "node-1"}})),
        );
        (ctx, tenant, supers, tenants)
    }

    /// `pod`, failing instead of hanging when it makes a request the test does not answer.
    async fn sync_pod(ctx: &Context, tenant: &Tenant) -> Result<Outcome> {
        tokio::time::timeout(std::time::Duration::from_secs(5), pod(ctx, tenant, "shop", "web"))
            .await
            .expect("pod sync made a request the test did not expect")
    }

    const BINDING: &str = "/api/v1/namespaces/shop/pods/web/binding?";
    const POD_STATUS: &str = "/api/v1/namespaces/shop/pods/web/status?&force=true&fieldManager=vc-syncer";

    #[tokio::test]
    async fn binding_alone_carries_a_scheduled_status() {
        let (ctx, tenant, mut supers, mut tenants) = bound_below(json!({
            "phase": "Pending", "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-11-23T10:00:00Z"}]
        }));
        let (outcome, binding) = tokio::join!(sync_pod(&ctx, &tenant), async {
            let call = tenants.expect("POST", BINDING).await;
            let body = call.body.clone();
            call.respond(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
            );
            body
        });
        // The binding sets PodScheduled=True in the tenant; a status apply on top would write nothing new.
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        assert_eq!(
            binding["target"],
            json!({"apiVersion": "v1", "kind": "Node", "name": "node-1"})
        );
        assert_eq!(binding["metadata"]["uid"], json!("pod-uid"));
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn binding_and_a_running_status_are_both_written() {
        let (ctx, tenant, mut supers, mut tenants) = bound_below(json!({
            "phase": "Running", "hostIP": "192.168.0.7", "podIP": "10.244.1.9", "qosClass": "BestEffort",
            "conditions": [{"type": "PodScheduled", "status": "True"}, {"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "app", "image": "nginx", "imageID": "", "ready": true, "restartCount": 0,
                "state": {"running": {"startedAt": "2026-11-23T10:00:01Z"}}}]
        }));
        let (outcome, status) = tokio::join!(sync_pod(&ctx, &tenant), async {
            tenants.expect("POST", BINDING).await.respond(
                201,
                &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}),
            );
            tenants.expect("PATCH", POD_STATUS).await.echo()
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 2 });
        assert_eq!(status["status"]["phase"], json!("Running"));
        assert_eq!(status["status"]["podIP"], json!("10.244.1.9"));
        assert_eq!(status["status"]["conditions"][1]["type"], json!("Ready"));
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn a_pod_bound_meanwhile_gets_its_status_from_the_cache_comparison() {
        // 409: someone bound it already; nothing is assumed about its status, which is written.
        let (ctx, tenant, mut supers, mut tenants) = bound_below(json!({
            "phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}]
        }));
        let (outcome, _) = tokio::join!(sync_pod(&ctx, &tenant), async {
            tenants.expect("POST", BINDING).await.fail(
                409,
                "Conflict",
                "pod web is already assigned to node node-1",
            );
            tenants.expect("PATCH", POD_STATUS).await.echo()
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        supers.idle().await;
        tenants.idle().await;
    }

    #[test]
    fn node_ports_are_matched_by_name_port_and_protocol() {
        let tenant = tenant_service(
            "NodePort",
            json!([{"name": "http", "port": 80, "nodePort": 30001}, {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 30002},
                {"name": "new", "port": 8080, "nodePort": 30003}]),
            None,
        );
        // The super copy lists them in another order and does not have the new port yet.
        let copy = super_service(json!([
            {"name": "dns", "port": 53, "protocol": "UDP", "nodePort": 31002},
            {"name": "http", "port": 80, "protocol": "TCP", "nodePort": 31001}
        ]));
        let wanted = service_up(&tenant, &copy);
        assert_eq!(wanted.super_ip.as_deref(), Some(SUPER_IP));
        let ports: Vec<(i32, Option<&str>, Option<i32>)> = wanted
            .node_ports
            .iter()
            .map(|p| (p.port, p.protocol.as_deref(), p.node_port))
            .collect();
        assert_eq!(
            ports,
            [(80, Some("TCP"), Some(31001)), (53, Some("UDP"), Some(31002))]
        );
        assert!(lacks(&tenant, &wanted));

        // A tenant Service that no longer has node ports takes none (its type change is on its way down).
        let cluster_ip = tenant_service("ClusterIP", json!([{"name": "http", "port": 80}]), Some(SUPER_IP));
        assert_eq!(
            service_up(&cluster_ip, &copy),
            ServiceUp {
                super_ip: Some(SUPER_IP.into()),
                node_ports: Vec::new()
            }
        );
        assert!(!service_pending(&cluster_ip, &copy));
    }

    #[tokio::test]
    async fn the_super_node_ports_are_written_into_the_tenant_service_once() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        put(
            &mut super_caches.services,
            super_service(json!([{"port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 31000}])),
        );
        // The tenant apiserver picked 30080; the super cluster allocated 31000.
        put(
            &mut caches.services,
            tenant_service(
                "NodePort",
                json!([{"port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 30080}]),
                None,
            ),
        );
        let (outcome, call) = tokio::join!(service(&ctx, &tenant, "shop", "web"), async {
            let call = tenants.expect("PATCH", APPLY).await;
            let body = call.body.clone();
            call.respond(200, &body);
            body
        });
        assert_eq!(outcome.expect("synced"), Outcome::Updated { writes: 1 });
        assert_eq!(
            call,
            json!({"apiVersion": "v1", "kind": "Service",
                "metadata": {"name": "web", "resourceVersion": "5", "annotations": {(ANNOTATION_SUPER_CLUSTER_IP): SUPER_IP}},
                "spec": {"ports": [{"port": 80, "protocol": "TCP", "nodePort": 31000}]}})
        );

        // With the values in place nothing is written again (the tenant's own write comes back as an
        // event and queues the service once more).
        put(
            &mut caches.services,
            tenant_service(
                "NodePort",
                json!([{"port": 80, "protocol": "TCP", "targetPort": 8080, "nodePort": 31000}]),
                Some(SUPER_IP),
            ),
        );
        assert_eq!(
            service(&ctx, &tenant, "shop", "web").await.expect("synced"),
            Outcome::InSync
        );
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn a_node_port_the_tenant_refuses_is_reported_and_the_ip_still_copied() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        put(
            &mut super_caches.services,
            super_service(json!([{"port": 80, "protocol": "TCP", "nodePort": 31000}])),
        );
        put(
            &mut caches.services,
            tenant_service(
                "NodePort",
                json!([{"port": 80, "protocol": "TCP", "nodePort": 30080}]),
                None,
            ),
        );
        let (outcome, ()) = tokio::join!(service(&ctx, &tenant, "shop", "web"), async {
            tenants.expect("PATCH", APPLY).await.fail(
                422,
                "Invalid",
                "Service \"web\" is invalid: spec.ports[0].nodePort: Invalid value: 31000: provided port is already allocated",
            );
            let event = tenants
                .expect("POST", "/apis/events.k8s.io/v1/namespaces/shop/events")
                .await;
            assert_eq!(event.body["reason"], REASON_NODE_PORT_NOT_COPIED);
            assert_eq!(event.body["type"], "Warning");
            event.echo();
            let call = tenants.expect("PATCH", APPLY).await;
            assert_eq!(
                call.body,
                json!({"apiVersion": "v1", "kind": "Service",
                    "metadata": {"name": "web", "annotations": {(ANNOTATION_SUPER_CLUSTER_IP): SUPER_IP}}})
            );
            call.echo();
        });
        assert!(
            matches!(
                outcome.expect("synced"),
                Outcome::Waiting {
                    retry_after: None,
                    ..
                }
            ),
            "the patrol tries again"
        );
        supers.idle().await;
        tenants.idle().await;
    }
}
