//! ServiceAccounts: copied down without tokens of the super cluster (pods get tenant tokens from the
//! syncer).

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::runtime::reflector::Store;
use serde_json::{Value, json};

use super::copy::{Conversion, Downward, copied_kind};
use crate::{
    cache::super_stores::SuperStores,
    engine::items::Kind,
    error::Result,
    tenancy::tenant::TenantStores,
};

impl Downward for ServiceAccount {
    const KIND: Kind = Kind::ServiceAccount;

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        Some(&stores.service_accounts)
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
        Some(&stores.service_accounts)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        // Pods get tenant tokens from the syncer; a super token for this account would be a super-cluster
        // credential.
        Ok(Some(ServiceAccount {
            metadata: cx.metadata(&tenant.metadata),
            automount_service_account_token: Some(false),
            image_pull_secrets: tenant.image_pull_secrets.clone(),
            secrets: None,
        }))
    }

    fn view(object: &Self) -> Value {
        json!({ "automount": object.automount_service_account_token, "imagePullSecrets": object.image_pull_secrets })
    }
}

copied_kind!(ServiceAccount);
