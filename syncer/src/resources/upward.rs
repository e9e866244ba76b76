//! What the upward syncs of copied objects share: the super copy that matches a tenant object, and the
//! labels and annotations under the tenant's transparent prefixes copied onto it.

use kube::{
    Api, Resource,
    api::{ObjectMeta, Patch, PatchParams},
};
use serde::{Serialize, de::DeserializeOwned};

use super::write::kind_label;
use crate::{
    cache::meta::Tagged,
    engine::context::Context,
    error::{Result, on_tenant},
    tenancy::{identity, tenant::Tenant},
};

/// Force-applied under the syncer's field manager: the fields it writes into tenants are its own.
pub fn params() -> PatchParams {
    crate::resources::write::apply_params().force()
}

/// The super copy of a tenant object, if it exists and was made from this very tenant object.
pub fn matching_super<K: crate::cache::meta::HasTags>(
    super_object: Option<std::sync::Arc<K>>,
    tenant: &Tenant,
    tenant_uid: Option<String>,
) -> Option<std::sync::Arc<K>> {
    super_object.filter(|s| {
        identity::belongs_to(s.tags(), &tenant.identity.cluster_key)
            && identity::tenant_uid(s.tags()) == tenant_uid.as_deref()
    })
}

/// Applies `labels`/`annotations` under the transparent prefixes onto a tenant object, if missing.
pub async fn transparent<K>(
    ctx: &Context,
    tenant: &Tenant,
    tenant_meta: &impl Tagged,
    super_meta: &impl Tagged,
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
    let labels_present = labels.iter().all(|(k, v)| tenant_meta.label(k) == Some(v));
    let annotations_present = annotations
        .iter()
        .all(|(k, v)| tenant_meta.annotation(k) == Some(v));
    if labels_present && annotations_present {
        return Ok(0);
    }
    let name = tenant_meta.object_name().unwrap_or_default().to_owned();
    let mut patch = K::default();
    *patch.meta_mut() = ObjectMeta {
        name: Some(name.clone()),
        labels: Some(labels),
        annotations: Some(annotations),
        ..Default::default()
    };
    let api: Api<K> = Api::namespaced(
        tenant.client.clone(),
        tenant_meta.object_namespace().unwrap_or_default(),
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
    ctx.metrics.resources.tenant_write(kind_label::<K>(), "apply");
    Ok(1)
}

/// A manager of its own for copied-up metadata, so that applying it never drops what the syncer applies
/// to the same object's status.
const TRANSPARENT_MANAGER: &str = "vc-syncer-transparent";
