//! Ingresses, when the platform syncs them (`--sync-ingresses`): copied down as they are.

use k8s_openapi::api::networking::v1::Ingress;
use kube::runtime::reflector::Store;
use serde_json::Value;

use super::{
    copy::{self, Conversion, Downward},
    outcome::Outcome,
    synced::SyncedKind,
};
use crate::{
    context::Context,
    error::Result,
    findings::Findings,
    items::{Item, Kind, kinds},
    super_stores::{SuperCache, SuperStores, SuperWatch},
    tenant::{Tenant, TenantCache, TenantStores, TenantWatch},
};

impl Downward for Ingress {
    const KIND: Kind = Kind::Ingress;

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        stores.ingresses.as_ref()
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
        stores.ingresses.as_ref()
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        Ok(Some(Ingress {
            metadata: cx.metadata(&tenant.metadata),
            spec: tenant.spec.clone(),
            status: None,
        }))
    }

    fn view(object: &Self) -> Value {
        serde_json::to_value(&object.spec).unwrap_or(Value::Null)
    }
}

impl TenantCache for kinds::Ingress {
    type Cache = Option<Store<Ingress>>;

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.sync_ingresses.then(|| tenant.down(Self::KIND))
    }
}

impl SuperCache for kinds::Ingress {
    type Cache = Option<Store<Ingress>>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        supers.sync_ingresses.then(|| supers.down(Self::KIND))
    }
}

impl SyncedKind for kinds::Ingress {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        copy::sync_down::<Ingress>(ctx, tenant, item).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        copy::patrol::<Ingress>(ctx, tenant)
    }
}
