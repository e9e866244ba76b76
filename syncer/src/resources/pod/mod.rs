//! Tenant pods in the super cluster: creation with admission (policy, quota), updates of the mutable
//! fields, tokens, and deletion in both directions.

pub mod convert;
pub mod token;

use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, PodCondition, PodStatus, Secret};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::reflector::ObjectRef,
};

use super::{Outcome, apply, delete, namespace};
use crate::{
    context::Context,
    error::{Result, on_super, on_tenant},
    events, identity,
    items::{DownItem, Kind},
    tenant::Tenant,
};
use convert::{PodConversion, Refusal, SuperPod, TenantEndpoints};

/// Drops what neither sync direction reads from super pods.
pub fn trim_super(pod: &mut Pod) {
    crate::stores::trim(pod);
}

/// Reason on the tenant pod's PodScheduled condition while its quota holds it back.
pub const REASON_QUOTA_EXCEEDED: &str = "TenantQuotaExceeded";

/// Whether a tenant pod was placed by the syncer (bound after its super pod was scheduled), as opposed to
/// a pod the tenant created with a node name.
fn was_scheduled(pod: &Pod) -> bool {
    let status = pod.status.as_ref();
    status.and_then(|s| s.pod_ip.as_ref()).is_some()
        || status
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|p| p != "Pending")
        || status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "PodScheduled" && c.status == "True"))
}

/// Where the tenant's DNS and apiserver are, from the synced Services; `Err` with a reason while a Service
/// the tenant has is not yet in the super cluster.
fn tenant_endpoints(ctx: &Context, tenant: &Tenant) -> Result<TenantEndpoints, String> {
    let lookup = |namespace: &str, name: &str| -> Result<Option<(String, i32)>, String> {
        if tenant
            .stores
            .services
            .get(&ObjectRef::new(name).within(namespace))
            .is_none()
        {
            return Ok(None);
        }
        let super_namespace = tenant.identity.super_namespace(namespace);
        let service = ctx
            .supers
            .services
            .get(&ObjectRef::new(name).within(&super_namespace))
            .filter(|s| identity::belongs_to(s.meta(), &tenant.identity.cluster_key));
        let spec = service.as_ref().and_then(|s| s.spec.as_ref());
        match spec
            .and_then(|s| s.cluster_ip.clone())
            .filter(|ip| !ip.is_empty() && ip != "None")
        {
            Some(ip) => Ok(Some((
                ip,
                spec.and_then(|s| s.ports.as_ref()?.first().map(|p| p.port))
                    .unwrap_or(443),
            ))),
            None => Err(format!(
                "waiting for the tenant's {namespace}/{name} Service to reach the super cluster"
            )),
        }
    };
    Ok(TenantEndpoints {
        dns_ip: lookup("kube-system", "kube-dns")?.map(|(ip, _)| ip),
        apiserver: lookup("default", "kubernetes")?,
    })
}

fn convert(
    ctx: &Context,
    tenant: &Tenant,
    pod: &Pod,
    endpoints: &TenantEndpoints,
) -> Result<SuperPod, Refusal> {
    let settings = tenant.settings();
    let opaque = ctx.opaque_prefixes(&settings.opaque_prefixes);
    let namespace = pod.namespace().unwrap_or_default();
    let super_namespace = tenant.identity.super_namespace(&namespace);
    let token_secret = token::secret_name(&pod.name_any());
    let cx = PodConversion {
        identity: &tenant.identity,
        opaque_prefixes: &opaque,
        super_namespace: &super_namespace,
        cluster_domain: &settings.cluster_domain,
        runtime_class_name: settings.runtime_class_name.as_deref(),
        pod_policy: &settings.pod_policy,
        endpoints,
        ndots: ctx.config.dns_ndots,
        token_secret: &token_secret,
    };
    convert::to_super(pod, &cx)
}

/// Syncs one tenant pod down.
pub async fn sync(ctx: &Context, tenant: &Tenant, item: &DownItem) -> Result<Outcome> {
    let super_namespace = tenant.identity.super_namespace(&item.namespace);
    let tenant_pod = tenant
        .stores
        .pods
        .get(&ObjectRef::new(&item.name).within(&item.namespace));
    let super_pod = ctx
        .supers
        .pods
        .get(&ObjectRef::new(&item.name).within(&super_namespace));
    let api: Api<Pod> = Api::namespaced(ctx.super_client.clone(), &super_namespace);

    if let Some(existing) = &super_pod
        && !identity::belongs_to(existing.meta(), &tenant.identity.cluster_key)
    {
        return Ok(Outcome::Waiting {
            reason: "the super pod belongs to someone else".into(),
            retry_after: None,
        });
    }
    let Some(tenant_pod) = tenant_pod else {
        ctx.quota.stop_waiting(&tenant.id, &item.namespace, &item.name);
        return match super_pod {
            Some(existing) => {
                delete(ctx, &api, &item.name, existing.uid(), None).await?;
                Ok(Outcome::Deleted)
            }
            None => Ok(Outcome::InSync),
        };
    };
    if let Some(existing) = &super_pod
        && identity::tenant_uid(existing.meta()) != tenant_pod.uid().as_deref()
    {
        // A new tenant pod of the same name: the old super pod goes first.
        delete(ctx, &api, &item.name, existing.uid(), None).await?;
        return Ok(Outcome::Deleted);
    }
    if tenant_pod.meta().deletion_timestamp.is_some() {
        ctx.quota.stop_waiting(&tenant.id, &item.namespace, &item.name);
        return terminate(ctx, tenant, &tenant_pod, super_pod.as_deref(), &api).await;
    }
    match super_pod {
        None if was_scheduled(&tenant_pod) => replace_lost(ctx, tenant, &tenant_pod).await,
        None => create(ctx, tenant, &tenant_pod, &api).await,
        Some(existing) => update(ctx, tenant, &tenant_pod, &existing, &api).await,
    }
}

/// The tenant deletes its pod: the super pod goes with the same grace period; once it is gone, the tenant
/// pod's deletion is completed (what a kubelet does on a real node).
async fn terminate(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &Pod,
    super_pod: Option<&Pod>,
    api: &Api<Pod>,
) -> Result<Outcome> {
    match super_pod {
        Some(existing) if existing.meta().deletion_timestamp.is_none() => {
            let grace = tenant_pod
                .metadata
                .deletion_grace_period_seconds
                .and_then(|g| u32::try_from(g).ok());
            delete(ctx, api, &tenant_pod.name_any(), existing.uid(), grace).await?;
            Ok(Outcome::Deleted)
        }
        Some(_) => Ok(Outcome::Waiting {
            reason: "the super pod is terminating".into(),
            retry_after: None,
        }),
        None => {
            finalize_tenant_pod(ctx, tenant, tenant_pod).await?;
            Ok(Outcome::InSync)
        }
    }
}

/// Completes a tenant pod's deletion.
pub async fn finalize_tenant_pod(ctx: &Context, tenant: &Tenant, tenant_pod: &Pod) -> Result<()> {
    let api: Api<Pod> = Api::namespaced(tenant.client.clone(), &tenant_pod.namespace().unwrap_or_default());
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: tenant_pod.uid(),
            resource_version: None,
        }),
        ..Default::default()
    };
    ctx.metrics.tenant_write("pod", "delete");
    match api.delete(&tenant_pod.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 || s.code == 409 => Ok(()),
        Err(e) => Err(on_tenant(
            &tenant.identity.cluster_key,
            format!(
                "completing deletion of pod {}/{}",
                tenant_pod.namespace().unwrap_or_default(),
                tenant_pod.name_any()
            ),
        )(e)),
    }
}

/// The super pod of a scheduled tenant pod disappeared behind the syncer's back: the tenant pod is deleted
/// so that its controller replaces it, as when a node is lost.
async fn replace_lost(ctx: &Context, tenant: &Tenant, tenant_pod: &Pod) -> Result<Outcome> {
    events::warn(
        tenant,
        &tenant_pod.object_ref(&()),
        "SuperPodLost",
        "the pod's copy in the super cluster was deleted after it was scheduled; deleting the pod so its controller replaces it",
    )
    .await;
    finalize_tenant_pod(ctx, tenant, tenant_pod).await?;
    Ok(Outcome::Waiting {
        reason: "super pod lost; tenant pod deleted".into(),
        retry_after: None,
    })
}

async fn create(ctx: &Context, tenant: &Tenant, tenant_pod: &Pod, api: &Api<Pod>) -> Result<Outcome> {
    let namespace = tenant_pod.namespace().unwrap_or_default();
    let name = tenant_pod.name_any();
    let endpoints = match tenant_endpoints(ctx, tenant) {
        Ok(endpoints) => endpoints,
        Err(reason) => {
            return Ok(Outcome::Waiting {
                reason,
                retry_after: Some(Duration::from_secs(1)),
            });
        }
    };
    let converted = match convert(ctx, tenant, tenant_pod, &endpoints) {
        Ok(converted) => converted,
        Err(refusal) => {
            let reason = match refusal {
                Refusal::NodeNameSet(_) => "NotSupported",
                Refusal::HostAccess(_) => "PodPolicyViolation",
            };
            events::warn(tenant, &tenant_pod.object_ref(&()), reason, &refusal.to_string()).await;
            return Ok(Outcome::Waiting {
                reason: refusal.to_string(),
                retry_after: None,
            });
        }
    };
    let usage = crate::quota::pod_usage(tenant_pod);
    let settings = tenant.settings();
    if let Err(exceeded) = ctx
        .quota
        .admit(&tenant.id, settings.quota.as_ref(), &namespace, &name, usage)
    {
        hold_for_quota(ctx, tenant, tenant_pod, &exceeded.to_string()).await;
        return Ok(Outcome::Waiting {
            reason: exceeded.to_string(),
            retry_after: None,
        });
    }
    match create_admitted(ctx, tenant, tenant_pod, converted, api).await {
        Ok(outcome) => Ok(outcome),
        Err(error) => {
            ctx.quota.release(&tenant.id, &namespace, &name);
            Err(error)
        }
    }
}

async fn create_admitted(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &Pod,
    converted: SuperPod,
    api: &Api<Pod>,
) -> Result<Outcome> {
    let namespace = tenant_pod.namespace().unwrap_or_default();
    let Some(mut writes) = namespace::ensure(ctx, tenant, &namespace).await? else {
        return Ok(namespace::waiting_for_namespace(&namespace));
    };
    // Tokens before the pod: if the tenant cannot issue them, the pod is not created yet.
    let minted = match converted.needs_secret {
        true => Some(
            token::mint(
                tenant,
                tenant_pod,
                &converted.tokens,
                ctx.config.token_ttl_seconds,
            )
            .await?,
        ),
        false => None,
    };
    let mut pod = converted.pod;
    identity::stamp(&mut pod, |p| p.meta_mut());
    let created = apply(ctx, api, pod, None).await?;
    writes += 1;
    if let Some(minted) = minted {
        write_token_secret(ctx, tenant, tenant_pod, &created, minted).await?;
        writes += 1;
    }
    Ok(Outcome::Created { writes })
}

async fn write_token_secret(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &Pod,
    super_pod: &Pod,
    minted: token::Minted,
) -> Result<()> {
    let now = token::now();
    let has_tokens = !minted.tokens.is_empty();
    let ca = token::tenant_ca(tenant, &tenant_pod.namespace().unwrap_or_default());
    let secret = token::secret(&tenant.identity, tenant_pod, super_pod, ca, minted, now);
    let refresh = token::refresh_at(&secret);
    let api: Api<Secret> = Api::namespaced(
        ctx.super_client.clone(),
        &super_pod.namespace().unwrap_or_default(),
    );
    apply(ctx, &api, secret, None).await?;
    if let (true, Some(at)) = (has_tokens, refresh) {
        let delay = Duration::from_secs(u64::try_from(at - now).unwrap_or(0));
        let item = DownItem::new(
            Kind::Pod,
            &tenant_pod.namespace().unwrap_or_default(),
            &tenant_pod.name_any(),
        );
        ctx.queues.down.add_after(&tenant.id, item, delay);
    }
    Ok(())
}

/// Tells the tenant why its pod waits: an event and a PodScheduled=False condition.
async fn hold_for_quota(ctx: &Context, tenant: &Tenant, tenant_pod: &Pod, message: &str) {
    let already = tenant_pod
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.reason.as_deref() == Some(REASON_QUOTA_EXCEEDED) && c.message.as_deref() == Some(message)
            })
        });
    if already {
        return;
    }
    events::warn(
        tenant,
        &tenant_pod.object_ref(&()),
        REASON_QUOTA_EXCEEDED,
        message,
    )
    .await;
    let status = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(tenant_pod.name_any()),
            ..Default::default()
        },
        status: Some(PodStatus {
            conditions: Some(vec![PodCondition {
                type_: "PodScheduled".into(),
                status: "False".into(),
                reason: Some(REASON_QUOTA_EXCEEDED.into()),
                message: Some(message.to_owned()),
                last_transition_time: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                )),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let api: Api<Pod> = Api::namespaced(tenant.client.clone(), &tenant_pod.namespace().unwrap_or_default());
    ctx.metrics.tenant_write("pod", "status");
    let params = PatchParams::apply(crds::wellknown::FIELD_MANAGER_SYNCER).force();
    if let Err(error) = api
        .patch_status(&tenant_pod.name_any(), &params, &Patch::Apply(&status))
        .await
    {
        tracing::warn!(tenant = %tenant.identity.vc_ref(), pod = %tenant_pod.name_any(), %error, "setting the quota condition");
    }
}

async fn update(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &Pod,
    super_pod: &Pod,
    api: &Api<Pod>,
) -> Result<Outcome> {
    let mut writes = 0;
    // Dependencies that changed since creation do not move a running pod; only mutable fields follow.
    let endpoints = tenant_endpoints(ctx, tenant).unwrap_or_default();
    // The syncer bound the tenant pod to its vNode: that node name is not the tenant's request.
    let mut unbound = tenant_pod.clone();
    if let Some(spec) = unbound.spec.as_mut() {
        spec.node_name = None;
    }
    if let Ok(converted) = convert(ctx, tenant, &unbound, &endpoints) {
        let mut desired = converted.pod.clone();
        identity::stamp(&mut desired, |p| p.meta_mut());
        let in_sync = identity::recorded_hash(desired.meta()) == identity::recorded_hash(super_pod.meta())
            && identity::metadata_covers(desired.meta(), super_pod.meta())
            && convert::mutable_view(&desired) == convert::mutable_view(super_pod);
        if !in_sync {
            apply(ctx, api, updated_pod(super_pod, &desired), super_pod.uid()).await?;
            writes += 1;
        }
        if converted.needs_secret {
            writes += refresh_token(ctx, tenant, tenant_pod, super_pod, &converted).await?;
        }
    }
    writes += sync_readiness_gates(ctx, tenant_pod, super_pod, api).await?;
    Ok(match writes {
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}

/// The super pod as it is, with the tenant's labels, annotations, images and deadline. Applying the whole
/// spec keeps the syncer's ownership of every field it set at creation.
fn updated_pod(super_pod: &Pod, desired: &Pod) -> Pod {
    let mut spec = super_pod.spec.clone().unwrap_or_default();
    let desired_spec = desired.spec.clone().unwrap_or_default();
    let image_of = |containers: &[k8s_openapi::api::core::v1::Container], name: &str| {
        containers
            .iter()
            .find(|c| c.name == name)
            .and_then(|c| c.image.clone())
    };
    for container in &mut spec.containers {
        if let Some(image) = image_of(&desired_spec.containers, &container.name) {
            container.image = Some(image);
        }
    }
    let desired_init = desired_spec.init_containers.clone().unwrap_or_default();
    for container in spec.init_containers.iter_mut().flatten() {
        if let Some(image) = image_of(&desired_init, &container.name) {
            container.image = Some(image);
        }
    }
    spec.active_deadline_seconds = desired_spec.active_deadline_seconds;
    spec.node_name = None;
    Pod {
        metadata: kube::api::ObjectMeta {
            name: desired.metadata.name.clone(),
            namespace: desired.metadata.namespace.clone(),
            labels: desired.metadata.labels.clone(),
            annotations: desired.metadata.annotations.clone(),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

async fn refresh_token(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &Pod,
    super_pod: &Pod,
    converted: &SuperPod,
) -> Result<u32> {
    let secret_name = token::secret_name(&tenant_pod.name_any());
    let existing = ctx
        .supers
        .secrets
        .get(&ObjectRef::new(&secret_name).within(&super_pod.namespace().unwrap_or_default()));
    let tenant_uid = tenant_pod.uid().unwrap_or_default();
    if !token::needs_refresh(existing.as_deref(), &tenant_uid, &converted.tokens, token::now()) {
        if let Some(at) = existing.as_deref().and_then(token::refresh_at) {
            // Keep a wake-up scheduled across restarts.
            let delay = Duration::from_secs(u64::try_from(at - token::now()).unwrap_or(0));
            let item = DownItem::new(
                Kind::Pod,
                &tenant_pod.namespace().unwrap_or_default(),
                &tenant_pod.name_any(),
            );
            ctx.queues.down.add_after(&tenant.id, item, delay);
        }
        return Ok(0);
    }
    let minted = token::mint(
        tenant,
        tenant_pod,
        &converted.tokens,
        ctx.config.token_ttl_seconds,
    )
    .await?;
    write_token_secret(ctx, tenant, tenant_pod, super_pod, minted).await?;
    Ok(1)
}

/// Readiness-gate conditions set by tenant controllers go down to the super pod, whose readiness depends
/// on them.
async fn sync_readiness_gates(
    ctx: &Context,
    tenant_pod: &Pod,
    super_pod: &Pod,
    api: &Api<Pod>,
) -> Result<u32> {
    let gates: Vec<String> = tenant_pod
        .spec
        .as_ref()
        .and_then(|s| s.readiness_gates.as_ref())
        .map(|g| g.iter().map(|g| g.condition_type.clone()).collect())
        .unwrap_or_default();
    if gates.is_empty() {
        return Ok(0);
    }
    let conditions = |pod: &Pod| -> Vec<PodCondition> {
        pod.status
            .as_ref()
            .and_then(|s| s.conditions.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|c| gates.contains(&c.type_))
            .collect()
    };
    let wanted = conditions(tenant_pod);
    let have = conditions(super_pod);
    let differs = wanted
        .iter()
        .any(|w| !have.iter().any(|h| h.type_ == w.type_ && h.status == w.status));
    if wanted.is_empty() || !differs {
        return Ok(0);
    }
    let status = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(super_pod.name_any()),
            ..Default::default()
        },
        status: Some(PodStatus {
            conditions: Some(wanted),
            ..Default::default()
        }),
        ..Default::default()
    };
    ctx.metrics.super_write("pod", "apply");
    api.patch_status(
        &super_pod.name_any(),
        &PatchParams::apply(crds::wellknown::FIELD_MANAGER_SYNCER).force(),
        &Patch::Apply(&status),
    )
    .await
    .map_err(on_super(format!(
        "setting readiness gates of pod {}",
        super_pod.name_any()
    )))?;
    Ok(1)
}
