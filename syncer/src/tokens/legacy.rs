//! The per-pod token Secrets of earlier versions (`<pod>.vc-token`, owned by the super pod): still renewed
//! for the pods that read them. Pods created since read the shared token Secrets ([`super::shards`]).
//!
//! To be removed in 0.2.0 (docs/syncer.md, "Token Secrets"): it serves only pods created before the shared
//! token Secrets (by earlier builds of 0.1.0); such a pod must be recreated before the upgrade (its new copy
//! reads the shared Secrets), or its tokens expire unrenewed.

use std::time::Duration;

use crds::wellknown::{ANNOTATION_TOKEN_FOR_POD, LABEL_POD_TOKEN};
use k8s_openapi::{
    ByteString,
    api::core::v1::Secret,
    apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference},
};
use kube::{Api, Resource, runtime::reflector::ObjectRef};
use sha2::{Digest, Sha256};

use super::{
    minting::{Minted, Subject, mint, tenant_ca},
    mounts::{KEY_CA, KEY_NAMESPACE, KEY_UID, TokenNeed},
    now,
};
use crate::{
    cache::{
        meta::Tagged,
        pods::{SuperPod, TenantPod},
    },
    engine::{
        context::Context,
        items::{DownItem, Kind},
    },
    error::Result,
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

/// The token Secret's name for a pod: `<pod>.vc-token`, hashed if that is too long.
pub fn secret_name(pod: &str) -> String {
    let name = format!("{pod}.vc-token");
    if name.len() <= 253 {
        return name;
    }
    let digest = hex::encode(Sha256::digest(pod.as_bytes()));
    format!("{}.{}.vc-token", &pod[..200], &digest[..10])
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

/// Keeps the token Secret of its own that a pod of an earlier version reads (`<pod>.vc-token`): minted
/// again when due, and a wake-up scheduled for the next renewal. Returns the writes made.
pub(crate) async fn refresh_token(
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
    fn long_pod_names_get_valid_secret_names() {
        assert_eq!(secret_name("web-1"), "web-1.vc-token");
        let long = "a".repeat(253);
        let name = secret_name(&long);
        assert!(name.len() <= 253, "{}", name.len());
        assert_ne!(secret_name(&"a".repeat(252)), name);
    }

    // The path on a scripted apiserver: what keeping a pod's own token Secret asks and writes.

    use serde_json::json;

    use crate::{
        engine::context::testing::{self, from_json, put},
        tenancy::settings::TenantSettings,
    };

    /// The token Secret of a pod created by an earlier version, as the metadata cache holds it.
    fn legacy_token_secret(issued: i64, expires: i64) -> kube::core::PartialObjectMeta<Secret> {
        from_json(json!({"apiVersion": "v1", "kind": "Secret", "metadata": {
            "name": "web.vc-token", "namespace": "team-abc123-vc-shop",
            "labels": {"tenancy.x-k8s.io/pod-token": "true"},
            "annotations": {"tenancy.x-k8s.io/cluster": "team-abc123-vc", "tenancy.x-k8s.io/namespace": "shop",
                "tenancy.x-k8s.io/uid": "pod-uid", "tenancy.x-k8s.io/token-for-pod": "web",
                (ANNOTATION_TOKEN_KEYS): "token",
                (ANNOTATION_TOKEN_ISSUED): issued.to_string(),
                (ANNOTATION_TOKEN_EXPIRES): expires.to_string()}}}))
    }

    #[tokio::test]
    async fn a_pod_of_an_earlier_version_keeps_its_own_token_secret_refreshed() {
        let needs = [TokenNeed {
            key: "token".into(),
            audience: None,
            expiration_seconds: None,
        }];
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, mut super_caches) = testing::context(super_client);
        let (tenant, mut caches) = testing::tenant(&ctx, tenant_client, TenantSettings::default());
        // A running pod, as the caches show it and its copy.
        let running = json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "web", "namespace": "shop", "uid": "pod-uid", "resourceVersion": "3"},
            "spec": {"containers": [{"name": "c", "image": "busybox:1"}]},
            "status": {"phase": "Running", "podIP": "10.0.0.9"}
        });
        let mut copy = running.clone();
        copy["metadata"]["namespace"] = json!("team-abc123-vc-shop");
        copy["metadata"]["uid"] = json!("super-uid");
        copy["metadata"]["annotations"] = json!({"tenancy.x-k8s.io/cluster": "team-abc123-vc",
            "tenancy.x-k8s.io/namespace": "shop", "tenancy.x-k8s.io/uid": "pod-uid"});
        put(&mut caches.pods, from_json(running));
        put(&mut super_caches.pods, from_json(copy));
        let tenant_pod = tenant
            .stores
            .pods
            .get(&ObjectRef::new("web").within("shop"))
            .expect("tenant pod");
        let super_pod = ctx
            .supers
            .pods
            .copies
            .get(&ObjectRef::new("web").within("team-abc123-vc-shop"))
            .expect("super pod");
        let now = now();

        // In sync (a restart): nothing is asked or written.
        put(
            &mut super_caches.tokens,
            legacy_token_secret(now - 10, now + 3590),
        );
        let kept = refresh_token(&ctx, &tenant, &tenant_pod, &super_pod, &needs).await;
        assert_eq!(kept.expect("kept"), 0);
        supers.idle().await;
        tenants.idle().await;

        // Due: minted again and applied to the pod's own Secret, not to a shared one.
        put(
            &mut super_caches.tokens,
            legacy_token_secret(now - 3000, now + 500),
        );
        let (refreshed, ()) = tokio::join!(
            refresh_token(&ctx, &tenant, &tenant_pod, &super_pod, &needs),
            async {
                let call = tenants
                    .expect("POST", "/api/v1/namespaces/shop/serviceaccounts/default/token?")
                    .await;
                assert_eq!(call.body["spec"]["boundObjectRef"]["uid"], "pod-uid");
                let spec = call.body["spec"].clone();
                call.ok(
                    json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec,
                "status": {"token": "jwt", "expirationTimestamp": "2030-01-01T00:00:00Z"}}),
                );
                let applied = supers
                    .expect(
                        "PATCH",
                        "/api/v1/namespaces/team-abc123-vc-shop/secrets/web.vc-token?",
                    )
                    .await;
                assert_eq!(applied.body["metadata"]["ownerReferences"][0]["uid"], "super-uid");
                applied.echo();
            }
        );
        assert_eq!(refreshed.expect("refreshed"), 1);
        supers.idle().await;
        tenants.idle().await;
    }
}
