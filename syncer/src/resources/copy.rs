//! The engine of the namespaced kinds copied down with little change: a [`Downward`] kind says how its
//! objects convert, and [`sync_down`] and [`patrol`] do the rest (ownership checks, refusals, quota,
//! creation hints, deletion of what the tenant deleted).

use std::fmt::Debug;

use crds::wellknown::ANNOTATION_TOKEN_FOR_POD;
use k8s_openapi::{NamespaceResourceScope, api::core::v1::ObjectReference};
use kube::{
    Api, Resource, ResourceExt,
    runtime::reflector::{ObjectRef, Store},
};
use serde::{Serialize, de::DeserializeOwned};

use super::{
    namespace,
    outcome::Outcome,
    write::{apply_copy, delete, kind_label},
};
use crate::{
    accounting::quota::{ObjectUsage, REASON_QUOTA_EXCEEDED},
    cache::super_stores::SuperStores,
    engine::{
        context::Context,
        events,
        items::{DownItem, Kind, UpItem},
        patrol::findings::{Findings, found, super_objects},
    },
    error::{Error, Result},
    tenancy::{
        identity::{self, TenantIdentity},
        tenant::{Tenant, TenantStores},
    },
};

/// What conversions may consult.
pub struct Conversion<'a> {
    /// The syncer's flags and super-cluster caches.
    pub ctx: &'a Context,
    /// The tenant.
    pub tenant: &'a Tenant,
    /// Which of the tenant's labels and annotations the copy carries.
    pub meta: &'a identity::MetaPolicy,
    /// Super namespace of the object.
    pub super_namespace: &'a str,
}

impl Conversion<'_> {
    /// The tenant's identity.
    pub fn identity(&self) -> &TenantIdentity {
        &self.tenant.identity
    }

    /// The super metadata of a tenant object.
    pub fn metadata(
        &self,
        tenant: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    ) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
        identity::super_metadata(
            tenant,
            self.identity(),
            self.meta,
            Some(self.super_namespace.to_owned()),
            false,
        )
    }
}

/// A namespaced kind copied from tenants into the super cluster.
pub trait Downward:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// Which kind.
    const KIND: Kind;
    /// The tenant's cache of this kind.
    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>>;
    /// The super cluster's cache of this kind.
    fn super_store(stores: &SuperStores) -> Option<&Store<Self>>;
    /// The super object for a tenant object; `Ok(None)` when this object is not synced.
    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>>;
    /// Fields compared, besides labels, annotations and the sync hash, to tell whether the super object
    /// still matches. Fields the apiserver defaults must be normalised so that a freshly written object
    /// compares equal.
    fn view(object: &Self) -> serde_json::Value;

    /// Values of the tenant object the super cluster may refuse, passed down only when the copy is created:
    /// `desired` with them, or `None` when there are none. They are added after the sync hash and are not
    /// part of [`Downward::view`], so they never count as drift and never flow down on update.
    fn with_creation_hints(_tenant: &Self, _desired: &Self) -> Option<Self> {
        None
    }

    /// When the super cluster refused a creation because of its hints: reason and message of an event for
    /// the tenant object, which is then created without them.
    fn refused_hints(_error: &Error) -> Option<(&'static str, String)> {
        None
    }

    /// What [`Downward::to_super`] refuses of the tenant object, if anything: reason and message of a
    /// Warning event on it. Refused parts are never synced; the rest is, when it means anything alone.
    fn refusal(_tenant: &Self, _cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        None
    }

    /// Why a tenant object may not get a super copy: reason and message of a Warning event on it. Asked
    /// only before a copy is created; an existing copy is never deleted for it (nothing is lost).
    fn creation_refusal(_tenant: &Self, _cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        None
    }

    /// Why a tenant object, as it is now, may not be written to the super cluster at all, neither created
    /// nor changed: reason and message of a Warning event on it. Nothing is written; an existing copy stays
    /// as it was (nothing is lost), and the object is written once it passes.
    fn write_refusal(_tenant: &Self, _cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        None
    }

    /// Whether `existing` cannot become `desired` in place (a field the apiserver will not change): it is
    /// deleted, and the copy created anew once the deletion shows in the cache.
    fn replaced(_desired: &Self, _existing: &Self) -> bool {
        false
    }

    /// What the super object counts against the tenant's object quotas, if anything.
    fn quota_usage(_super_object: &Self) -> Option<ObjectUsage> {
        None
    }

    /// The upward item that brings state of the super object to the tenant, when the tenant object lacks
    /// it (the patrol queues it; the watches normally do).
    fn pending_up(_tenant: &Self, _super_object: &Self) -> Option<UpItem> {
        None
    }
}

/// Whether `actual` (from the cache) matches `desired` (stamped with its hash).
pub fn in_sync<K: Downward>(desired: &K, actual: &K) -> bool {
    identity::recorded_hash(desired.meta()) == identity::recorded_hash(actual.meta())
        && identity::metadata_covers(desired.meta(), actual.meta())
        && K::view(desired) == K::view(actual)
}

/// Syncs one tenant object of a [`Downward`] kind into the super cluster.
pub async fn sync_down<K: Downward>(ctx: &Context, tenant: &Tenant, item: &DownItem) -> Result<Outcome> {
    let (Some(tenant_store), Some(super_store)) =
        (K::tenant_store(&tenant.stores), K::super_store(&ctx.supers))
    else {
        return Ok(Outcome::InSync);
    };
    let super_namespace = tenant.identity.super_namespace(&item.namespace);
    let tenant_object = tenant_store.get(&ObjectRef::new(&item.name).within(&item.namespace));
    let super_object = super_store.get(&ObjectRef::new(&item.name).within(&super_namespace));
    let api: Api<K> = Api::namespaced(ctx.super_client.clone(), &super_namespace);

    // A super namespace serves one tenant namespace: nothing of another is read, written or deleted there.
    if let Some(taken) = namespace::taken(ctx, tenant, &item.namespace) {
        return Ok(taken);
    }
    if let Some(existing) = &super_object
        && (!identity::belongs_to(existing.meta(), &tenant.identity.cluster_key)
            || identity::tenant_namespace(existing.meta()) != Some(item.namespace.as_str()))
    {
        // The super cache only holds objects labelled as synced, but the label can be forged by whoever
        // writes the super cluster: never touch what another tenant or a person owns.
        return Ok(Outcome::Waiting {
            reason: "the super object belongs to someone else".into(),
            retry_after: None,
        });
    }

    let live = tenant_object.filter(|o| o.meta().deletion_timestamp.is_none());
    let settings = tenant.settings();
    let meta = ctx.meta_policy(&settings.opaque_prefixes);
    let cx = Conversion {
        ctx,
        tenant,
        meta: &meta,
        super_namespace: &super_namespace,
    };
    let desired = match &live {
        Some(object) => K::to_super(object, &cx)?,
        None => None,
    };
    let reference = live.as_ref().map(|o| o.object_ref(&()));
    let refusal = live.as_ref().and_then(|o| K::refusal(o, &cx));
    if let (Some((reason, message)), Some(reference)) = (&refusal, &reference) {
        // Said whenever the tenant object is synced, which is when it changed: the patrol does not queue
        // objects whose refused parts are all that differs.
        let in_sync = match (&desired, &super_object) {
            (Some(desired), Some(existing)) => {
                let mut stamped = desired.clone();
                identity::stamp(&mut stamped, |o| o.meta_mut());
                in_sync(&stamped, existing)
            }
            _ => false,
        };
        if !in_sync {
            tracing::warn!(
                tenant = %tenant.identity.vc_ref(),
                kind = %K::KIND,
                namespace = %item.namespace,
                name = %item.name,
                reason,
                message = %message,
                "refused part of a tenant object"
            );
            events::warn(tenant, reference, reason, message).await;
        }
    }

    if live.is_none() {
        ctx.quota.stop_waiting_object(&tenant.id, item);
    }
    match (desired, super_object) {
        (None, None) => Ok(Outcome::InSync),
        (None, Some(existing)) => {
            delete(ctx, &api, &item.name, existing.uid(), None).await?;
            Ok(Outcome::Deleted)
        }
        (Some(mut desired), existing) => {
            identity::stamp(&mut desired, |o| o.meta_mut());
            let tenant_uid = live.as_ref().and_then(|o| o.uid());
            let write_refused = live.as_ref().and_then(|o| K::write_refusal(o, &cx));
            match existing {
                Some(existing) if identity::tenant_uid(existing.meta()) != tenant_uid.as_deref() => {
                    // The tenant object was recreated: the old copy goes first, the new one follows when
                    // the deletion shows in the cache (which queues this item again).
                    delete(ctx, &api, &item.name, existing.uid(), None).await?;
                    Ok(Outcome::Deleted)
                }
                Some(existing) if in_sync(&desired, &existing) => Ok(Outcome::InSync),
                // Neither replaced nor changed: the copy stays as it was.
                Some(_) if write_refused.is_some() => {
                    let (Some(object), Some((reason, message))) = (&live, write_refused) else {
                        return Ok(Outcome::InSync);
                    };
                    Ok(refuse(ctx, tenant, item, &**object, reason, message).await)
                }
                Some(existing) if K::replaced(&desired, &existing) => {
                    delete(ctx, &api, &item.name, existing.uid(), None).await?;
                    Ok(Outcome::Deleted)
                }
                Some(existing) => {
                    if let Some(held) = admit_to_quota(ctx, tenant, item, &desired, live.as_deref()).await {
                        return Ok(held);
                    }
                    let applied =
                        apply_copy(ctx, tenant, reference.as_ref(), &api, desired, existing.uid()).await;
                    if applied.is_err() {
                        ctx.quota.release_object(&tenant.id, item);
                    }
                    applied?;
                    Ok(Outcome::Updated { writes: 1 })
                }
                None => {
                    if let Some(object) = &live
                        && let Some((reason, message)) = K::creation_refusal(object, &cx).or(write_refused)
                    {
                        return Ok(refuse(ctx, tenant, item, &**object, reason, message).await);
                    }
                    if let Some(held) = admit_to_quota(ctx, tenant, item, &desired, live.as_deref()).await {
                        return Ok(held);
                    }
                    let created = create_down(
                        ctx,
                        tenant,
                        item,
                        reference.as_ref(),
                        &api,
                        desired,
                        live.as_deref(),
                    )
                    .await;
                    if !matches!(created, Ok(Outcome::Created { .. })) {
                        ctx.quota.release_object(&tenant.id, item);
                    }
                    created
                }
            }
        }
    }
}

/// Refuses to write a tenant object: a log line, the refusal metric and a Warning event on the object;
/// the outcome says why it waits (it is synced again when it changes, or at the next patrol).
async fn refuse<K: Downward>(
    ctx: &Context,
    tenant: &Tenant,
    item: &DownItem,
    object: &K,
    reason: &'static str,
    message: String,
) -> Outcome {
    tracing::warn!(
        tenant = %tenant.identity.vc_ref(),
        kind = %K::KIND,
        namespace = %item.namespace,
        name = %item.name,
        reason,
        "{message}"
    );
    ctx.metrics.resources.refused(kind_label::<K>(), reason);
    events::warn(tenant, &object.object_ref(&()), reason, &message).await;
    Outcome::Waiting {
        reason: message,
        retry_after: None,
    }
}

/// Reserves what `desired` counts against the tenant's object quotas; when it does not fit, a Warning
/// `TenantQuotaExceeded` event on the tenant object and the outcome to return (nothing is written).
async fn admit_to_quota<K: Downward>(
    ctx: &Context,
    tenant: &Tenant,
    item: &DownItem,
    desired: &K,
    tenant_object: Option<&K>,
) -> Option<Outcome> {
    let usage = K::quota_usage(desired)?;
    let settings = tenant.settings();
    let exceeded = ctx
        .quota
        .admit_object(&tenant.id, settings.quota.as_ref(), item, usage)
        .err()?;
    let message = format!("{exceeded}; the change is not synced until usage drops or the quota is raised");
    tracing::warn!(
        tenant = %tenant.identity.vc_ref(),
        kind = %K::KIND,
        namespace = %item.namespace,
        name = %item.name,
        "{message}"
    );
    ctx.metrics
        .resources
        .refused(kind_label::<K>(), REASON_QUOTA_EXCEEDED);
    if let Some(object) = tenant_object {
        events::warn(tenant, &object.object_ref(&()), REASON_QUOTA_EXCEEDED, &message).await;
    }
    Some(Outcome::Waiting {
        reason: message,
        retry_after: None,
    })
}

/// Creates the super copy of a tenant object, with its creation hints when it has any.
async fn create_down<K: Downward>(
    ctx: &Context,
    tenant: &Tenant,
    item: &DownItem,
    reference: Option<&ObjectReference>,
    api: &Api<K>,
    desired: K,
    live: Option<&K>,
) -> Result<Outcome> {
    let namespace_writes = match namespace::ensure(ctx, tenant, &item.namespace).await? {
        Ok(writes) => writes,
        Err(outcome) => return Ok(outcome),
    };
    let hinted = live.and_then(|o| K::with_creation_hints(o, &desired));
    let writes = match hinted {
        None => {
            apply_copy(ctx, tenant, reference, api, desired, None).await?;
            1
        }
        Some(hinted) => match apply_copy(ctx, tenant, reference, api, hinted, None).await {
            Ok(_) => 1,
            Err(error) => {
                let Some((reason, message)) = K::refused_hints(&error) else {
                    return Err(error);
                };
                if let Some(object) = live {
                    events::normal(tenant, &object.object_ref(&()), reason, &message).await;
                }
                apply_copy(ctx, tenant, reference, api, desired, None).await?;
                2
            }
        },
    };
    Ok(Outcome::Created {
        writes: writes + namespace_writes,
    })
}

/// Compares a tenant's objects of a [`Downward`] kind with their super copies and queues repairs for
/// missing, drifted and orphaned copies, and for state of the copies that did not flow up.
pub fn patrol<K: Downward>(ctx: &Context, tenant: &Tenant) -> Findings {
    let mut findings = Findings::default();
    let (Some(tenant_store), Some(super_store)) =
        (K::tenant_store(&tenant.stores), K::super_store(&ctx.supers))
    else {
        return findings;
    };
    let resource = K::KIND.as_str();
    let mut supers = super_objects(super_store.state(), &tenant.identity.cluster_key);
    // Token Secrets belong to their pods, not to a tenant Secret.
    supers.retain(|_, o| {
        o.meta()
            .annotations
            .as_ref()
            .is_none_or(|a| !a.contains_key(ANNOTATION_TOKEN_FOR_POD))
    });
    let settings = tenant.settings();
    let meta = ctx.meta_policy(&settings.opaque_prefixes);
    for object in tenant_store.state() {
        if object.meta().deletion_timestamp.is_some() {
            continue;
        }
        let namespace = object.namespace().unwrap_or_default();
        let name = object.name_any();
        let super_namespace = tenant.identity.super_namespace(&namespace);
        let cx = Conversion {
            ctx,
            tenant,
            meta: &meta,
            super_namespace: &super_namespace,
        };
        let Ok(Some(mut desired)) = K::to_super(&object, &cx) else {
            continue;
        };
        identity::stamp(&mut desired, |o| o.meta_mut());
        let finding = match supers.remove(&(namespace.clone(), name.clone())) {
            None => Some("missing"),
            Some(existing) if identity::tenant_uid(existing.meta()) != object.uid().as_deref() => {
                Some("drifted")
            }
            Some(existing) if !in_sync(&desired, &existing) => Some("drifted"),
            Some(existing) => {
                if let Some(up) = K::pending_up(&object, &existing) {
                    findings.status += 1;
                    found(ctx, resource, "status");
                    ctx.queues.up.add(&tenant.id, up);
                }
                None
            }
        };
        match finding {
            Some("missing") => findings.missing += 1,
            Some(_) => findings.drifted += 1,
            None => continue,
        }
        found(ctx, resource, finding.unwrap_or("drifted"));
        ctx.queues
            .down
            .add(&tenant.id, DownItem::new(K::KIND, &namespace, &name));
    }
    for ((namespace, name), _) in supers {
        findings.orphaned += 1;
        found(ctx, resource, "orphaned");
        ctx.queues
            .down
            .add(&tenant.id, DownItem::new(K::KIND, &namespace, &name));
    }
    findings
}

/// The caches, watches, sync and patrol of a kind this engine copies down with nothing else to it: every
/// object of the kind cached in tenants, the copies labelled as synced cached in the super cluster, each
/// change queued down. `copied_kind!(ConfigMap)` implements them for `kinds::ConfigMap`, whose objects
/// are `ConfigMap`s; the kind's module implements [`Downward`] for those.
macro_rules! copied_kind {
    ($kind:ident) => {
        impl $crate::tenancy::tenant::TenantCache for $crate::engine::items::kinds::$kind {
            type Cache = ::kube::runtime::reflector::Store<$kind>;
            type State = ();

            fn watch(tenant: &mut $crate::tenancy::tenant::TenantWatch<'_>) -> Self::Cache {
                tenant.down(Self::KIND)
            }
        }

        impl $crate::cache::super_stores::SuperCache for $crate::engine::items::kinds::$kind {
            type Cache = ::kube::runtime::reflector::Store<$kind>;

            fn watch(supers: &mut $crate::cache::super_stores::SuperWatch<'_>) -> Self::Cache {
                supers.down(Self::KIND)
            }

            fn event_subject(
                cache: &Self::Cache,
                namespace: &str,
                name: &str,
            ) -> $crate::cache::super_stores::EventSubject {
                $crate::cache::super_stores::EventSubject::in_store(cache, namespace, name)
            }
        }

        impl $crate::resources::SyncedKind for $crate::engine::items::kinds::$kind {
            async fn sync_down(
                ctx: &$crate::engine::context::Context,
                tenant: &$crate::tenancy::tenant::Tenant,
                item: &$crate::engine::items::Item,
            ) -> $crate::error::Result<$crate::resources::Outcome> {
                $crate::resources::copy::sync_down::<$kind>(ctx, tenant, item).await
            }

            fn patrol(
                ctx: &$crate::engine::context::Context,
                tenant: &$crate::tenancy::tenant::Tenant,
            ) -> $crate::engine::patrol::findings::Findings {
                $crate::resources::copy::patrol::<$kind>(ctx, tenant)
            }
        }
    };
}
pub(crate) use copied_kind;
