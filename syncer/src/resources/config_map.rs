//! ConfigMaps: copied down as they are, except each namespace's `kube-root-ca.crt` (the super cluster
//! publishes its own under that name; tenant pods get the tenant CA through their token Secret instead).

use crds::wellknown::ROOT_CA_CONFIG_MAP;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::{ResourceExt, runtime::reflector::Store};
use serde_json::{Value, json};

use super::copy::{Conversion, Downward, copied_kind};
use crate::{
    cache::super_stores::SuperStores,
    engine::items::Kind,
    error::Result,
    tenancy::tenant::TenantStores,
};

impl Downward for ConfigMap {
    const KIND: Kind = Kind::ConfigMap;

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        Some(&stores.config_maps)
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
        Some(&stores.config_maps)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        if tenant.name_any() == ROOT_CA_CONFIG_MAP {
            return Ok(None);
        }
        Ok(Some(ConfigMap {
            metadata: cx.metadata(&tenant.metadata),
            data: tenant.data.clone(),
            binary_data: tenant.binary_data.clone(),
            immutable: tenant.immutable,
        }))
    }

    fn view(object: &Self) -> Value {
        json!({ "data": object.data, "binaryData": object.binary_data, "immutable": object.immutable.unwrap_or(false) })
    }
}

copied_kind!(ConfigMap);
