//! IngressClasses labelled `tenancy.x-k8s.io/super.public=true`, when the platform syncs ingresses
//! (`--sync-ingresses`): copied into every tenant, so that its ingresses can name them (and its apiserver
//! defaults to the one the platform marks default).

use k8s_openapi::api::networking::v1::IngressClass;
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

/// Syncs a public super IngressClass into the tenant.
pub async fn ingress_class(ctx: &Context, tenant: &Tenant, name: &str) -> Result<Outcome> {
    let (Some(published), Some(copies)) = (
        ctx.supers.ingress_classes.as_ref(),
        tenant.stores.ingress_classes.as_ref(),
    ) else {
        return Ok(Outcome::InSync);
    };
    let desired = get(published, name).map(|class| IngressClass {
        metadata: ObjectMeta {
            // `ingressclass.kubernetes.io/is-default-class` makes it the tenant's default too.
            annotations: class.metadata.annotations.clone(),
            ..copy_metadata(&class.metadata)
        },
        ..(*class).clone()
    });
    reconcile_copy(ctx, tenant, name, get(copies, name), desired).await
}

impl TenantCache for kinds::IngressClass {
    type Cache = Option<Store<IngressClass>>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant
            .sync_ingresses
            .then(|| tenant.up(Self::KIND, &format!("{LABEL_SYNCED_FROM_SUPER}=true")))
    }
}

impl SuperCache for kinds::IngressClass {
    type Cache = Option<Store<IngressClass>>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        supers.sync_ingresses.then(|| supers.public(Self::KIND))
    }
}

impl SyncedKind for kinds::IngressClass {
    async fn sync_up(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        ingress_class(ctx, tenant, &item.name).await
    }
}
