//! StorageClasses labelled `tenancy.x-k8s.io/super.public=true`: copied into every tenant, so that its
//! claims can name them.

use k8s_openapi::api::storage::v1::StorageClass;
use kube::{api::ObjectMeta, runtime::reflector::Store};

use super::{
    outcome::Outcome,
    public::{copy_metadata, get, reconcile_copy},
    synced::SyncedKind,
};
use crate::{
    cache::super_stores::{SuperCache, SuperWatch},
    engine::{
        context::Context,
        items::{Item, kinds},
    },
    error::Result,
    tenancy::tenant::{LABEL_SYNCED_FROM_SUPER, Tenant, TenantCache, TenantWatch},
};

/// Syncs a public super StorageClass into the tenant.
pub async fn storage_class(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let desired = get(&ctx.supers.storage_classes, name).map(|sc| StorageClass {
        metadata: ObjectMeta {
            annotations: sc.metadata.annotations.clone(),
            ..copy_metadata(&sc.metadata)
        },
        ..(*sc).clone()
    });
    reconcile_copy(
        ctx,
        tenant,
        name,
        get(&tenant.stores.storage_classes, name),
        desired,
    )
    .await
}

impl TenantCache for kinds::StorageClass {
    type Cache = Store<StorageClass>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.up(Self::KIND, &format!("{LABEL_SYNCED_FROM_SUPER}=true"))
    }
}

impl SuperCache for kinds::StorageClass {
    type Cache = Store<StorageClass>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        supers.public(Self::KIND)
    }
}

impl SyncedKind for kinds::StorageClass {
    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        storage_class(ctx, tenant, &item.name).await
    }
}
