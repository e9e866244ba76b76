//! Deleting a VirtualCluster: its root namespace (and with it the control plane and PKI) and the syncer's
//! tenant namespaces are deleted, and the finalizer is removed only once all of them are gone, so nothing
//! is left behind.
//!
//! Tenant namespaces are found by the syncer's `vcname`/`vcnamespace` labels and must also belong to this
//! tenant by the one ownership rule ([`crds::Owner`]: its cluster key and a tenant namespace in the
//! annotations, and named as that tenant namespace maps): a VirtualCluster recreated under the same name
//! has another key, and its namespaces are left alone.

use crds::{
    VirtualCluster,
    tenant::belongs_to,
    wellknown::{ANNOTATION_VC_UID, FINALIZER_VIRTUAL_CLUSTER, LABEL_VC_NAME, LABEL_VC_NAMESPACE},
};
use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Resource, ResourceExt,
    api::ListParams,
    runtime::{controller::Action, events::EventType, reflector::ObjectRef},
};
use vc_runtime::cleanup::{Deletion, delete_pinned};

use crate::{Error, Result, context::Context, finalizer, identity::TenantIdentity};

/// Deletes what vc-manager (and the syncer) made for a VirtualCluster being deleted.
pub async fn delete(vc: &VirtualCluster, ctx: &Context) -> Result<Action> {
    if !finalizer::has(vc, FINALIZER_VIRTUAL_CLUSTER) {
        return Ok(Action::await_change());
    }
    let identity = TenantIdentity::of(vc)?;
    let remaining = delete_namespaces(&identity, ctx).await?;
    if !remaining.is_empty() {
        ctx.publish(
            &vc.object_ref(&()),
            EventType::Normal,
            "Deleting",
            "Delete",
            format!("waiting for namespaces to be deleted: {}", remaining.join(", ")),
        )
        .await;
        return Ok(Action::requeue(ctx.settings.deletion_poll_interval));
    }
    let api: Api<VirtualCluster> = Api::namespaced(ctx.client.clone(), &identity.vc_namespace);
    finalizer::remove(&api, vc, FINALIZER_VIRTUAL_CLUSTER, "VirtualCluster").await?;
    let reference = ObjectRef::from_obj(vc);
    ctx.metrics.forget(&reference);
    ctx.backoff.reset(&reference.to_string());
    tracing::info!(vc = %identity.vc_ref(), root_namespace = identity.root_namespace(), "deleted tenant");
    Ok(Action::await_change())
}

/// Starts deleting the tenant's namespaces; returns those that still exist.
async fn delete_namespaces(identity: &TenantIdentity, ctx: &Context) -> Result<Vec<String>> {
    let api: Api<Namespace> = Api::all(ctx.client.clone());
    let list_failed = |source| Error::NamespaceList {
        cluster_key: identity.cluster_key.clone(),
        source,
    };
    let selector = format!(
        "{LABEL_VC_NAME}={},{LABEL_VC_NAMESPACE}={}",
        identity.vc_name, identity.vc_namespace
    );
    let mut doomed: Vec<Namespace> = api
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(list_failed)?
        .items
        .into_iter()
        .filter(|ns| belongs_to(ns.meta(), &identity.cluster_key))
        .collect();
    if let Some(root) = api
        .get_opt(identity.root_namespace())
        .await
        .map_err(list_failed)?
        && root
            .annotations()
            .get(ANNOTATION_VC_UID)
            .is_none_or(|uid| uid == &identity.vc_uid)
    {
        doomed.push(root);
    }
    let mut remaining = Vec::new();
    for namespace in doomed {
        let name = namespace.name_any();
        if namespace.meta().deletion_timestamp.is_none() {
            match delete_pinned(&api, &name, namespace.uid(), None).await {
                Ok(Deletion::Started) => tracing::info!(namespace = %name, "deleting namespace"),
                // Gone already, or replaced by another namespace of that name: nothing to wait for.
                Ok(Deletion::Gone) => continue,
                Err(source) => {
                    return Err(Error::NamespaceDelete {
                        namespace: name,
                        source,
                    });
                }
            }
        }
        remaining.push(name);
    }
    remaining.sort();
    Ok(remaining)
}
