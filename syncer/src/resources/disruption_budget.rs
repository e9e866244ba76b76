//! PodDisruptionBudgets, when the platform syncs them: copied down so that drains of super nodes respect
//! tenant budgets.

use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::runtime::reflector::Store;
use serde_json::Value;

use super::copy::{Conversion, Downward, copied_kind};
use crate::{
    cache::super_stores::SuperStores,
    engine::items::Kind,
    error::Result,
    tenancy::tenant::TenantStores,
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
        // pods' labels (by the keys `map_selector` names), and a namespaced budget only ever selects pods
        // of its own (super) namespace. The status is the super cluster's disruption controller's; the
        // tenant's own computes the tenant's.
        if !cx.ctx.config.sync_disruption_budgets {
            return Ok(None);
        }
        let mut spec = tenant.spec.clone();
        if let Some(selector) = spec.as_mut().and_then(|s| s.selector.as_mut()) {
            *selector = crate::tenancy::identity::map_selector(selector, cx.meta, false);
        }
        Ok(Some(PodDisruptionBudget {
            metadata: cx.metadata(&tenant.metadata),
            spec,
            status: None,
        }))
    }

    fn view(object: &Self) -> Value {
        serde_json::to_value(&object.spec).unwrap_or(Value::Null)
    }
}

copied_kind!(PodDisruptionBudget);
