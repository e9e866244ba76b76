//! Status flowing up: pods (binding, status, completed deletions), services (super cluster IP, status) and
//! claims (status), plus the labels and annotations under the tenant's transparent prefixes.

use std::collections::BTreeMap;

use crds::wellknown::ANNOTATION_SUPER_CLUSTER_IP;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, PodStatus, Service};
use kube::{
    Api, Resource, ResourceExt,
    api::{ObjectMeta, Patch, PatchParams, PostParams},
    runtime::reflector::ObjectRef,
};
use serde::{Serialize, de::DeserializeOwned};

use super::{Outcome, pod::finalize_tenant_pod, vnode};
use crate::{
    cached::{TenantPodStatus, container_statuses_hash},
    context::Context,
    error::{Result, on_tenant},
    identity,
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
            Ok(_) => writes += 1,
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
        if !status_matches(&want, &tenant_pod.status) {
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

/// Syncs one tenant service up: the super cluster IP as an annotation, and the load-balancer status.
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
    let super_ip = super_service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .filter(|ip| !ip.is_empty());
    if let Some(ip) = super_ip
        && tenant_service.annotations().get(ANNOTATION_SUPER_CLUSTER_IP) != Some(&ip)
    {
        let patch = Service {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                annotations: Some([(ANNOTATION_SUPER_CLUSTER_IP.to_owned(), ip)].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        api.patch(name, &params(), &Patch::Apply(&patch))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("annotating service {namespace}/{name}"),
            ))?;
        ctx.metrics.tenant_write("service", "apply");
        writes += 1;
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
