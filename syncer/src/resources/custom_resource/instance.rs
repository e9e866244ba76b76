//! Instances of custom resources: copied down into the tenant namespace's super namespace (spec and every
//! other field but status, metadata sanitised, references rewritten), status copied up, deletions
//! propagated both ways, conflicts and refusals told to the tenant in events.

use std::{sync::Arc, time::Duration};

use kube::{
    Api, Resource, ResourceExt,
    api::{DynamicObject, Patch, PostParams},
};

use super::{
    caches::Instances,
    convert::{self, REASON_CONFLICT, REASON_INVALID, REASON_REFUSED, References},
    item,
};
use crate::{
    engine::{context::Context, events, items::Kind, patrol::findings::{Findings, found, super_objects}},
    error::{Error, Result, on_super, on_tenant},
    resources::{namespace, outcome::Outcome, upward},
    tenancy::{identity, tenant::Tenant},
};

/// How long an item waits for a cache of its kind that has not listed yet.
const NOT_LISTED_DELAY: Duration = Duration::from_millis(500);
/// How long an instance whose super name is held by someone else waits before it is tried again (the
/// patrol also queues it as missing).
const CONFLICT_DELAY: Duration = Duration::from_secs(30);

/// The metric label of every custom kind: one value, whatever the platform lists.
fn label() -> &'static str {
    Kind::CustomResource.as_str()
}

/// The caches of a kind on both sides, when both are there and listed; otherwise what to return.
fn caches(
    ctx: &Context,
    tenant: &Tenant,
    crd: &str,
) -> std::result::Result<(Arc<Instances>, Arc<Instances>), Outcome> {
    // Not published to this tenant (not configured, not allowed, no CRD): nothing of it is synced, and
    // copies made while it was are left as they are.
    let Some(tenant_side) = tenant.stores.custom_resources.instances(crd) else {
        return Err(Outcome::InSync);
    };
    let super_side = ctx
        .supers
        .custom_resources
        .kinds
        .get(crd)
        .and_then(|k| k.instances());
    match super_side {
        Some(super_side) if super_side.is_ready() && tenant_side.is_ready() => Ok((tenant_side, super_side)),
        _ => Err(Outcome::Waiting {
            reason: format!("the caches of {crd} have not listed yet"),
            retry_after: Some(NOT_LISTED_DELAY),
        }),
    }
}

/// The super copy a tenant instance should have, or why it gets none.
fn desired(
    ctx: &Context,
    tenant: &Tenant,
    crd: &str,
    resource: &kube::api::ApiResource,
    object: &DynamicObject,
    super_namespace: &str,
) -> std::result::Result<DynamicObject, String> {
    let kind = &ctx
        .supers
        .custom_resources
        .kinds
        .get(crd)
        .ok_or_else(|| format!("{crd} is not synced"))?
        .kind;
    let settings = tenant.settings();
    let meta = ctx.meta_policy(&settings.opaque_prefixes);
    let metadata = identity::super_metadata(
        &object.metadata,
        &tenant.identity,
        &meta,
        Some(super_namespace.to_owned()),
        false,
    );
    let map = |namespace: &str| tenant.identity.super_namespace(namespace);
    let mut copy = convert::to_super(
        object,
        resource,
        metadata,
        &References {
            kind,
            super_namespace: &map,
        },
    )?;
    identity::stamp(&mut copy, |o| &mut o.metadata);
    Ok(copy)
}

/// Whether a super copy is the desired one.
fn in_sync(desired: &DynamicObject, actual: &DynamicObject) -> bool {
    identity::recorded_hash(&desired.metadata) == identity::recorded_hash(&actual.metadata)
        && identity::metadata_covers(&desired.metadata, &actual.metadata)
        && convert::view(desired) == convert::view(actual)
}

/// Whether the super apiserver refused a write for the object itself (schema, CEL rules, admission), not
/// for the syncer's rights or the connection.
fn refused_for_the_object(error: &Error) -> bool {
    error.is_status(422) || error.is_status(400)
}

/// Tells the tenant, on its object, that the super cluster refused the copy (it stays as it is in the
/// tenant; the item is retried with backoff).
async fn refused(
    ctx: &Context,
    tenant: &Tenant,
    object: &DynamicObject,
    resource: &kube::api::ApiResource,
    error: &Error,
) {
    let message = format!(
        "the super cluster refused the copy: {}",
        error.status_message().unwrap_or("no reason given")
    );
    events::refuse(&ctx.metrics, tenant, Some(&object.object_ref(resource)), label(), REASON_INVALID, &message).await;
}

/// Syncs one tenant instance into the super cluster.
pub async fn sync_down(ctx: &Context, tenant: &Tenant, crd: &str, namespace_name: &str, name: &str) -> Result<Outcome> {
    let (tenant_side, super_side) = match caches(ctx, tenant, crd) {
        Ok(caches) => caches,
        Err(outcome) => return Ok(outcome),
    };
    let resource = &super_side.resource;
    if let Some(taken) = namespace::taken(ctx, tenant, namespace_name) {
        return Ok(taken);
    }
    let super_namespace = tenant.identity.super_namespace(namespace_name);
    let super_object = super_side.get(&super_namespace, name);
    if let Some(existing) = &super_object
        && (!identity::belongs_to(&existing.metadata, &tenant.identity.cluster_key)
            || identity::tenant_namespace(&existing.metadata) != Some(namespace_name))
    {
        return Ok(Outcome::Waiting {
            reason: "the super object belongs to someone else".into(),
            retry_after: None,
        });
    }
    let live = tenant_side
        .get(namespace_name, name)
        .filter(|o| o.metadata.deletion_timestamp.is_none());
    let api: Api<DynamicObject> = Api::namespaced_with(ctx.super_client.clone(), &super_namespace, resource);
    let Some(live) = live else {
        return match super_object {
            Some(existing) => {
                ctx.metrics.resources.super_write(label(), "delete");
                vc_runtime::cleanup::delete_pinned(&api, name, existing.uid(), None)
                    .await
                    .map_err(on_super(format!("deleting {} {super_namespace}/{name}", resource.plural)))?;
                Ok(Outcome::Deleted)
            }
            None => Ok(Outcome::InSync),
        };
    };
    // The tenant reads and writes the kind through the version its cache watches; the copy is written
    // through the super cluster's. Both are the storage version of the same CRD.
    let mut desired = match desired(ctx, tenant, crd, resource, &live, &super_namespace) {
        Ok(desired) => desired,
        Err(why) => {
            let message = format!("not copied to the super cluster: {why}");
            let reference = live.object_ref(&tenant_side.resource);
            events::refuse(&ctx.metrics, tenant, Some(&reference), label(), REASON_REFUSED, &message).await;
            return Ok(Outcome::Waiting {
                reason: message,
                retry_after: None,
            });
        }
    };
    match super_object {
        Some(existing) if identity::tenant_uid(&existing.metadata) != live.uid().as_deref() => {
            // The tenant object was recreated: the old copy goes, the new one follows the deletion.
            ctx.metrics.resources.super_write(label(), "delete");
            vc_runtime::cleanup::delete_pinned(&api, name, existing.uid(), None)
                .await
                .map_err(on_super(format!("deleting {} {super_namespace}/{name}", resource.plural)))?;
            Ok(Outcome::Deleted)
        }
        Some(existing) if in_sync(&desired, &existing) => Ok(Outcome::InSync),
        Some(existing) => {
            // Forced onto this very object (uid): what the tenant wants wins over edits of the copy.
            desired.metadata.uid = existing.uid();
            ctx.metrics.resources.super_write(label(), "apply");
            let applied = api
                .patch(
                    name,
                    &crate::resources::write::apply_params().force(),
                    &Patch::Apply(&desired),
                )
                .await
                .map_err(on_super(format!("applying {} {super_namespace}/{name}", resource.plural)));
            if let Err(error) = &applied
                && refused_for_the_object(error)
            {
                refused(ctx, tenant, &live, &tenant_side.resource, error).await;
            }
            applied?;
            Ok(Outcome::Updated { writes: 1 })
        }
        None => {
            let namespace_writes = match namespace::ensure(ctx, tenant, namespace_name).await? {
                Ok(writes) => writes,
                Err(outcome) => return Ok(outcome),
            };
            // Created, never applied: an object of that name that is not the tenant's (the cache holds
            // only the syncer's) must not be taken over.
            ctx.metrics.resources.super_write(label(), "create");
            match api.create(&PostParams::default(), &desired).await {
                Ok(_) => Ok(Outcome::Created {
                    writes: 1 + namespace_writes,
                }),
                Err(kube::Error::Api(status)) if status.code == 409 => {
                    let message = format!(
                        "not copied to the super cluster: {} {super_namespace}/{name} exists there and is not this object's copy; it is tried again every {} s",
                        resource.kind,
                        CONFLICT_DELAY.as_secs()
                    );
                    let reference = live.object_ref(&tenant_side.resource);
                    events::refuse(&ctx.metrics, tenant, Some(&reference), label(), REASON_CONFLICT, &message).await;
                    Ok(Outcome::Waiting {
                        reason: message,
                        retry_after: Some(CONFLICT_DELAY),
                    })
                }
                Err(source) => {
                    let error = on_super(format!("creating {} {super_namespace}/{name}", resource.plural))(source);
                    if refused_for_the_object(&error) {
                        refused(ctx, tenant, &live, &tenant_side.resource, &error).await;
                    }
                    Err(error)
                }
            }
        }
    }
}

/// Whether the kind's instances have a status subresource (in the version the syncer reads).
fn with_status(ctx: &Context, crd: &str, super_side: &Instances) -> bool {
    ctx.supers
        .custom_resources
        .kinds
        .get(crd)
        .and_then(|k| k.definition())
        .is_some_and(|d| convert::has_status(&d, &super_side.resource.version))
}

/// Copies the status of a super instance into the tenant instance it was made from (kinds whose CRD has
/// a status subresource).
pub async fn sync_up(ctx: &Context, tenant: &Tenant, crd: &str, namespace_name: &str, name: &str) -> Result<Outcome> {
    let (tenant_side, super_side) = match caches(ctx, tenant, crd) {
        Ok(caches) => caches,
        Err(outcome) => return Ok(outcome),
    };
    let with_status = with_status(ctx, crd, &super_side);
    let Some(object) = tenant_side.get(namespace_name, name) else {
        return Ok(Outcome::InSync);
    };
    let super_namespace = tenant.identity.super_namespace(namespace_name);
    let Some(copy) = upward::matching_super(super_side.get(&super_namespace, name), tenant, object.uid()) else {
        return Ok(Outcome::InSync);
    };
    if !with_status || convert::status(&copy) == convert::status(&object) {
        return Ok(Outcome::InSync);
    }
    let resource = &tenant_side.resource;
    let mut patch = serde_json::json!({
        "apiVersion": resource.api_version,
        "kind": resource.kind,
        "metadata": {"name": name, "namespace": namespace_name},
    });
    if let Some(status) = convert::status(&copy) {
        patch["status"] = status.clone();
    }
    let api: Api<DynamicObject> = Api::namespaced_with(tenant.client.clone(), namespace_name, resource);
    api.patch_status(name, &upward::params(), &Patch::Apply(&patch))
        .await
        .map_err(on_tenant(
            &tenant.identity.cluster_key,
            format!("copying the status of {} {namespace_name}/{name}", resource.plural),
        ))?;
    ctx.metrics.resources.tenant_write(label(), "apply");
    Ok(Outcome::Updated { writes: 1 })
}

/// Compares a tenant's instances of a kind with their super copies; queues missing, drifted and orphaned
/// copies down and status that did not flow up.
pub fn patrol(ctx: &Context, tenant: &Tenant, crd: &str) -> Findings {
    let mut findings = Findings::default();
    let Ok((tenant_side, super_side)) = caches(ctx, tenant, crd) else {
        return findings;
    };
    let mut supers = super_objects(super_side.store.state(), &tenant.identity.cluster_key);
    let with_status = with_status(ctx, crd, &super_side);
    for object in tenant_side.store.state() {
        if object.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let (namespace, name) = (object.namespace().unwrap_or_default(), object.name_any());
        let super_namespace = tenant.identity.super_namespace(&namespace);
        let Ok(desired) = desired(ctx, tenant, crd, &super_side.resource, &object, &super_namespace) else {
            continue;
        };
        let finding = match supers.remove(&(namespace.clone(), name.clone())) {
            None => "missing",
            Some(existing) if identity::tenant_uid(&existing.metadata) != object.uid().as_deref() => "drifted",
            Some(existing) if !in_sync(&desired, &existing) => "drifted",
            Some(existing) => {
                if with_status && convert::status(&existing) != convert::status(&object) {
                    findings.status += 1;
                    found(ctx, label(), "status");
                    ctx.queues.up.add(&tenant.id, item::instance(crd, &namespace, &name));
                }
                continue;
            }
        };
        match finding {
            "missing" => findings.missing += 1,
            _ => findings.drifted += 1,
        }
        found(ctx, label(), finding);
        ctx.queues.down.add(&tenant.id, item::instance(crd, &namespace, &name));
    }
    for ((namespace, name), _) in supers {
        findings.orphaned += 1;
        found(ctx, label(), "orphaned");
        ctx.queues.down.add(&tenant.id, item::instance(crd, &namespace, &name));
    }
    findings
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn copy(spec: serde_json::Value, labels: serde_json::Value) -> DynamicObject {
        let mut object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "example.com/v1", "kind": "Widget",
            "metadata": {"name": "w", "namespace": "key-shop", "labels": labels, "annotations": {"tenancy.x-k8s.io/uid": "u1"}},
            "spec": spec
        }))
        .expect("widget");
        identity::stamp(&mut object, |o| &mut o.metadata);
        object
    }

    #[test]
    fn a_copy_is_in_sync_whatever_the_operator_adds_and_not_after_an_edit() {
        let desired = copy(json!({"size": 1}), json!({"app": "db"}));
        // The operator's status, labels other controllers add, and apiserver metadata are no difference.
        let mut actual = desired.clone();
        actual.data["status"] = json!({"phase": "Ready"});
        actual.metadata.labels.get_or_insert_with(Default::default).insert("operator/owned".into(), "x".into());
        actual.metadata.resource_version = Some("7".into());
        assert!(in_sync(&desired, &actual));
        // An edit of the copy's spec behind the syncer's back is drift, though the hash still matches.
        let mut edited = actual.clone();
        edited.data["spec"]["size"] = json!(5);
        assert!(!in_sync(&desired, &edited));
        // A label the syncer applies, removed from the copy, is drift too.
        let mut unlabelled = actual;
        unlabelled.metadata.labels = None;
        assert!(!in_sync(&desired, &unlabelled));
        // A changed tenant object changes the hash.
        assert!(!in_sync(&copy(json!({"size": 2}), json!({"app": "db"})), &desired));
    }
}

