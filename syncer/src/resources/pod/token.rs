//! Service-account tokens for tenant pods.
//!
//! A super pod gets short-lived tokens for its *tenant* service account, requested from the tenant
//! apiserver (TokenRequest, bound to the tenant pod), and refreshed when a fifth of their life remains. No
//! long-lived token is made. Pods keep them, with the tenant CA and namespace, in the shared token Secrets
//! of their super namespace ([`super::token_secrets`]). Pods created by earlier versions have a Secret of their
//! own, `<pod>.vc-token`, owned by the super pod ([`secret`]), which is still refreshed.
//!
//! The syncer caches only the metadata of token Secrets: the annotations say what they hold and until
//! when, so the token values never sit in the syncer's memory.

use std::{collections::BTreeMap, time::Duration};

use crds::wellknown::{ANNOTATION_TOKEN_FOR_POD, LABEL_POD_TOKEN, ROOT_CA_CONFIG_MAP};
use k8s_openapi::{
    ByteString,
    api::{
        authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec},
        core::v1::{Secret, ServiceAccount},
    },
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{Api, Resource, api::PostParams, runtime::reflector::ObjectRef};
use sha2::{Digest, Sha256};

use super::convert::{KEY_CA, KEY_NAMESPACE, KEY_UID, TokenNeed};
use crate::{
    cache::{
        meta::Tagged,
        pods::{SuperPod, TenantPod},
    },
    engine::{
        context::Context,
        items::{DownItem, Kind},
    },
    error::{Result, on_tenant},
    resources::write::apply,
    tenancy::{
        identity::{self, TenantIdentity},
        tenant::Tenant,
    },
};

/// Annotation on a token Secret: when its earliest token expires (unix seconds).
pub const ANNOTATION_TOKEN_EXPIRES: &str = "tenancy.x-k8s.io/token-expires";
/// Annotation on a token Secret: when its tokens were issued (unix seconds).
pub const ANNOTATION_TOKEN_ISSUED: &str = "tenancy.x-k8s.io/token-issued";
/// Annotation on a token Secret: its keys, comma-separated.
pub const ANNOTATION_TOKEN_KEYS: &str = "tenancy.x-k8s.io/token-keys";
/// Annotation on a super pod: the tokens it needs, as JSON (absent: it needs no token Secret).
pub const ANNOTATION_POD_TOKENS: &str = "tenancy.x-k8s.io/tokens";
/// Annotation on a super pod: the shared token Secret its volumes read (absent on pods of earlier
/// versions, which read `<pod>.vc-token`).
pub const ANNOTATION_TOKEN_SECRET: &str = "tenancy.x-k8s.io/token-secret";

/// The shared token Secret a super pod's volumes read, if it is not a pod of an earlier version.
pub fn secret_of(super_pod: &impl Tagged) -> Option<&str> {
    super_pod.annotation(ANNOTATION_TOKEN_SECRET)
}

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

/// The tokens a super pod needs, from its annotation; `None` when it needs no token Secret.
pub fn needs_of(super_pod: &impl Tagged) -> Option<Vec<TokenNeed>> {
    serde_json::from_str(super_pod.annotation(ANNOTATION_POD_TOKENS)?).ok()
}

/// The annotation value recording what tokens a pod needs.
pub fn needs_annotation(needs: &[TokenNeed]) -> String {
    serde_json::to_string(needs).unwrap_or_else(|_| "[]".into())
}

fn annotation_seconds(meta: &impl Tagged, key: &str) -> Option<i64> {
    meta.annotation(key)?.parse().ok()
}

/// Whether a token Secret must be (re)written: missing, bound to another pod, missing a key, or in the
/// last fifth of its tokens' life.
pub fn needs_refresh(
    secret: Option<&ObjectMeta>,
    tenant_pod_uid: &str,
    tokens: &[TokenNeed],
    now: i64,
) -> bool {
    let Some(secret) = secret else { return true };
    if identity::tenant_uid(secret) != Some(tenant_pod_uid) {
        return true;
    }
    let keys: Vec<&str> = secret
        .annotation(ANNOTATION_TOKEN_KEYS)
        .unwrap_or("")
        .split(',')
        .collect();
    if tokens.iter().any(|t| !keys.contains(&t.key.as_str())) {
        return true;
    }
    if tokens.is_empty() {
        return false;
    }
    match refresh_at(secret) {
        Some(at) => now >= at,
        None => true,
    }
}

/// When a token Secret's tokens should be renewed (unix seconds), if it holds tokens.
pub fn refresh_at(secret: &impl Tagged) -> Option<i64> {
    let issued = annotation_seconds(secret, ANNOTATION_TOKEN_ISSUED)?;
    let expires = annotation_seconds(secret, ANNOTATION_TOKEN_EXPIRES)?;
    Some(expires - (expires - issued) / 5)
}

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

/// The token Secret of a super pod, owned by it.
pub fn secret(
    identity: &TenantIdentity,
    subject: &Subject<'_>,
    super_namespace: &str,
    super_pod_uid: &str,
    ca: Option<String>,
    minted: Minted,
    now: i64,
) -> Secret {
    let mut metadata = identity::super_metadata(
        &ObjectMeta {
            name: Some(secret_name(subject.name)),
            namespace: Some(subject.namespace.to_owned()),
            uid: Some(subject.uid.to_owned()),
            ..Default::default()
        },
        identity,
        &Default::default(),
        Some(super_namespace.to_owned()),
        true,
    );
    metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(LABEL_POD_TOKEN.to_owned(), "true".to_owned());
    let annotations = metadata.annotations.get_or_insert_with(Default::default);
    annotations.insert(ANNOTATION_TOKEN_FOR_POD.to_owned(), subject.name.to_owned());
    annotations.insert(
        ANNOTATION_TOKEN_KEYS.to_owned(),
        minted.tokens.keys().cloned().collect::<Vec<_>>().join(","),
    );
    if !minted.tokens.is_empty() {
        annotations.insert(ANNOTATION_TOKEN_ISSUED.to_owned(), now.to_string());
        annotations.insert(ANNOTATION_TOKEN_EXPIRES.to_owned(), minted.expires.to_string());
    }
    metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: subject.name.to_owned(),
        uid: super_pod_uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: None,
    }]);
    let mut data = minted.tokens;
    data.insert(KEY_CA.to_owned(), ByteString(ca.unwrap_or_default().into_bytes()));
    data.insert(
        KEY_NAMESPACE.to_owned(),
        ByteString(subject.namespace.as_bytes().to_vec()),
    );
    data.insert(KEY_UID.to_owned(), ByteString(subject.uid.as_bytes().to_vec()));
    Secret {
        metadata,
        data: Some(data),
        type_: Some("Opaque".into()),
        ..Default::default()
    }
}

/// Seconds since the epoch.
pub use vc_runtime::clock::now;

// The per-pod token Secrets of earlier versions: still renewed for the pods that read them.

/// Keeps the token Secret of its own that a pod of an earlier version reads (`<pod>.vc-token`): minted
/// again when due, and a wake-up scheduled for the next renewal. Returns the writes made.
pub(super) async fn refresh_token(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    needs: &[TokenNeed],
) -> Result<u32> {
    let namespace = tenant_pod.namespace().unwrap_or_default();
    let name = tenant_pod.name_any();
    let super_namespace = super_pod.namespace().unwrap_or_default();
    let existing = ctx
        .supers
        .pods
        .token_secrets
        .get(&ObjectRef::new(&secret_name(&name)).within(&super_namespace));
    let tenant_uid = tenant_pod.uid().unwrap_or_default();
    if !needs_refresh(existing.as_ref().map(|s| s.meta()), &tenant_uid, needs, now()) {
        if let Some(at) = existing.as_ref().and_then(|s| refresh_at(s.meta())) {
            // Keep a wake-up scheduled across restarts.
            schedule_refresh(ctx, tenant, &namespace, &name, at);
        }
        return Ok(0);
    }
    let subject = Subject {
        namespace: &namespace,
        name: &name,
        uid: &tenant_uid,
        service_account: tenant_pod.spec.service_account_name.as_deref(),
    };
    let minted = mint(tenant, &subject, needs, ctx.config.token_ttl_seconds).await?;
    write_token_secret(
        ctx,
        tenant,
        &subject,
        &super_namespace,
        &super_pod.uid().unwrap_or_default(),
        minted,
    )
    .await?;
    Ok(1)
}

async fn write_token_secret(
    ctx: &Context,
    tenant: &Tenant,
    subject: &Subject<'_>,
    super_namespace: &str,
    super_pod_uid: &str,
    minted: Minted,
) -> Result<()> {
    let now = now();
    let has_tokens = !minted.tokens.is_empty();
    let ca = tenant_ca(tenant, subject.namespace);
    let secret = secret(
        &tenant.identity,
        subject,
        super_namespace,
        super_pod_uid,
        ca,
        minted,
        now,
    );
    let refresh = refresh_at(&secret.metadata);
    let api: Api<Secret> = Api::namespaced(ctx.super_client.clone(), super_namespace);
    apply(ctx, &api, secret, None).await?;
    if let (true, Some(at)) = (has_tokens, refresh) {
        schedule_refresh(ctx, tenant, subject.namespace, subject.name, at);
    }
    Ok(())
}

fn schedule_refresh(ctx: &Context, tenant: &Tenant, namespace: &str, name: &str, at: i64) {
    let delay = Duration::from_secs(u64::try_from(at - now()).unwrap_or(0));
    ctx.queues
        .down
        .add_after(&tenant.id, DownItem::new(Kind::Pod, namespace, name), delay);
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

    fn stored(uid: &str, issued: i64, expires: i64, keys: &str) -> ObjectMeta {
        ObjectMeta {
            annotations: Some(
                [
                    (crds::wellknown::ANNOTATION_UID.to_owned(), uid.to_owned()),
                    (ANNOTATION_TOKEN_ISSUED.to_owned(), issued.to_string()),
                    (ANNOTATION_TOKEN_EXPIRES.to_owned(), expires.to_string()),
                    (ANNOTATION_TOKEN_KEYS.to_owned(), keys.to_owned()),
                ]
                .into(),
            ),
            ..Default::default()
        }
    }

    #[test]
    fn tokens_are_refreshed_in_the_last_fifth_of_their_life() {
        let secret = stored("pod-uid", 1000, 2000, "token");
        assert!(!needs_refresh(Some(&secret), "pod-uid", &[need("token")], 1500));
        assert!(!needs_refresh(Some(&secret), "pod-uid", &[need("token")], 1799));
        assert!(needs_refresh(Some(&secret), "pod-uid", &[need("token")], 1800));
        assert_eq!(refresh_at(&secret), Some(1800));
    }

    #[test]
    fn a_secret_for_another_pod_or_missing_keys_is_rewritten() {
        let secret = stored("old-uid", 1000, 2000, "token");
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
    fn needs_round_trip_through_the_pod_annotation() {
        let needs = vec![
            need("token"),
            TokenNeed {
                key: "token-x".into(),
                audience: Some("vault".into()),
                expiration_seconds: Some(900),
            },
        ];
        let meta = ObjectMeta {
            annotations: Some([(ANNOTATION_POD_TOKENS.to_owned(), needs_annotation(&needs))].into()),
            ..Default::default()
        };
        assert_eq!(needs_of(&meta), Some(needs));
        assert_eq!(needs_of(&ObjectMeta::default()), None);
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
