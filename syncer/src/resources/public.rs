//! Cluster-scoped super objects tenants see: PersistentVolumes bound to their claims, and StorageClasses
//! and PriorityClasses labelled `tenancy.x-k8s.io/super.public=true`.

use std::fmt::Debug;

use k8s_openapi::{
    ClusterResourceScope,
    api::{
        core::v1::{ObjectReference, PersistentVolume, PersistentVolumeSpec},
        scheduling::v1::PriorityClass,
        storage::v1::StorageClass,
    },
};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, ObjectMeta, Patch, PatchParams},
    runtime::reflector::{ObjectRef, Store},
};
use serde::{Serialize, de::DeserializeOwned};

use super::{Outcome, kind_label};
use crate::{
    context::Context,
    error::{Result, on_tenant},
    identity,
    tenant::{LABEL_SYNCED_FROM_SUPER, Tenant},
};

/// Whether a super StorageClass or PriorityClass is published to tenants: labelled
/// `tenancy.x-k8s.io/super.public=true`. The caches list only those, but a class can lose its label
/// between the list and a look-up, so look-ups check again.
pub fn is_published(meta: &ObjectMeta) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(crds::wellknown::LABEL_SUPER_PUBLIC))
        .is_some_and(|v| v == "true")
}

/// Metadata of a tenant copy of a super object: same name, marked as the syncer's.
fn copy_metadata(source: &ObjectMeta) -> ObjectMeta {
    let mut labels = source.labels.clone().unwrap_or_default();
    labels.insert(LABEL_SYNCED_FROM_SUPER.to_owned(), "true".to_owned());
    ObjectMeta {
        name: source.name.clone(),
        labels: Some(labels),
        ..Default::default()
    }
}

/// Brings a tenant's copy of a cluster-scoped object in line with `desired` (`None`: remove the copy).
async fn reconcile_copy<K>(
    ctx: &Context,
    tenant: &Tenant,
    name: &str,
    existing: Option<std::sync::Arc<K>>,
    desired: Option<K>,
) -> Result<Outcome>
where
    K: Resource<DynamicType = (), Scope = ClusterResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let api: Api<K> = Api::all(tenant.client.clone());
    match (desired, existing) {
        (None, None) => Ok(Outcome::InSync),
        (None, Some(_)) => {
            ctx.metrics.tenant_write(kind_label::<K>(), "delete");
            match api.delete(name, &DeleteParams::default()).await {
                Ok(_) => Ok(Outcome::Deleted),
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(Outcome::InSync),
                Err(e) => Err(on_tenant(
                    &tenant.identity.cluster_key,
                    format!("deleting {} {name}", K::kind(&())),
                )(e)),
            }
        }
        (Some(mut desired), existing) => {
            identity::stamp(&mut desired, |o| o.meta_mut());
            if existing
                .as_ref()
                .is_some_and(|e| identity::recorded_hash(e.meta()) == identity::recorded_hash(desired.meta()))
            {
                return Ok(Outcome::InSync);
            }
            api.patch(
                name,
                &PatchParams::apply(crds::wellknown::FIELD_MANAGER_SYNCER).force(),
                &Patch::Apply(&desired),
            )
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("applying {} {name}", K::kind(&())),
            ))?;
            ctx.metrics.tenant_write(kind_label::<K>(), "apply");
            Ok(match existing {
                Some(_) => Outcome::Updated { writes: 1 },
                None => Outcome::Created { writes: 1 },
            })
        }
    }
}

fn get<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>, name: &str) -> Option<std::sync::Arc<K>> {
    store.get(&ObjectRef::new(name))
}

/// Syncs a super PersistentVolume bound to one of the tenant's claims into the tenant, bound to the
/// tenant claim. The copy keeps `Retain`: deleting it must never reach the real volume.
pub async fn volume(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let desired = get(&ctx.supers.volumes, name).and_then(|pv| {
        let claim = pv.spec.as_ref()?.claim_ref.clone()?;
        let super_namespace = ctx
            .supers
            .namespaces
            .get(&ObjectRef::new(claim.namespace.as_deref()?))?;
        if !identity::belongs_to(super_namespace.meta(), &tenant.identity.cluster_key) {
            return None;
        }
        let tenant_namespace = identity::tenant_namespace(super_namespace.meta())?.to_owned();
        let claim_name = claim.name.clone()?;
        let tenant_claim = tenant
            .stores
            .claims
            .get(&ObjectRef::new(&claim_name).within(&tenant_namespace))?;
        let spec = PersistentVolumeSpec {
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some(tenant_namespace),
                name: Some(claim_name),
                uid: tenant_claim.uid(),
                ..Default::default()
            }),
            persistent_volume_reclaim_policy: Some("Retain".into()),
            ..pv.spec.clone()?
        };
        Some(PersistentVolume {
            metadata: copy_metadata(&pv.metadata),
            spec: Some(spec),
            status: None,
        })
    });
    reconcile_copy(ctx, tenant, name, get(&tenant.stores.volumes, name), desired).await
}

/// Syncs a public super StorageClass into the tenant.
pub async fn storage_class(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let desired = get(&ctx.supers.storage_classes, name).map(|sc| StorageClass {
        metadata: ObjectMeta {
            annotations: sc.metadata.annotations.clone(),
            ..copy_metadata(&sc.metadata)
        },
        ..(*sc).clone()
    });
    reconcile_copy(
        ctx,
        tenant,
        name,
        get(&tenant.stores.storage_classes, name),
        desired,
    )
    .await
}

/// Syncs a public super PriorityClass into the tenant.
pub async fn priority_class(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let desired = get(&ctx.supers.priority_classes, name).map(|pc| PriorityClass {
        metadata: copy_metadata(&pc.metadata),
        ..(*pc).clone()
    });
    reconcile_copy(
        ctx,
        tenant,
        name,
        get(&tenant.stores.priority_classes, name),
        desired,
    )
    .await
}
