//! PersistentVolumes: a super volume bound to a tenant's claim is copied into the tenant, bound to the
//! tenant claim, without anything of how or where it is stored.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, ObjectReference, PersistentVolume, PersistentVolumeSpec,
};
use kube::{
    Resource, ResourceExt,
    api::ObjectMeta,
    runtime::{
        reflector::{ObjectRef, Store},
        watcher,
    },
};

use super::{
    outcome::Outcome,
    public::{get, reconcile_copy},
    synced::SyncedKind,
};
use crate::{
    cache::super_stores::{SuperCache, SuperWatch},
    engine::{
        context::Context,
        items::{Item, Kind, UpItem, kinds},
    },
    error::Result,
    tenancy::{
        identity,
        tenant::{LABEL_SYNCED_FROM_SUPER, Tenant, TenantCache, TenantWatch},
    },
};

/// Syncs a super PersistentVolume bound to one of the tenant's claims into the tenant, bound to the
/// tenant claim (see [`tenant_volume`] for what the copy carries).
pub async fn volume(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let desired = get(&ctx.supers.volumes, name).and_then(|pv| {
        let claim = pv.spec.as_ref()?.claim_ref.clone()?;
        let super_namespace = ctx
            .supers
            .namespaces
            .store
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
        let claim_ref = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(tenant_namespace),
            name: Some(claim_name),
            uid: tenant_claim.uid(),
            ..Default::default()
        };
        Some(tenant_volume(&pv, claim_ref))
    });
    reconcile_copy(ctx, tenant, name, get(&tenant.stores.volumes, name), desired).await
}

/// CSI driver named as the source of every tenant copy of a volume. No node runs it: the tenant's pods run
/// on super nodes, against the super volume; the copy only lets the tenant's claim show as bound.
pub const TENANT_VOLUME_DRIVER: &str = "super-volume.tenancy.x-k8s.io";

/// The tenant's copy of a super volume bound to `claim_ref`: what the tenant needs to see its claim bound
/// (capacity, access modes, class, volume mode, claim) and nothing of how or where the volume is stored.
/// The source, its volume attributes, secret references, server addresses, mount options, node affinity,
/// labels and annotations stay in the super cluster; an apiserver requires one source, so the copy names a
/// placeholder driver with the volume's name as its handle. The copy keeps `Retain`: deleting it must never
/// reach the real volume. Its phase is the tenant's own controllers' business, as for any bound volume.
pub fn tenant_volume(pv: &PersistentVolume, claim_ref: ObjectReference) -> PersistentVolume {
    let source = pv.spec.clone().unwrap_or_default();
    let spec = PersistentVolumeSpec {
        capacity: source.capacity,
        access_modes: source.access_modes,
        storage_class_name: source.storage_class_name,
        volume_mode: source.volume_mode,
        claim_ref: Some(claim_ref),
        persistent_volume_reclaim_policy: Some("Retain".into()),
        csi: Some(CSIPersistentVolumeSource {
            driver: TENANT_VOLUME_DRIVER.into(),
            volume_handle: pv.name_any(),
            ..Default::default()
        }),
        ..Default::default()
    };
    PersistentVolume {
        metadata: ObjectMeta {
            name: pv.metadata.name.clone(),
            labels: Some(std::collections::BTreeMap::from([(
                LABEL_SYNCED_FROM_SUPER.to_owned(),
                "true".to_owned(),
            )])),
            ..Default::default()
        },
        spec: Some(spec),
        status: None,
    }
}

impl TenantCache for kinds::PersistentVolume {
    type Cache = Store<PersistentVolume>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.up(Self::KIND, &format!("{LABEL_SYNCED_FROM_SUPER}=true"))
    }
}

impl SuperCache for kinds::PersistentVolume {
    type Cache = Store<PersistentVolume>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        let (queue, namespaces) = (supers.queues.up.clone(), supers.namespaces.clone());
        supers.watch(watcher::Config::default(), move |pv: &PersistentVolume| {
            let claim_namespace = pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|c| c.namespace.clone());
            let Some(claim_namespace) = claim_namespace else {
                return;
            };
            let Some(ns) = namespaces.get(&ObjectRef::new(&claim_namespace)) else {
                return;
            };
            if let Some(tenant) = identity::owner_cluster(ns.meta()) {
                queue.add(
                    &std::sync::Arc::from(tenant),
                    UpItem::cluster(Kind::PersistentVolume, &pv.name_any()),
                );
            }
        })
    }
}

impl SyncedKind for kinds::PersistentVolume {
    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        volume(ctx, tenant, &item.name).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A volume with every kind of detail a tenant must not see: the copy keeps none of it.
    #[test]
    fn a_tenant_volume_carries_no_storage_details() {
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv-1", "labels": {"topology.example.com/rack": "r7"},
                "annotations": {"pv.kubernetes.io/provisioned-by": "nfs.example.com"}},
            "spec": {
                "capacity": {"storage": "5Gi"}, "accessModes": ["ReadWriteMany"],
                "storageClassName": "shared", "volumeMode": "Filesystem",
                "persistentVolumeReclaimPolicy": "Delete", "mountOptions": ["nfsvers=4.1"],
                "csi": {"driver": "nfs.csi.k8s.io", "volumeHandle": "10.1.2.3#/exports/team-a",
                    "volumeAttributes": {"server": "10.1.2.3", "share": "/exports/team-a"},
                    "nodePublishSecretRef": {"name": "nfs-creds", "namespace": "storage"}},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "topology.example.com/rack", "operator": "In", "values": ["r7"]}]}]}},
                "claimRef": {"namespace": "super-ns", "name": "data", "uid": "super-uid"}
            }
        }))
        .expect("pv");
        let claim = ObjectReference {
            namespace: Some("shop".into()),
            name: Some("data".into()),
            uid: Some("tenant-uid".into()),
            ..Default::default()
        };
        let copy = tenant_volume(&pv, claim.clone());
        let spec = copy.spec.as_ref().expect("spec");
        assert_eq!(spec.capacity, pv.spec.as_ref().and_then(|s| s.capacity.clone()));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteMany".to_owned()]));
        assert_eq!(spec.storage_class_name.as_deref(), Some("shared"));
        assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
        assert_eq!(spec.claim_ref.as_ref(), Some(&claim));
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
        let json = serde_json::to_string(&copy).expect("json");
        for detail in ["10.1.2.3", "exports", "nfs", "rack", "super-ns", "super-uid"] {
            assert!(!json.contains(detail), "{detail} reached the tenant: {json}");
        }
        let csi = spec.csi.as_ref().expect("placeholder source");
        assert_eq!(
            (csi.driver.as_str(), csi.volume_handle.as_str()),
            (TENANT_VOLUME_DRIVER, "pv-1")
        );
    }
}
