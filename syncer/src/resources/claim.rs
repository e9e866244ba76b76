//! PersistentVolumeClaims: copied down when they name a published StorageClass (or none while one is the
//! published default), and their status copied back up.

use crds::wellknown::LABEL_SUPER_PUBLIC;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, PersistentVolumeClaimSpec};
use kube::{
    Api, Resource, ResourceExt,
    api::{ObjectMeta, Patch},
    runtime::reflector::{ObjectRef, Store},
};
use serde_json::{Value, json};

use super::{
    copy::{self, Conversion, Downward},
    outcome::Outcome,
    public::is_published,
    synced::SyncedKind,
    upward::{matching_super, params, transparent},
};
use crate::{
    accounting::quota::{ObjectUsage, claim_usage},
    cache::super_stores::{EventSubject, SuperCache, SuperStores, SuperWatch},
    engine::{
        context::Context,
        items::{Item, Kind, kinds},
        patrol::findings::Findings,
    },
    error::{Result, on_tenant},
    tenancy::tenant::{Tenant, TenantCache, TenantStores, TenantWatch},
};

impl Downward for PersistentVolumeClaim {
    const KIND: Kind = Kind::PersistentVolumeClaim;

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        Some(&stores.claims)
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
        Some(&stores.claims)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        let spec = tenant.spec.clone().unwrap_or_default();
        // A claim without a class gets the published default one by name, never whatever default the
        // super cluster has (which may be a class the platform keeps to itself).
        let storage_class_name = spec
            .storage_class_name
            .clone()
            .or_else(|| published_default_class(&cx.ctx.supers));
        // Binding happens in the super cluster: the tenant's volume name refers to a tenant PV.
        let spec = PersistentVolumeClaimSpec {
            volume_name: None,
            storage_class_name,
            ..spec
        };
        Ok(Some(PersistentVolumeClaim {
            metadata: cx.metadata(&tenant.metadata),
            spec: Some(spec),
            status: None,
        }))
    }

    fn creation_refusal(tenant: &Self, cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        let spec = tenant.spec.clone().unwrap_or_default();
        let supers = &cx.ctx.supers;
        let published = |class: &str| is_published_class(supers, class);
        if let Some(why) = class_refusal(
            spec.storage_class_name.as_deref(),
            &published,
            published_default_class(supers).as_deref(),
        ) {
            return Some((
                REASON_STORAGE_CLASS_NOT_PUBLISHED,
                format!("{why}; the claim is not synced (use a StorageClass this cluster lists)"),
            ));
        }
        let refused = binding_refusals(&spec);
        (!refused.is_empty()).then(|| {
            (
                REASON_CLAIM_REFUSED,
                format!(
                    "{}: they would bind volumes the platform keeps to itself; the claim is not synced",
                    refused.join("; ")
                ),
            )
        })
    }

    fn quota_usage(super_object: &Self) -> Option<ObjectUsage> {
        Some(claim_usage(super_object.spec.as_ref()))
    }

    fn view(object: &Self) -> Value {
        let spec = object.spec.clone().unwrap_or_default();
        json!({
            "accessModes": spec.access_modes,
            "requests": spec.resources.and_then(|r| r.requests),
            "storageClassName": spec.storage_class_name,
            "volumeMode": spec.volume_mode.unwrap_or_else(|| "Filesystem".into()),
            "selector": spec.selector,
        })
    }
}

/// Reason of the event on a tenant claim whose StorageClass is not published.
pub const REASON_STORAGE_CLASS_NOT_PUBLISHED: &str = "StorageClassNotPublished";

/// Reason of the event on a tenant claim that selects volumes or names another namespace's data source.
pub const REASON_CLAIM_REFUSED: &str = "ClaimRefused";

/// Why a claim (or a generic ephemeral volume's claim template) may not use the StorageClass it names, or
/// `None` when it may: only published classes, never the empty class (which binds pre-made volumes, all
/// of them the platform's), and without a class only when a published class is the default (a claim
/// without one is given it by name, never whatever default the super cluster has).
pub fn class_refusal(
    class: Option<&str>,
    published: &dyn Fn(&str) -> bool,
    published_default: Option<&str>,
) -> Option<String> {
    match class {
        Some("") => Some(
            "storageClassName \"\" binds pre-made volumes without a class, which belong to the platform"
                .to_owned(),
        ),
        Some(class) if !published(class) => Some(format!(
            "StorageClass {class:?} is not published to tenants (label {LABEL_SUPER_PUBLIC}=true)"
        )),
        Some(_) => None,
        None if published_default.is_some() => None,
        None => Some(format!(
            "the claim names no StorageClass and no published StorageClass (label {LABEL_SUPER_PUBLIC}=true) is the default"
        )),
    }
}

/// The fields of a claim that would bind it to storage the tenant does not own: a `selector` (which only
/// ever matches pre-made volumes, the platform's: dynamic provisioning ignores it) and a data source in
/// another namespace (`dataSourceRef.namespace`). A `volumeName` is not among them: the syncer drops it
/// (it names one of the tenant's own PersistentVolume copies).
pub fn binding_refusals(spec: &PersistentVolumeClaimSpec) -> Vec<String> {
    let mut refused = Vec::new();
    if spec.selector.is_some() {
        refused.push("selector (binds pre-made volumes)".to_owned());
    }
    if let Some(namespace) = spec.data_source_ref.as_ref().and_then(|r| r.namespace.as_deref()) {
        refused.push(format!(
            "dataSourceRef.namespace {namespace:?} (another namespace's data)"
        ));
    }
    refused
}

/// Annotation marking a StorageClass as the default.
const ANNOTATION_DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";

/// Whether a StorageClass is published to tenants (the super cache holds only those, but a class can lose
/// its label between the list and a look-up).
pub fn is_published_class(supers: &SuperStores, name: &str) -> bool {
    supers
        .storage_classes
        .get(&ObjectRef::new(name))
        .is_some_and(|class| is_published(&class.metadata))
}

/// The published StorageClass marked default, when exactly one is (the apiserver's own rule picks the
/// newest of several; the syncer does not guess).
pub fn published_default_class(supers: &SuperStores) -> Option<String> {
    let defaults: Vec<String> = supers
        .storage_classes
        .state()
        .iter()
        .filter(|class| is_published(&class.metadata))
        .filter(|class| {
            class
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(ANNOTATION_DEFAULT_CLASS))
                .is_some_and(|v| v == "true")
        })
        .map(|class| class.name_any())
        .collect();
    match defaults.as_slice() {
        [only] => Some(only.clone()),
        _ => None,
    }
}

/// Syncs one tenant claim up: its status as the super claim reports it.
pub async fn claim(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str) -> Result<Outcome> {
    let Some(tenant_claim) = tenant.stores.claims.get(&ObjectRef::new(name).within(namespace)) else {
        return Ok(Outcome::InSync);
    };
    let super_namespace = tenant.identity.super_namespace(namespace);
    let super_claim = ctx
        .supers
        .claims
        .get(&ObjectRef::new(name).within(&super_namespace));
    let Some(super_claim) = matching_super(super_claim, tenant, tenant_claim.uid()) else {
        return Ok(Outcome::InSync);
    };
    let Some(status) = super_claim.status.clone() else {
        return Ok(Outcome::InSync);
    };
    let current = tenant_claim.status.clone().unwrap_or_default();
    let mut writes = 0;
    if status.phase != current.phase
        || status.capacity != current.capacity
        || status.access_modes != current.access_modes
    {
        let patch = PersistentVolumeClaim {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            spec: None,
            status: Some(k8s_openapi::api::core::v1::PersistentVolumeClaimStatus {
                phase: status.phase,
                capacity: status.capacity,
                access_modes: status.access_modes,
                conditions: status.conditions,
                ..Default::default()
            }),
        };
        let api: Api<PersistentVolumeClaim> = Api::namespaced(tenant.client.clone(), namespace);
        api.patch_status(name, &params(), &Patch::Apply(&patch))
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("updating status of claim {namespace}/{name}"),
            ))?;
        ctx.metrics.resources.tenant_write("persistentvolumeclaim", "status");
        writes += 1;
    }
    writes +=
        transparent::<PersistentVolumeClaim>(ctx, tenant, tenant_claim.meta(), super_claim.meta()).await?;
    Ok(match writes {
        0 => Outcome::InSync,
        writes => Outcome::Updated { writes },
    })
}

impl TenantCache for kinds::PersistentVolumeClaim {
    type Cache = Store<PersistentVolumeClaim>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.down(Self::KIND)
    }
}

impl SuperCache for kinds::PersistentVolumeClaim {
    type Cache = Store<PersistentVolumeClaim>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        // Claims count against the tenant's object quotas: the ledger follows them too.
        supers.counted(Self::KIND, |o: &PersistentVolumeClaim| {
            claim_usage(o.spec.as_ref())
        })
    }

    fn event_subject(cache: &Self::Cache, namespace: &str, name: &str) -> EventSubject {
        EventSubject::in_store(cache, namespace, name)
    }
}

impl SyncedKind for kinds::PersistentVolumeClaim {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        copy::sync_down::<PersistentVolumeClaim>(ctx, tenant, item).await
    }

    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        claim(ctx, tenant, &item.namespace, &item.name).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        copy::patrol::<PersistentVolumeClaim>(ctx, tenant)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claim_views_ignore_the_default_volume_mode() {
        let desired: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
        }))
        .expect("pvc");
        let mut stored = desired.clone();
        stored.spec.as_mut().expect("spec").volume_mode = Some("Filesystem".into());
        stored.spec.as_mut().expect("spec").volume_name = Some("pv-1".into());
        assert_eq!(
            PersistentVolumeClaim::view(&desired),
            PersistentVolumeClaim::view(&stored)
        );
    }

    mod refusals {
        use k8s_openapi::api::storage::v1::StorageClass;

        use super::*;
        use crate::{
            engine::{
                context::testing::{self, from_json, put},
                items::{DownItem, Kind},
            },
            resources::copy::sync_down,
            tenancy::settings::TenantSettings,
        };

        fn claim(name: &str, class: Value) -> PersistentVolumeClaim {
            let mut claim = json!({"metadata": {"name": name, "namespace": "shop", "uid": format!("{name}-uid")},
                "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}});
            if !class.is_null() {
                claim["spec"]["storageClassName"] = class;
            }
            from_json(claim)
        }

        #[tokio::test]
        async fn claims_of_unpublished_classes_are_not_written() {
            let (super_client, mut supers) = testing::mock();
            let (tenant_client, mut tenants) = testing::mock();
            let (ctx, mut super_caches) = testing::context(super_client);
            let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
            // The cache lists only published classes; one that lost its label meanwhile does not count.
            put(
                &mut super_caches.storage_classes,
                from_json::<StorageClass>(json!({"metadata": {"name": "stale"}, "provisioner": "x"})),
            );
            for (name, class, says) in [
                (
                    "private",
                    json!("private"),
                    "StorageClass \"private\" is not published",
                ),
                ("stale", json!("stale"), "StorageClass \"stale\" is not published"),
                ("premade", json!(""), "binds pre-made volumes"),
                ("default", Value::Null, "no published StorageClass"),
            ] {
                put(&mut caches.claims, claim(name, class));
                let item = DownItem::new(Kind::PersistentVolumeClaim, "shop", name);
                testing::refused_with_event(
                    sync_down::<PersistentVolumeClaim>(&ctx, &tenant, &item),
                    &mut tenants,
                    REASON_STORAGE_CLASS_NOT_PUBLISHED,
                    says,
                )
                .await;
            }
            supers.idle().await;
            tenants.idle().await;

            // A published default class is named explicitly on a claim without one.
            put(
                &mut super_caches.storage_classes,
                from_json::<StorageClass>(json!({"metadata": {"name": "shared",
                    "labels": {LABEL_SUPER_PUBLIC: "true"},
                    "annotations": {ANNOTATION_DEFAULT_CLASS: "true"}}, "provisioner": "x"})),
            );
            let cx = Conversion {
                tenant: &tenant,
                ctx: &ctx,
                meta: &Default::default(),
                super_namespace: "team-abc123-vc-shop",
            };
            let desired = PersistentVolumeClaim::to_super(&claim("default", Value::Null), &cx)
                .expect("converted")
                .expect("synced");
            assert_eq!(
                desired.spec.and_then(|s| s.storage_class_name).as_deref(),
                Some("shared")
            );
            assert_eq!(
                PersistentVolumeClaim::refusal(&claim("default", Value::Null), &cx),
                None
            );
        }
    }
}
