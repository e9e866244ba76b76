//! Minting: TokenRequests to the tenant apiserver, bound to the tenant pod (and, once it is bound, to its
//! vNode, which the tenant apiserver names in each token), and a pod's share of a shard made of them.

use std::collections::BTreeMap;

use crds::wellknown::ROOT_CA_CONFIG_MAP;
use k8s_openapi::{
    ByteString,
    api::{
        authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
        core::v1::ServiceAccount,
    },
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{Api, api::PostParams, runtime::reflector::ObjectRef};

use super::{
    mounts::{KEY_CA, KEY_UID, TokenNeed, key_prefix, pod_data_key},
    now,
    records::{Member, Put},
};
use crate::{
    error::{Result, on_tenant},
    tenancy::tenant::Tenant,
};

/// Lifetime the tenant apiserver stretches to a year (`--service-account-extend-token-expiration`); such
/// requests get the syncer's own short lifetime instead.
const EXTENDABLE_EXPIRATION: i64 = 3607;

/// The tenant pod tokens are bound to.
pub struct Subject<'a> {
    /// Tenant namespace.
    pub namespace: &'a str,
    /// Pod name.
    pub name: &'a str,
    /// Tenant pod uid.
    pub uid: &'a str,
    /// Its service account.
    pub service_account: Option<&'a str>,
}

/// Minted tokens: Secret data and the earliest expiry.
pub struct Minted {
    /// Key to token.
    pub tokens: BTreeMap<String, ByteString>,
    /// Earliest expiry, unix seconds.
    pub expires: i64,
}

/// Requests each token the pod needs from the tenant apiserver, bound to the tenant pod.
pub async fn mint(
    tenant: &Tenant,
    subject: &Subject<'_>,
    needs: &[TokenNeed],
    default_ttl: i64,
) -> Result<Minted> {
    let account = subject
        .service_account
        .filter(|s| !s.is_empty())
        .unwrap_or("default");
    let api: Api<ServiceAccount> = Api::namespaced(tenant.client.clone(), subject.namespace);
    let mut tokens = BTreeMap::new();
    let mut expires = i64::MAX;
    for need in needs {
        let expiration = match need.expiration_seconds {
            Some(seconds) if seconds != EXTENDABLE_EXPIRATION => seconds.max(600),
            _ => default_ttl,
        };
        let request = TokenRequest {
            metadata: ObjectMeta::default(),
            spec: TokenRequestSpec {
                audiences: need.audience.clone().map(|a| vec![a]).unwrap_or_default(),
                expiration_seconds: Some(expiration),
                bound_object_ref: Some(BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: Some(subject.name.to_owned()),
                    uid: Some(subject.uid.to_owned()),
                }),
            },
            status: None,
        };
        let context = format!("requesting a token for {}/{account}", subject.namespace);
        let issued: TokenRequest = api
            .create_subresource("token", account, &PostParams::default(), &request)
            .await
            .map_err(on_tenant(&tenant.identity.cluster_key, &context))?;
        let Some(status) = issued.status else {
            return Err(crate::error::Error::Conversion(format!(
                "the tenant issued no token ({context})"
            )));
        };
        expires = expires.min(status.expiration_timestamp.0.as_second());
        tokens.insert(need.key.clone(), ByteString(status.token.into_bytes()));
    }
    Ok(Minted {
        tokens,
        expires: if needs.is_empty() { 0 } else { expires },
    })
}

/// The tenant CA for pods in `namespace`: the namespace's `kube-root-ca.crt`, else the kubeconfig's CA.
pub fn tenant_ca(tenant: &Tenant, namespace: &str) -> Option<String> {
    tenant
        .stores
        .config_maps
        .get(&ObjectRef::new(ROOT_CA_CONFIG_MAP).within(namespace))
        .and_then(|cm| cm.data.as_ref()?.get(KEY_CA).cloned())
        .or_else(|| tenant.ca_pem.clone())
}

/// Mints a pod's tokens: its member record and data keys.
pub(super) async fn put_for(
    tenant: &Tenant,
    subject: &Subject<'_>,
    needs: &[TokenNeed],
    ttl: i64,
) -> Result<Put> {
    let prefix = key_prefix(subject.name);
    let minted = mint(tenant, subject, needs, ttl).await?;
    let mut data: BTreeMap<String, ByteString> = minted
        .tokens
        .into_iter()
        .map(|(key, value)| (pod_data_key(&prefix, &key), value))
        .collect();
    data.insert(
        pod_data_key(&prefix, KEY_UID),
        ByteString(subject.uid.as_bytes().to_vec()),
    );
    let has_tokens = !needs.is_empty();
    Ok(Put {
        pod: subject.name.to_owned(),
        member: Member {
            uid: subject.uid.into(),
            keys: data.keys().collect(),
            issued: if has_tokens { now() } else { 0 },
            expires: if has_tokens { minted.expires } else { 0 },
        },
        data,
    })
}
