//! Service-account tokens for tenant pods.
//!
//! A super pod gets short-lived tokens for its *tenant* service account, requested from the tenant
//! apiserver (TokenRequest, bound to the tenant pod), stored with the tenant CA and namespace in a Secret
//! owned by the super pod, and refreshed when a fifth of their life remains. No long-lived token is made.

use std::collections::BTreeMap;

use k8s_openapi::{
    ByteString,
    api::{
        authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
        core::v1::{Pod, Secret, ServiceAccount},
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
    jiff::Timestamp,
};
use kube::{Api, ResourceExt, api::PostParams, runtime::reflector::ObjectRef};
use sha2::{Digest, Sha256};

use super::convert::{KEY_CA, KEY_NAMESPACE, KEY_UID, TokenNeed};
use crate::{
    error::{Result, on_tenant},
    identity::{self, TenantIdentity},
    tenant::Tenant,
};

/// Annotation on a token Secret: the pod it serves.
pub const ANNOTATION_TOKEN_FOR_POD: &str = "tenancy.x-k8s.io/token-for-pod";
/// Annotation on a token Secret: when its earliest token expires (unix seconds).
pub const ANNOTATION_TOKEN_EXPIRES: &str = "tenancy.x-k8s.io/token-expires";
/// Annotation on a token Secret: when its tokens were issued (unix seconds).
pub const ANNOTATION_TOKEN_ISSUED: &str = "tenancy.x-k8s.io/token-issued";

/// Lifetime the tenant apiserver stretches to a year (`--service-account-extend-token-expiration`); such
/// requests get the syncer's own short lifetime instead.
const EXTENDABLE_EXPIRATION: i64 = 3607;

/// The token Secret's name for a pod: `<pod>.vc-token`, hashed if that is too long.
pub fn secret_name(pod: &str) -> String {
    let name = format!("{pod}.vc-token");
    if name.len() <= 253 {
        return name;
    }
    let digest = hex::encode(Sha256::digest(pod.as_bytes()));
    format!("{}.{}.vc-token", &pod[..200], &digest[..10])
}

/// The pod a Secret holds tokens for, if it is a token Secret.
pub fn pod_of_token_secret(secret: &Secret) -> Option<&str> {
    secret
        .metadata
        .annotations
        .as_ref()?
        .get(ANNOTATION_TOKEN_FOR_POD)
        .map(String::as_str)
}

fn annotation_seconds(secret: &Secret, key: &str) -> Option<i64> {
    secret.metadata.annotations.as_ref()?.get(key)?.parse().ok()
}

/// Whether a token Secret must be (re)written: missing, bound to another pod, missing a key, or in the
/// last fifth of its tokens' life.
pub fn needs_refresh(secret: Option<&Secret>, tenant_pod_uid: &str, tokens: &[TokenNeed], now: i64) -> bool {
    let Some(secret) = secret else { return true };
    if identity::tenant_uid(&secret.metadata) != Some(tenant_pod_uid) {
        return true;
    }
    let data = secret.data.as_ref();
    let has = |key: &str| data.is_some_and(|d| d.contains_key(key));
    if !has(KEY_CA) || !has(KEY_NAMESPACE) || tokens.iter().any(|t| !has(&t.key)) {
        return true;
    }
    if tokens.is_empty() {
        return false;
    }
    match (
        annotation_seconds(secret, ANNOTATION_TOKEN_ISSUED),
        annotation_seconds(secret, ANNOTATION_TOKEN_EXPIRES),
    ) {
        (Some(issued), Some(expires)) => now >= expires - (expires - issued) / 5,
        _ => true,
    }
}

/// When a fresh Secret should be looked at again (unix seconds), if it holds tokens.
pub fn refresh_at(secret: &Secret) -> Option<i64> {
    let issued = annotation_seconds(secret, ANNOTATION_TOKEN_ISSUED)?;
    let expires = annotation_seconds(secret, ANNOTATION_TOKEN_EXPIRES)?;
    Some(expires - (expires - issued) / 5)
}

/// Minted tokens: Secret data and the earliest expiry.
pub struct Minted {
    /// Key to token.
    pub tokens: BTreeMap<String, ByteString>,
    /// Earliest expiry, unix seconds.
    pub expires: i64,
}

/// Requests each token the pod needs from the tenant apiserver, bound to the tenant pod.
pub async fn mint(tenant: &Tenant, pod: &Pod, needs: &[TokenNeed], default_ttl: i64) -> Result<Minted> {
    let namespace = pod.namespace().unwrap_or_default();
    let account = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "default".to_owned());
    let api: Api<ServiceAccount> = Api::namespaced(tenant.client.clone(), &namespace);
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
                    name: Some(pod.name_any()),
                    uid: pod.uid(),
                }),
            },
            status: None,
        };
        let issued: TokenRequest = api
            .create_subresource("token", &account, &PostParams::default(), &request)
            .await
            .map_err(on_tenant(
                &tenant.identity.cluster_key,
                format!("requesting a token for {namespace}/{account}"),
            ))?;
        let Some(status) = issued.status else {
            return Err(crate::error::Error::Conversion(format!(
                "the tenant issued no token for {namespace}/{account}"
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
        .get(&ObjectRef::new(super::super::kinds::ROOT_CA_CONFIG_MAP).within(namespace))
        .and_then(|cm| cm.data.as_ref()?.get(KEY_CA).cloned())
        .or_else(|| tenant.ca_pem.clone())
}

/// The token Secret of a super pod.
pub fn secret(
    identity: &TenantIdentity,
    tenant_pod: &Pod,
    super_pod: &Pod,
    ca: Option<String>,
    minted: Minted,
    now: i64,
) -> Secret {
    let namespace = tenant_pod.namespace().unwrap_or_default();
    let pod_name = tenant_pod.name_any();
    let mut metadata = identity::super_metadata(
        &ObjectMeta {
            name: Some(secret_name(&pod_name)),
            namespace: Some(namespace.clone()),
            uid: tenant_pod.uid(),
            ..Default::default()
        },
        identity,
        &[],
        super_pod.namespace(),
        true,
    );
    let annotations = metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(ANNOTATION_TOKEN_FOR_POD.to_owned(), pod_name.clone());
    if !minted.tokens.is_empty() {
        annotations.insert(ANNOTATION_TOKEN_ISSUED.to_owned(), now.to_string());
        annotations.insert(ANNOTATION_TOKEN_EXPIRES.to_owned(), minted.expires.to_string());
    }
    metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod_name,
        uid: super_pod.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let mut data = minted.tokens;
    data.insert(KEY_CA.to_owned(), ByteString(ca.unwrap_or_default().into_bytes()));
    data.insert(KEY_NAMESPACE.to_owned(), ByteString(namespace.into_bytes()));
    data.insert(
        KEY_UID.to_owned(),
        ByteString(tenant_pod.uid().unwrap_or_default().into_bytes()),
    );
    Secret {
        metadata,
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// Seconds since the epoch.
pub fn now() -> i64 {
    Timestamp::now().as_second()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn need(key: &str) -> TokenNeed {
        TokenNeed {
            key: key.into(),
            audience: None,
            expiration_seconds: None,
        }
    }

    fn stored(uid: &str, issued: i64, expires: i64, keys: &[&str]) -> Secret {
        let data = keys
            .iter()
            .map(|k| (k.to_string(), ByteString(b"x".to_vec())))
            .collect();
        Secret {
            metadata: ObjectMeta {
                annotations: Some(
                    [
                        (crds::wellknown::ANNOTATION_UID.to_owned(), uid.to_owned()),
                        (ANNOTATION_TOKEN_ISSUED.to_owned(), issued.to_string()),
                        (ANNOTATION_TOKEN_EXPIRES.to_owned(), expires.to_string()),
                    ]
                    .into(),
                ),
                ..Default::default()
            },
            data: Some(data),
            ..Default::default()
        }
    }

    #[test]
    fn tokens_are_refreshed_in_the_last_fifth_of_their_life() {
        let secret = stored("pod-uid", 1000, 2000, &["token", "ca.crt", "namespace", "uid"]);
        assert!(!needs_refresh(Some(&secret), "pod-uid", &[need("token")], 1500));
        assert!(!needs_refresh(Some(&secret), "pod-uid", &[need("token")], 1799));
        assert!(needs_refresh(Some(&secret), "pod-uid", &[need("token")], 1800));
        assert_eq!(refresh_at(&secret), Some(1800));
    }

    #[test]
    fn a_secret_for_another_pod_or_missing_keys_is_rewritten() {
        let secret = stored("old-uid", 1000, 2000, &["token", "ca.crt", "namespace"]);
        assert!(needs_refresh(Some(&secret), "new-uid", &[need("token")], 1100));
        assert!(needs_refresh(
            Some(&secret),
            "old-uid",
            &[need("token-abc")],
            1100
        ));
        assert!(needs_refresh(None, "old-uid", &[], 1100));
        // Without tokens (only CA and namespace), nothing expires.
        assert!(!needs_refresh(Some(&secret), "old-uid", &[], 99_999));
    }

    #[test]
    fn long_pod_names_get_valid_secret_names() {
        assert_eq!(secret_name("web-1"), "web-1.vc-token");
        let long = "a".repeat(253);
        let name = secret_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert_ne!(secret_name(&"a".repeat(252)), name);
    }
}
