//! What a tenant pod's copy carries of it besides the converted spec: the super metadata it calls for and
//! the sync hash over what may change after creation. Read by the executors of creation and update.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::convert;
use crate::{
    cache::pods::CachedPodSpec,
    engine::context::Context,
    tenancy::{identity, tenant::Tenant},
};

/// The super metadata a tenant pod calls for, and the sync hash over everything of a pod that may change
/// after creation (labels, annotations, images, deadline): the rest of a pod is fixed when it is created.
pub(super) fn desired_state(
    ctx: &Context,
    tenant: &Tenant,
    metadata: &ObjectMeta,
    spec: &CachedPodSpec,
) -> (ObjectMeta, String) {
    let settings = tenant.settings();
    let meta = ctx.meta_policy(&settings.opaque_prefixes);
    let super_namespace = tenant
        .identity
        .super_namespace(metadata.namespace.as_deref().unwrap_or_default());
    let copied = identity::super_metadata(metadata, &tenant.identity, &meta, Some(super_namespace), true);
    let hash = identity::sync_hash(&(&copied.labels, &copied.annotations, convert::mutable_view(spec)));
    (copied, hash)
}

/// The metadata with one more annotation.
pub(super) fn with_annotation(mut meta: ObjectMeta, key: &str, value: String) -> ObjectMeta {
    meta.annotations
        .get_or_insert_with(Default::default)
        .insert(key.to_owned(), value);
    meta
}
