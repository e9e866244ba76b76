//! What the tenants' copies of cluster-scoped super objects share (PersistentVolumes bound to their claims,
//! StorageClasses and PriorityClasses labelled `tenancy.x-k8s.io/super.public=true`): which are published,
//! and how a copy is brought in line.

use std::fmt::Debug;

use k8s_openapi::ClusterResourceScope;
use kube::{
    Api, Resource,
    api::{DeleteParams, ObjectMeta, Patch},
    runtime::reflector::{ObjectRef, Store},
};
use serde::{Serialize, de::DeserializeOwned};

use super::{outcome::Outcome, write::kind_label};
use crate::{
    engine::context::Context,
    error::{Result, on_tenant},
    tenancy::{
        identity,
        tenant::{LABEL_SYNCED_FROM_SUPER, Tenant},
    },
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
pub fn copy_metadata(source: &ObjectMeta) -> ObjectMeta {
    let mut labels = source.labels.clone().unwrap_or_default();
    labels.insert(LABEL_SYNCED_FROM_SUPER.to_owned(), "true".to_owned());
    ObjectMeta {
        name: source.name.clone(),
        labels: Some(labels),
        ..Default::default()
    }
}

/// Brings a tenant's copy of a cluster-scoped object in line with `desired` (`None`: remove the copy).
pub async fn reconcile_copy<K>(
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
            ctx.metrics.resources.tenant_write(kind_label::<K>(), "delete");
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
                &crate::resources::write::apply_params().force(),
                &Patch::Apply(&desired),
            )
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("applying {} {name}", K::kind(&())),
            ))?;
            ctx.metrics.resources.tenant_write(kind_label::<K>(), "apply");
            Ok(match existing {
                Some(_) => Outcome::Updated { writes: 1 },
                None => Outcome::Created { writes: 1 },
            })
        }
    }
}

/// The object of this name in a cache of a cluster-scoped kind.
pub fn get<K: Resource<DynamicType = ()> + Clone>(store: &Store<K>, name: &str) -> Option<std::sync::Arc<K>> {
    store.get(&ObjectRef::new(name))
}
