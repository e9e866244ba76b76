//! Secrets: copied down, legacy service-account token Secrets as Opaque ones. Pods' token Secrets, which
//! the syncer makes itself, are the tokens' ([`crate::tokens`]); tenant Secrets of their names are not
//! copied.

use crds::wellknown::{LABEL_POD_TOKEN, LABEL_VC_NAME};
use k8s_openapi::api::core::v1::Secret;
use kube::runtime::{reflector::Store, watcher};
use serde_json::{Value, json};

use super::{
    copy::{self, Conversion, Downward},
    outcome::Outcome,
    synced::SyncedKind,
};
use crate::{
    cache::super_stores::{EventSubject, SuperCache, SuperStores, SuperWatch, tenant_key},
    engine::{
        context::Context,
        items::{Item, Kind, kinds},
        patrol::findings::Findings,
    },
    error::Result,
    tenancy::tenant::{Tenant, TenantCache, TenantStores, TenantWatch},
    tokens::mounts::is_reserved_secret_name,
};

/// Type of legacy service-account token Secrets; their copies are Opaque (the super cluster's token
/// controller would otherwise rewrite them).
const SERVICE_ACCOUNT_TOKEN: &str = "kubernetes.io/service-account-token";

/// Reason of the event on a tenant Secret whose name the syncer keeps for pods' token Secrets.
pub const REASON_RESERVED_NAME: &str = "ReservedName";

impl Downward for Secret {
    const KIND: Kind = Kind::Secret;

    fn tenant_store(stores: &TenantStores) -> Option<&Store<Self>> {
        Some(&stores.secrets)
    }

    fn super_store(stores: &SuperStores) -> Option<&Store<Self>> {
        Some(&stores.secrets)
    }

    fn to_super(tenant: &Self, cx: &Conversion<'_>) -> Result<Option<Self>> {
        let type_ = match tenant.type_.as_deref() {
            Some(SERVICE_ACCOUNT_TOKEN) => Some("Opaque".to_owned()),
            other => other.map(str::to_owned),
        };
        Ok(Some(Secret {
            metadata: cx.metadata(&tenant.metadata),
            data: tenant.data.clone(),
            string_data: None,
            immutable: tenant.immutable,
            type_,
        }))
    }

    fn creation_refusal(tenant: &Self, _cx: &Conversion<'_>) -> Option<(&'static str, String)> {
        let name = tenant.metadata.name.as_deref().unwrap_or_default();
        is_reserved_secret_name(name).then(|| {
            (
                REASON_RESERVED_NAME,
                format!(
                    "Secret names ending in .vc-token or .vc-tokens are the syncer's, for pods' service-account tokens; {name:?} is not synced"
                ),
            )
        })
    }

    fn view(object: &Self) -> Value {
        json!({
            "data": object.data,
            "type": object.type_.as_deref().unwrap_or("Opaque"),
            "immutable": object.immutable.unwrap_or(false),
        })
    }
}

impl TenantCache for kinds::Secret {
    type Cache = Store<Secret>;
    type State = ();

    fn watch(tenant: &mut TenantWatch<'_>) -> Self::Cache {
        tenant.down(Self::KIND)
    }
}

impl SuperCache for kinds::Secret {
    type Cache = Store<Secret>;

    fn watch(supers: &mut SuperWatch<'_>) -> Self::Cache {
        // Pod token Secrets are watched apart, metadata only (see `super::pod::SuperPods`).
        let selector = format!("{LABEL_VC_NAME},!{LABEL_POD_TOKEN}");
        let queue = supers.queues.down.clone();
        supers.watch(
            watcher::Config::default().labels(&selector),
            move |secret: &Secret| {
                if let Some((tenant, namespace, name)) = tenant_key(secret) {
                    queue.add(&tenant, Item::new(Kind::Secret, &namespace, &name));
                }
            },
        )
    }

    fn event_subject(cache: &Self::Cache, namespace: &str, name: &str) -> EventSubject {
        EventSubject::in_store(cache, namespace, name)
    }
}

impl SyncedKind for kinds::Secret {
    async fn sync_down(ctx: &Context, tenant: &Tenant, item: &Item) -> Result<Outcome> {
        copy::sync_down::<Secret>(ctx, tenant, item).await
    }

    fn patrol(ctx: &Context, tenant: &Tenant) -> Findings {
        copy::patrol::<Secret>(ctx, tenant)
    }
}
