//! PriorityClasses labelled `tenancy.x-k8s.io/super.public=true`: copied into every tenant, so that its
//! pods can name them.

use k8s_openapi::api::scheduling::v1::PriorityClass;
use kube::runtime::reflector::Store;

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

/// Syncs a public super PriorityClass into the tenant.
pub async fn priority_class(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let desired = get(&ctx.supers.priority_classes, name).map(|pc| PriorityClass {
        metadata: copy_metadata(&pc.metadata),
        ..(*pc).clone()
    });
    reconcile_copy(
        ctx,
        tenant,
        name,
        get(&tenant.stores.priority_classes, name),
        desired,
    )
    .await
}

impl TenantCache for kinds::PriorityClass {
    type Cache = Store<PriorityClass>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.up(Self::KIND, &format!("{LABEL_SYNCED_FROM_SUPER}=true"))
    }
}

impl SuperCache for kinds::PriorityClass {
    type Cache = Store<PriorityClass>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        supers.public(Self::KIND)
    }
}

impl SyncedKind for kinds::PriorityClass {
    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        priority_class(ctx, tenant, &item.name).await
    }
}
