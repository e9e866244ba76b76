//! Tenant pods synced down: the step [`super::plan`] decides from the caches is done here (deletions both
//! ways, a tenant pod replaced when its copy is lost) or by the executors of a pod's creation
//! ([`super::create`]) and of a running pod's changes ([`super::update`]).

use k8s_openapi::api::core::v1::Pod;
use kube::{Api, Resource, runtime::reflector::ObjectRef};

use super::{
    create,
    end::finalize_tenant_pod,
    plan::{DownStep, DownView, plan_down},
    update,
};
use crate::{
    cache::pods::{SuperPod, TenantPod},
    engine::{context::Context, events, items::DownItem},
    error::{Result, on_super},
    resources::{namespace, outcome::Outcome, write::delete},
    tenancy::{identity, tenant::Tenant},
};

/// Syncs one tenant pod down: the step [`plan_down`] decides from the caches, and its executor.
pub async fn sync(ctx: &Context, tenant: &Tenant, item: &DownItem) -> Result<Outcome> {
    let super_namespace = tenant.identity.super_namespace(&item.namespace);
    let tenant_pod = tenant
        .stores
        .pods
        .get(&ObjectRef::new(&item.name).within(&item.namespace));
    let super_pod = ctx
        .supers
        .pods
        .copies
        .get(&ObjectRef::new(&item.name).within(&super_namespace));
    let api: Api<Pod> = Api::namespaced(ctx.super_client.clone(), &super_namespace);

    // A super namespace serves one tenant namespace: nothing of another is read, written or deleted there.
    if let Some(taken) = namespace::taken(ctx, tenant, &item.namespace) {
        return Ok(taken);
    }
    let step = plan_down(&DownView {
        cluster_key: &tenant.identity.cluster_key,
        namespace: &item.namespace,
        tenant_pod: tenant_pod.as_deref(),
        super_pod: super_pod.as_deref(),
        paused_away: tenant_pod
            .as_deref()
            .is_some_and(|pod| tenant.paused_away(pod.meta())),
    });
    match step {
        DownStep::Foreign => Ok(Outcome::Waiting {
            reason: "the super pod belongs to someone else".into(),
            retry_after: None,
        }),
        DownStep::Gone => {
            ctx.quota.stop_waiting(&tenant.id, &item.namespace, &item.name);
            Ok(Outcome::InSync)
        }
        DownStep::Orphaned(existing) => {
            ctx.quota.stop_waiting(&tenant.id, &item.namespace, &item.name);
            delete(ctx, &api, &item.name, existing.uid(), None).await?;
            Ok(Outcome::Deleted)
        }
        DownStep::Stale(existing) => {
            delete(ctx, &api, &item.name, existing.uid(), None).await?;
            Ok(Outcome::Deleted)
        }
        DownStep::Terminate(tenant_pod, existing) => {
            ctx.quota.stop_waiting(&tenant.id, &item.namespace, &item.name);
            terminate(ctx, tenant, tenant_pod, existing, &api).await
        }
        DownStep::Ended => Ok(Outcome::InSync),
        DownStep::Unplaced(existing) => {
            if existing.meta().deletion_timestamp.is_none() {
                delete(ctx, &api, &item.name, existing.uid(), None).await?;
            }
            Ok(Outcome::Deleted)
        }
        DownStep::ReplaceLost(tenant_pod) => replace_lost(ctx, tenant, tenant_pod, &api).await,
        DownStep::Create(tenant_pod) => create::create(ctx, tenant, tenant_pod, &api).await,
        DownStep::Update(tenant_pod, existing) => {
            update::update(ctx, tenant, tenant_pod, existing, &api).await
        }
    }
}

/// The tenant deletes its pod: the super pod goes with the same grace period; once it is gone, the tenant
/// pod's deletion is completed (what a kubelet does on a real node).
async fn terminate(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    super_pod: Option<&SuperPod>,
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
        // The tenant-side writes are the upward sync's to count.
        None => {
            finalize_tenant_pod(ctx, tenant, tenant_pod).await?;
            Ok(Outcome::InSync)
        }
    }
}

/// The super pod of a scheduled tenant pod disappeared behind the syncer's back: the tenant pod is deleted
/// so that its controller replaces it, as when a node is lost.
async fn replace_lost(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    api: &Api<Pod>,
) -> Result<Outcome> {
    // The cache may not show yet a copy made a moment ago (a pod recreated after a pause and synced again
    // before the copy's watch event arrived): deleting a pod is final, so the apiserver says whether its
    // copy is really gone.
    let name = tenant_pod.name_any();
    let copy = api.get_opt(&name).await.map_err(on_super(format!(
        "reading pod {}/{name}",
        api.namespace().unwrap_or_default()
    )))?;
    if copy.is_some_and(|copy| identity::tenant_uid(copy.meta()) == tenant_pod.uid().as_deref()) {
        return Ok(Outcome::InSync);
    }
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

#[cfg(test)]
mod tests;
