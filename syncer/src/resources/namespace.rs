//! Tenant namespaces as `<cluster key>-<namespace>` in the super cluster.

use k8s_openapi::api::core::v1::Namespace;
use kube::{Api, Resource, ResourceExt, runtime::reflector::ObjectRef};

use super::{Outcome, apply, delete};
use crate::{context::Context, error::Result, events, identity, items::DownItem, tenant::Tenant};

/// The super namespace for a tenant namespace object.
fn desired(ctx: &Context, tenant: &Tenant, namespace: &Namespace) -> Namespace {
    let settings = tenant.settings();
    let opaque = ctx.opaque_prefixes(&settings.opaque_prefixes);
    let mut desired = Namespace {
        metadata: identity::super_namespace_metadata(&namespace.metadata, &tenant.identity, &opaque),
        ..Default::default()
    };
    identity::stamp(&mut desired, |n| n.meta_mut());
    desired
}

/// Syncs one tenant namespace.
pub async fn sync(ctx: &Context, tenant: &Tenant, item: &DownItem) -> Result<Outcome> {
    let super_name = tenant.identity.super_namespace(&item.name);
    let tenant_namespace = tenant.stores.namespaces.get(&ObjectRef::new(&item.name));
    let super_namespace = ctx.supers.namespaces.get(&ObjectRef::new(&super_name));
    let api: Api<Namespace> = Api::all(ctx.super_client.clone());

    if let Some(existing) = &super_namespace {
        let ours = identity::belongs_to(existing.meta(), &tenant.identity.cluster_key);
        let same_source = identity::tenant_namespace(existing.meta()) == Some(item.name.as_str());
        if !ours || !same_source {
            // Shortened names can collide (see crds::naming): the first namespace keeps the name.
            if let Some(namespace) = &tenant_namespace {
                events::warn(
                    tenant,
                    &namespace.object_ref(&()),
                    "NameCollision",
                    &format!(
                        "super namespace {super_name} already holds another namespace; this one is not synced"
                    ),
                )
                .await;
            }
            return Ok(Outcome::Waiting {
                reason: format!("super namespace {super_name} is taken"),
                retry_after: None,
            });
        }
    }

    let live = tenant_namespace.filter(|ns| ns.meta().deletion_timestamp.is_none());
    match (live, super_namespace) {
        (None, None) => Ok(Outcome::InSync),
        (None, Some(existing)) => {
            delete(ctx, &api, &super_name, existing.uid(), None).await?;
            Ok(Outcome::Deleted)
        }
        (Some(namespace), existing) => {
            let desired = desired(ctx, tenant, &namespace);
            match existing {
                Some(existing) if identity::tenant_uid(existing.meta()) != namespace.uid().as_deref() => {
                    delete(ctx, &api, &super_name, existing.uid(), None).await?;
                    Ok(Outcome::Deleted)
                }
                Some(existing) if existing.meta().deletion_timestamp.is_some() => Ok(Outcome::Waiting {
                    reason: "the previous super namespace is still terminating".into(),
                    retry_after: Some(std::time::Duration::from_secs(2)),
                }),
                Some(existing)
                    if identity::recorded_hash(existing.meta())
                        == identity::recorded_hash(desired.meta())
                        && identity::metadata_covers(desired.meta(), existing.meta()) =>
                {
                    Ok(Outcome::InSync)
                }
                Some(existing) => {
                    apply(ctx, &api, desired, existing.uid()).await?;
                    Ok(Outcome::Updated { writes: 1 })
                }
                None => {
                    apply(ctx, &api, desired, None).await?;
                    Ok(Outcome::Created { writes: 1 })
                }
            }
        }
    }
}

/// Makes sure the super namespace of `tenant_namespace` exists before an object is created in it;
/// returns the writes made (0 or 1), or `None` while the tenant namespace is not in the cache yet (right
/// after a tenant attaches, caches fill in any order).
pub async fn ensure(ctx: &Context, tenant: &Tenant, tenant_namespace: &str) -> Result<Option<u32>> {
    let super_name = tenant.identity.super_namespace(tenant_namespace);
    if ctx.supers.namespaces.get(&ObjectRef::new(&super_name)).is_some() {
        return Ok(Some(0));
    }
    let Some(namespace) = tenant.stores.namespaces.get(&ObjectRef::new(tenant_namespace)) else {
        return Ok(None);
    };
    let api: Api<Namespace> = Api::all(ctx.super_client.clone());
    apply(ctx, &api, desired(ctx, tenant, &namespace), None).await?;
    Ok(Some(1))
}

/// The outcome of an object that waits for its namespace.
pub fn waiting_for_namespace(namespace: &str) -> Outcome {
    Outcome::Waiting {
        reason: format!("tenant namespace {namespace} is not in the cache yet"),
        retry_after: Some(std::time::Duration::from_millis(500)),
    }
}
