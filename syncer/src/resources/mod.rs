//! Syncing each kind of object, down and up.
//!
//! Namespaced kinds that are copied with little change share one engine ([`sync_down`]) driven by the
//! [`Downward`] trait; namespaces and pods have their own modules, as does everything that flows up.

pub mod access;
pub mod kinds;
pub mod namespace;
pub mod network;
pub mod pod;
pub mod public;
pub mod up;
pub mod vnode;

use std::fmt::Debug;

use k8s_openapi::{NamespaceResourceScope, api::core::v1::ObjectReference};
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, Preconditions},
    runtime::reflector::{ObjectRef, Store},
};
use serde::{Serialize, de::DeserializeOwned};

use crate::{
    context::Context,
    error::{Error, Result, on_super},
    events,
    identity::{self, TenantIdentity},
    items::{DownItem, Kind, UpItem},
    quota::ObjectUsage,
    super_stores::SuperStores,
    tenant::{Tenant, TenantStores},
};

/// What a reconcile did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Created the super object (`writes` API writes in all).
    Created {
        /// Writes made.
        writes: u32,
    },
    /// Brought the super object in line.
    Updated {
        /// Writes made.
        writes: u32,
    },
    /// Deleted the super object.
    Deleted,
    /// Nothing to do.
    InSync,
    /// Held back; retried when something changes (or after the given delay).
    Waiting {
        /// Why, for logs.
        reason: String,
        /// Look again after this long, if nothing else queues the item first.
        retry_after: Option<std::time::Duration>,
    },
}

impl Outcome {
    /// API writes to the super cluster.
    pub fn writes(&self) -> u32 {
        match self {
            Outcome::Created { writes } | Outcome::Updated { writes } => *writes,
            Outcome::Deleted => 1,
            Outcome::InSync | Outcome::Waiting { .. } => 0,
        }
    }
}

/// What conversions may consult.
pub struct Conversion<'a> {
    /// The syncer's flags and super-cluster caches.
    pub ctx: &'a Context,
    /// The tenant.
    pub tenant: &'a Tenant,
    /// Super-owned prefixes.
    pub opaque_prefixes: &'a [String],
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
            self.opaque_prefixes,
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

/// Server-side applies `desired`; with `uid`, only onto the object with that uid.
/// Forced: for objects the syncer builds whole (pods, token Secrets, isolating NetworkPolicies); copies
/// of tenant objects go through [`apply_copy`], which never forces labels and annotations.
pub async fn apply<K>(ctx: &Context, api: &Api<K>, desired: K, uid: Option<String>) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    apply_with(ctx, api, desired, uid, true).await
}

async fn apply_with<K>(
    ctx: &Context,
    api: &Api<K>,
    mut desired: K,
    uid: Option<String>,
    force: bool,
) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    desired.meta_mut().uid = uid;
    let name = desired.name_any();
    let resource = K::plural(&()).into_owned();
    let mut params = PatchParams::apply(crds::wellknown::FIELD_MANAGER_SYNCER);
    params.force = force;
    let result = api
        .patch(&name, &params, &Patch::Apply(&desired))
        .await
        .map_err(on_super(format!(
            "applying {resource} {}/{name}",
            desired.namespace().unwrap_or_default()
        )));
    ctx.metrics.super_write(kind_label::<K>(), "apply");
    result
}

/// Reason of the event on a tenant object some of whose labels or annotations another field manager of
/// the super cluster owns on its copy.
pub const REASON_METADATA_WITHHELD: &str = "MetadataWithheld";

/// Server-side applies the super copy of a tenant object without forcing first: labels and annotations
/// the tenant chose that another field manager of the super cluster owns stay that manager's. They are
/// withheld (left off, recorded in [`identity::ANNOTATION_WITHHELD`]) with a `MetadataWithheld` event on
/// the tenant object, and the rest is applied. Every other field of the copy is the tenant's desired
/// state, which the syncer repairs: a conflict there (someone edited the copy) is forced.
pub async fn apply_copy<K>(
    ctx: &Context,
    tenant: &Tenant,
    tenant_object: Option<&ObjectReference>,
    api: &Api<K>,
    desired: K,
    uid: Option<String>,
) -> Result<K>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let error = match apply_with(ctx, api, desired.clone(), uid.clone(), false).await {
        Ok(applied) => return Ok(applied),
        Err(error) => error,
    };
    let Some(conflicts) = error.apply_conflicts() else {
        return Err(error);
    };
    let (withheld, repaired): (Vec<_>, Vec<_>) = conflicts
        .iter()
        .map(|(field, manager)| (identity::withholdable_key(field), field, manager))
        .partition(|(key, _, _)| key.is_some());
    let name = format!(
        "{}/{}",
        desired.namespace().unwrap_or_default(),
        desired.name_any()
    );
    let mut rest = desired;
    if !withheld.is_empty() {
        let keys: Vec<String> = withheld.iter().filter_map(|(key, _, _)| key.clone()).collect();
        let described: Vec<String> = withheld
            .iter()
            .map(|(_, field, manager)| format!("{field} ({manager})"))
            .collect();
        tracing::warn!(
            tenant = %tenant.identity.vc_ref(),
            kind = %K::kind(&()),
            object = %name,
            withheld = %keys.join(","),
            conflicts = %described.join(", "),
            "MetadataWithheld: labels or annotations another field manager owns are left as they are"
        );
        if let Some(reference) = tenant_object {
            let message = format!(
                "not copied to the super cluster, where another manager owns them: {}",
                described.join(", ")
            );
            events::warn(tenant, reference, REASON_METADATA_WITHHELD, &message).await;
        }
        identity::withhold(rest.meta_mut(), &keys);
    }
    if !repaired.is_empty() {
        tracing::info!(
            tenant = %tenant.identity.vc_ref(),
            kind = %K::kind(&()),
            object = %name,
            fields = %repaired.iter().map(|(_, f, m)| format!("{f} ({m})")).collect::<Vec<_>>().join(", "),
            "taking back fields of a super copy that someone else changed"
        );
    }
    apply_with(ctx, api, rest, uid, !repaired.is_empty()).await
}

/// An object the syncer alone keeps in a super namespace beside the copies (the isolating NetworkPolicy,
/// vn-agent's RoleBinding), by its cached state.
pub struct Kept<'a, K> {
    /// Its name.
    pub name: &'a str,
    /// As the cache shows it.
    pub existing: Option<std::sync::Arc<K>>,
    /// As it should be; `None` when the flags say there is none.
    pub desired: Option<K>,
    /// Whether a cached object is the syncer's (and may be deleted when none is desired).
    pub ours: fn(&K) -> bool,
    /// Whether the cached object is the desired one.
    pub in_sync: fn(&K, &K) -> bool,
    /// Whether the cached object cannot become the desired one in place (it is deleted first).
    pub replaced: fn(&K, &K) -> bool,
}

/// Brings a [`Kept`] object in line: applied with force when it differs (it is the syncer's alone, and
/// whoever changed it is overruled), the syncer's deleted when none is desired. Returns the writes made.
pub async fn keep<K>(ctx: &Context, api: &Api<K>, kept: Kept<'_, K>) -> Result<u32>
where
    K: Resource<DynamicType = ()> + Clone + Debug + Serialize + DeserializeOwned,
{
    let Kept {
        name,
        existing,
        desired,
        ours,
        in_sync,
        replaced,
    } = kept;
    let Some(desired) = desired else {
        return match existing {
            Some(existing) if ours(&existing) => {
                delete(ctx, api, name, existing.uid(), None).await?;
                Ok(1)
            }
            _ => Ok(0),
        };
    };
    if let Some(existing) = &existing {
        if in_sync(&desired, existing) {
            return Ok(0);
        }
        if replaced(&desired, existing) {
            delete(ctx, api, name, existing.uid(), None).await?;
        }
    }
    apply(ctx, api, desired, None).await?;
    Ok(1)
}

/// Deletes a super object, only if it still has `uid`.
pub async fn delete<K>(
    ctx: &Context,
    api: &Api<K>,
    name: &str,
    uid: Option<String>,
    grace: Option<u32>,
) -> Result<()>
where
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned,
{
    let params = DeleteParams {
        preconditions: uid.map(|uid| Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        grace_period_seconds: grace,
        ..Default::default()
    };
    ctx.metrics.super_write(kind_label::<K>(), "delete");
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        // Gone already, or replaced by another object (whose sync will follow): nothing to do.
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(()),
        Err(source) => Err(Error::Super {
            context: format!("deleting {} {name}", K::plural(&())),
            source,
        }),
    }
}

/// The metric label of a kind.
pub fn kind_label<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()).as_ref() {
        "Namespace" => "namespace",
        "Pod" => "pod",
        "Service" => "service",
        "Endpoints" => "endpoints",
        "ConfigMap" => "configmap",
        "Secret" => "secret",
        "ServiceAccount" => "serviceaccount",
        "PersistentVolumeClaim" => "persistentvolumeclaim",
        "Ingress" => "ingress",
        "NetworkPolicy" => "networkpolicy",
        "PodDisruptionBudget" => "poddisruptionbudget",
        "Node" => "node",
        "PersistentVolume" => "persistentvolume",
        "StorageClass" => "storageclass",
        "PriorityClass" => "priorityclass",
        "Event" => "event",
        _ => "other",
    }
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
    let opaque = ctx.opaque_prefixes(&settings.opaque_prefixes);
    let cx = Conversion {
        ctx,
        tenant,
        opaque_prefixes: &opaque,
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
            match existing {
                Some(existing) if identity::tenant_uid(existing.meta()) != tenant_uid.as_deref() => {
                    // The tenant object was recreated: the old copy goes first, the new one follows when
                    // the deletion shows in the cache (which queues this item again).
                    delete(ctx, &api, &item.name, existing.uid(), None).await?;
                    Ok(Outcome::Deleted)
                }
                Some(existing) if in_sync(&desired, &existing) => Ok(Outcome::InSync),
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
                        && let Some((reason, message)) = K::creation_refusal(object, &cx)
                    {
                        tracing::warn!(
                            tenant = %tenant.identity.vc_ref(),
                            kind = %K::KIND,
                            namespace = %item.namespace,
                            name = %item.name,
                            reason,
                            "{message}"
                        );
                        ctx.metrics.refused(kind_label::<K>(), reason);
                        events::warn(tenant, &object.object_ref(&()), reason, &message).await;
                        return Ok(Outcome::Waiting {
                            reason: message,
                            retry_after: None,
                        });
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
    ctx.metrics.refused(kind_label::<K>(), pod::REASON_QUOTA_EXCEEDED);
    if let Some(object) = tenant_object {
        events::warn(
            tenant,
            &object.object_ref(&()),
            pod::REASON_QUOTA_EXCEEDED,
            &message,
        )
        .await;
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
