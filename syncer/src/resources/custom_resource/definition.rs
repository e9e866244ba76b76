//! Publishing a configured kind's CRD into a tenant: applied while the tenant may have the kind, put back
//! when the tenant edits or replaces it, removed when the kind is no longer its.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::{
    Api, Resource,
    api::{ApiResource, DeleteParams, Patch, PostParams},
    runtime::reflector::ObjectRef,
};

use super::convert::{self, REASON_DEFINITION_RESTORED};
use crate::{
    engine::{context::Context, events, items::Kind},
    error::{Result, on_tenant},
    resources::{outcome::Outcome, public},
    tenancy::{identity, tenant::Tenant},
};

/// The CRD a tenant should have under this name, and the API resource of its instances: `None` when the
/// kind is not configured, its CRD is not in the super cluster (or not namespaced), or the tenant may not
/// have it.
pub fn desired(ctx: &Context, tenant: &Tenant, crd: &str) -> Option<(CustomResourceDefinition, ApiResource)> {
    let kind = ctx.supers.custom_resources.kinds.get(crd)?;
    let definition = kind.definition()?;
    let resource = convert::api_resource(&definition)?;
    let labels = ctx
        .virtual_clusters
        .get(&ObjectRef::new(&tenant.identity.vc_name).within(&tenant.identity.vc_namespace))
        .and_then(|vc| vc.meta().labels.clone());
    let allowed = kind.kind.selects(labels.as_ref()) || public::is_published(&definition.metadata);
    allowed.then(|| (convert::published(&definition), resource))
}

/// Brings the tenant's CRD of this name in line with what the platform publishes to it.
pub async fn sync(ctx: &Context, tenant: &Tenant, crd: &str) -> Result<Outcome> {
    let caches = &tenant.stores.custom_resources;
    let api: Api<CustomResourceDefinition> = Api::all(tenant.client.clone());
    let on_error = |what: &str| on_tenant(&tenant.identity.cluster_key, format!("{what} CustomResourceDefinition {crd}"));
    let existing = api.get_opt(crd).await.map_err(on_error("reading"))?;
    let Some((mut desired, resource)) = desired(ctx, tenant, crd) else {
        caches.forget(crd);
        return match existing {
            // Only what the platform published is removed; a tenant's own CRD of that name stays. One
            // being deleted is on its way (its instances go first).
            Some(existing)
                if convert::carries_platform_mark(&existing.metadata)
                    && existing.metadata.deletion_timestamp.is_none() =>
            {
                api.delete(crd, &DeleteParams::default())
                    .await
                    .map_err(on_error("removing"))?;
                ctx.metrics.resources.tenant_write(Kind::CustomResource.as_str(), "delete");
                tracing::info!(crd, "published CRD removed: the tenant may no longer have the kind");
                Ok(Outcome::Deleted)
            }
            _ => Ok(Outcome::InSync),
        };
    };
    let remember = |applied: &CustomResourceDefinition| {
        if let Some(generation) = applied.metadata.generation {
            caches
                .checked_generations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(crd.to_owned(), generation);
        }
    };
    let outcome = match existing {
        // Deleted in the tenant (by the tenant, or by the syncer a moment ago): published again once it
        // is gone, which its watch reports.
        Some(existing) if existing.metadata.deletion_timestamp.is_some() => {
            caches.forget(crd);
            return Ok(Outcome::Waiting {
                reason: format!("CustomResourceDefinition {crd} is being deleted in the tenant"),
                retry_after: None,
            });
        }
        Some(existing) if convert::definition_in_sync(&desired, &existing) => {
            remember(&existing);
            Outcome::InSync
        }
        Some(existing) => {
            // The same version as published, yet different: the tenant edited it or took it over.
            let tampered = !convert::carries_platform_mark(&existing.metadata)
                || identity::recorded_hash(&existing.metadata) == identity::recorded_hash(&desired.metadata);
            // A replace, not an apply: fields the tenant added under its own field manager go too.
            desired.metadata.resource_version = existing.metadata.resource_version.clone();
            let replaced = api
                .replace(crd, &PostParams::default(), &desired)
                .await
                .map_err(on_error("restoring"))?;
            ctx.metrics.resources.tenant_write(Kind::CustomResource.as_str(), "replace");
            // Told once it is back: a replace that lost a race (409) is retried, and says nothing.
            if tampered {
                let message = format!(
                    "CustomResourceDefinition {crd} is published by the platform and cannot be changed in the tenant; it was put back"
                );
                tracing::warn!(crd, "a published CRD was edited or replaced in the tenant; put back");
                events::warn(tenant, &existing.object_ref(&()), REASON_DEFINITION_RESTORED, &message).await;
            }
            remember(&replaced);
            Outcome::Updated { writes: 1 }
        }
        None => {
            let applied = api
                .patch(
                    crd,
                    &crate::resources::write::apply_params().force(),
                    &Patch::Apply(&desired),
                )
                .await
                .map_err(on_error("publishing"))?;
            ctx.metrics.resources.tenant_write(Kind::CustomResource.as_str(), "apply");
            tracing::info!(crd, "CRD published");
            remember(&applied);
            Outcome::Created { writes: 1 }
        }
    };
    // The watch retries until the tenant apiserver serves the new resource.
    caches.follow(crd, &resource);
    Ok(outcome)
}

/// Whether the tenant's CRD, as its cache shows it, needs a look: it should be there and is not, or is
/// not as published (mark, hash, a generation the syncer has not seen), or should not be there.
pub fn needs_sync(ctx: &Context, tenant: &Tenant, crd: &str) -> bool {
    let caches = &tenant.stores.custom_resources;
    let existing = caches.definitions.get(&ObjectRef::new(crd));
    match (desired(ctx, tenant, crd), existing) {
        (None, None) => false,
        (None, Some(existing)) => convert::carries_platform_mark(existing.meta()),
        (Some(_), None) => true,
        (Some((desired, resource)), Some(existing)) => {
            let checked = caches
                .checked_generations
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .get(crd)
                .copied();
            !convert::carries_platform_mark(existing.meta())
                || identity::recorded_hash(existing.meta()) != identity::recorded_hash(&desired.metadata)
                || existing.meta().generation != checked
                || caches.instances(crd).is_none_or(|i| i.resource != resource)
        }
    }
}

/// Queues the tenant's CRDs that need a look: called when its VirtualCluster changed (its labels may grant
/// or withdraw kinds), so that this takes effect at once rather than at the next patrol.
pub fn queue_changed(ctx: &Context, tenant: &Tenant) {
    for crd in names(ctx, tenant) {
        if needs_sync(ctx, tenant, &crd) {
            ctx.queues.up.add(&tenant.id, super::item::definition(&crd));
        }
    }
}

/// The names of every CRD to look at for a tenant: the configured kinds, and those the tenant holds with
/// the platform's mark (from a kind since removed from the configuration).
pub fn names(ctx: &Context, tenant: &Tenant) -> Vec<String> {
    let mut names: Vec<String> = ctx.config.custom_resources.iter().map(|k| k.name.clone()).collect();
    for existing in tenant.stores.custom_resources.definitions.state() {
        if convert::carries_platform_mark(existing.meta())
            && let Some(name) = &existing.meta().name
            && !names.contains(name)
        {
            names.push(name.clone());
        }
    }
    names
}
