//! PodDisruptionBudgets, when the platform syncs them: copied down so that drains of super nodes respect
//! tenant budgets.

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
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

impl Downward for PodDisruptionBudget {
    const KIND: Kind = Kind::PodDisruptionBudget;

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        Some(&stores.disruption_budgets)
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
        Some(&stores.disruption_budgets)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        // The selector matches the super pods as it matches the tenant's: super pods carry the tenant
        // pods' labels, and a namespaced budget only ever selects pods of its own (super) namespace. The
        // status is the super cluster's disruption controller's; the tenant's own computes the tenant's.
        if !cx.ctx.config.sync_disruption_budgets {
            return Ok(None);
        }
        Ok(Some(PodDisruptionBudget {
            metadata: cx.metadata(&tenant.metadata),
            spec: tenant.spec.clone(),
            status: None,
        }))
    }

    fn view(object: &Self) -> Value {
        serde_json::to_value(&object.spec).unwrap_or(Value::Null)
    }
}

impl TenantCache for kinds::PodDisruptionBudget {
    type Cache = Store<PodDisruptionBudget>;

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.down(Self::KIND)
    }
}

impl SuperCache for kinds::PodDisruptionBudget {
    type Cache = Store<PodDisruptionBudget>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        supers.down(Self::KIND)
    }
}

impl SyncedKind for kinds::PodDisruptionBudget {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        copy::sync_down::<PodDisruptionBudget>(ctx, tenant, item).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        copy::patrol::<PodDisruptionBudget>(ctx, tenant)
    }
}
