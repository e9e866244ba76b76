//! What a pod's super copy mounts of its tokens (pure): its token, CA and downward-API namespace/uid files
//! read from a token Secret of the syncer's, under keys `<prefix>.<file>` of the pod's own beside the
//! shared `ca.crt` and `namespace`; the tokens that Secret must hold ([`TokenNeed`]); the annotations that
//! record both on the super pod; and the Secret names a tenant pod may not name.

use crds::wellknown::ROOT_CA_CONFIG_MAP;
use k8s_openapi::api::core::v1::{
    EnvVar, KeyToPath, PodSpec, ProjectedVolumeSource, SecretProjection, SecretVolumeSource, Volume,
    VolumeProjection,
};
use sha2::{Digest, Sha256};

use crate::cache::meta::Tagged;

/// Keys of the token Secret besides tokens, shared by the pods of its super namespace.
pub const KEY_CA: &str = "ca.crt";
/// Tenant namespace, for downward-API files (shared: a super namespace serves one tenant namespace).
pub const KEY_NAMESPACE: &str = "namespace";
/// Tenant pod uid, for downward-API files (one per pod, after the pod's prefix).
pub const KEY_UID: &str = "uid";
/// The default token.
pub const KEY_TOKEN: &str = "token";

/// The token Secret a pod's volumes read, and the prefix of the pod's own keys in it.
#[derive(Clone, Copy)]
struct TokenTarget<'a> {
    secret: &'a str,
    prefix: &'a str,
}

impl TokenTarget<'_> {
    /// The Secret key of one of the pod's own files.
    fn key(&self, key: &str) -> String {
        pod_data_key(self.prefix, key)
    }
}

/// The key of a pod's own file in a shared token Secret: `<prefix>.<key>`. Keys never contain a dot, so a
/// data key names its pod and file unambiguously, and never equals the shared `ca.crt` or `namespace`.
pub fn pod_data_key(prefix: &str, key: &str) -> String {
    format!("{prefix}.{key}")
}

/// A service-account token the pod needs, minted from the tenant apiserver.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenNeed {
    /// The token's file key (`token`, `token-<hash>`); in the token Secret it follows the pod's prefix.
    pub key: String,
    /// Audience (`None`: the apiserver's default).
    pub audience: Option<String>,
    /// Requested lifetime in seconds (`None`: the syncer's default).
    pub expiration_seconds: Option<i64>,
}

/// Name the conversion gives the token Secret until the pod's shard is chosen ([`retarget_token_secret`]):
/// a pod is assigned to a shard only once it is admitted.
pub const UNASSIGNED_TOKEN_SECRET: &str = "unassigned.vc-tokens";

/// Points the volumes that read token Secret `from` at `to`.
pub fn retarget_token_secret(spec: &mut PodSpec, from: &str, to: &str) {
    for volume in spec.volumes.iter_mut().flatten() {
        if let Some(secret) = &mut volume.secret
            && secret.secret_name.as_deref() == Some(from)
        {
            secret.secret_name = Some(to.to_owned());
        }
        for source in volume
            .projected
            .iter_mut()
            .flat_map(|p| p.sources.iter_mut().flatten())
        {
            if let Some(secret) = &mut source.secret
                && secret.name == from
            {
                secret.name = to.to_owned();
            }
        }
    }
}

/// What a tenant pod names of the Secrets the syncer keeps for pods' tokens (which hold the tokens of
/// other pods, of other service accounts): in volumes, projections, image pull secrets and container
/// environments. The tenant apiserver does not look at them, the super kubelet would serve them.
pub fn reserved_secret_references(spec: &PodSpec) -> Vec<String> {
    let mut names: Vec<&str> = Vec::new();
    for volume in spec.volumes.iter().flatten() {
        names.extend(volume.secret.as_ref().and_then(|s| s.secret_name.as_deref()));
        for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
            names.extend(source.secret.as_ref().map(|s| s.name.as_str()));
        }
    }
    names.extend(spec.image_pull_secrets.iter().flatten().map(|r| r.name.as_str()));
    for container in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        names.extend(env_secret_names(
            container.env.as_deref(),
            container.env_from.as_deref(),
        ));
    }
    for container in spec.ephemeral_containers.iter().flatten() {
        names.extend(env_secret_names(
            container.env.as_deref(),
            container.env_from.as_deref(),
        ));
    }
    reserved_refusals(names)
}

/// What a container's environment names of the Secrets the syncer keeps for pods' tokens (an ephemeral
/// container, judged on its own).
pub fn reserved_env_references(
    env: Option<&[EnvVar]>,
    env_from: Option<&[k8s_openapi::api::core::v1::EnvFromSource]>,
) -> Vec<String> {
    reserved_refusals(env_secret_names(env, env_from).collect())
}

fn env_secret_names<'s>(
    env: Option<&'s [EnvVar]>,
    env_from: Option<&'s [k8s_openapi::api::core::v1::EnvFromSource]>,
) -> impl Iterator<Item = &'s str> {
    let from_vars = env
        .into_iter()
        .flatten()
        .filter_map(|e| e.value_from.as_ref()?.secret_key_ref.as_ref())
        .map(|r| r.name.as_str());
    let from_sources = env_from
        .into_iter()
        .flatten()
        .filter_map(|e| e.secret_ref.as_ref())
        .map(|r| r.name.as_str());
    from_vars.chain(from_sources)
}

fn reserved_refusals(mut names: Vec<&str>) -> Vec<String> {
    names.retain(|name| is_reserved_secret_name(name));
    names.sort_unstable();
    names.dedup();
    names
        .into_iter()
        .map(|name| {
            format!(
                "a reference to Secret {name:?} (names ending in .vc-token or .vc-tokens are the syncer's, for pods' tokens)"
            )
        })
        .collect()
}

/// Points the volumes' token, CA and downward-API namespace/uid files at token Secret `secret`, under the
/// pod's keys `prefix`: returns the tokens the Secret must hold (sorted, once each) and whether the pod
/// needs the Secret at all.
pub fn rewrite_volumes(spec: &mut PodSpec, secret: &str, prefix: &str) -> (Vec<TokenNeed>, bool) {
    let mut tokens = Vec::new();
    let mut needs_secret = false;
    let target = TokenTarget { secret, prefix };
    for volume in spec.volumes.iter_mut().flatten() {
        needs_secret |= rewrite_volume(volume, target, &mut tokens);
    }
    tokens.sort();
    tokens.dedup();
    (tokens, needs_secret)
}

/// The Secret key of a token with a non-default audience or lifetime.
fn token_key(audience: Option<&str>, expiration: Option<i64>) -> String {
    if audience.is_none() && expiration.is_none() {
        return KEY_TOKEN.to_owned();
    }
    let digest = Sha256::digest(format!("{}|{}", audience.unwrap_or(""), expiration.unwrap_or(0)).as_bytes());
    format!("token-{}", &hex::encode(digest)[..10])
}

/// Points a volume's token, CA and downward-API namespace/uid files at the token Secret. Returns whether
/// the volume needs the Secret.
fn rewrite_volume(volume: &mut Volume, target: TokenTarget<'_>, tokens: &mut Vec<TokenNeed>) -> bool {
    let mut needs = false;
    let secret = target.secret;
    if let Some(projected) = &mut volume.projected {
        let mut sources = Vec::new();
        for source in projected.sources.take().unwrap_or_default() {
            sources.extend(rewrite_projection(source, target, tokens, &mut needs));
        }
        projected.sources = Some(sources);
    }
    if let Some(config_map) = &volume.config_map
        && config_map.name == ROOT_CA_CONFIG_MAP
    {
        let items = config_map.items.clone().map(ca_items);
        volume.secret = Some(SecretVolumeSource {
            secret_name: Some(secret.to_owned()),
            items: Some(items.unwrap_or_else(|| {
                vec![KeyToPath {
                    key: KEY_CA.into(),
                    path: KEY_CA.into(),
                    mode: None,
                }]
            })),
            default_mode: config_map.default_mode,
            optional: config_map.optional,
        });
        volume.config_map = None;
        needs = true;
    }
    if let Some(downward) = &volume.downward_api {
        let (kept, moved) = split_downward(downward.items.clone().unwrap_or_default(), target);
        if !moved.is_empty() {
            let mut sources = Vec::new();
            if !kept.is_empty() {
                sources.push(VolumeProjection {
                    downward_api: Some(k8s_openapi::api::core::v1::DownwardAPIProjection {
                        items: Some(kept),
                    }),
                    ..Default::default()
                });
            }
            sources.push(secret_projection(secret, moved));
            volume.projected = Some(ProjectedVolumeSource {
                default_mode: downward.default_mode,
                sources: Some(sources),
            });
            volume.downward_api = None;
            needs = true;
        }
    }
    needs
}

fn ca_items(items: Vec<KeyToPath>) -> Vec<KeyToPath> {
    items
        .into_iter()
        .map(|item| KeyToPath {
            key: KEY_CA.into(),
            ..item
        })
        .collect()
}

fn secret_projection(secret: &str, items: Vec<KeyToPath>) -> VolumeProjection {
    VolumeProjection {
        secret: Some(SecretProjection {
            name: secret.to_owned(),
            items: Some(items),
            optional: None,
        }),
        ..Default::default()
    }
}

/// Splits downward-API items into those that work unchanged in the super cluster and those (the
/// namespace and uid, which differ there) served from the token Secret.
fn split_downward(
    items: Vec<k8s_openapi::api::core::v1::DownwardAPIVolumeFile>,
    target: TokenTarget<'_>,
) -> (
    Vec<k8s_openapi::api::core::v1::DownwardAPIVolumeFile>,
    Vec<KeyToPath>,
) {
    let mut kept = Vec::new();
    let mut moved = Vec::new();
    for item in items {
        let key = match item.field_ref.as_ref().map(|f| f.field_path.as_str()) {
            Some("metadata.namespace") => Some(KEY_NAMESPACE.to_owned()),
            Some("metadata.uid") => Some(target.key(KEY_UID)),
            _ => None,
        };
        match key {
            Some(key) => moved.push(KeyToPath {
                key,
                path: item.path,
                mode: item.mode,
            }),
            None => kept.push(item),
        }
    }
    (kept, moved)
}

fn rewrite_projection(
    source: VolumeProjection,
    target: TokenTarget<'_>,
    tokens: &mut Vec<TokenNeed>,
    needs: &mut bool,
) -> Vec<VolumeProjection> {
    let secret = target.secret;
    if let Some(token) = &source.service_account_token {
        let key = token_key(token.audience.as_deref(), token.expiration_seconds);
        tokens.push(TokenNeed {
            key: key.clone(),
            audience: token.audience.clone(),
            expiration_seconds: token.expiration_seconds,
        });
        *needs = true;
        return vec![secret_projection(
            secret,
            vec![KeyToPath {
                key: target.key(&key),
                path: token.path.clone(),
                mode: None,
            }],
        )];
    }
    if let Some(config_map) = &source.config_map
        && config_map.name == ROOT_CA_CONFIG_MAP
    {
        *needs = true;
        let items = config_map.items.clone().map(ca_items).unwrap_or_else(|| {
            vec![KeyToPath {
                key: KEY_CA.into(),
                path: KEY_CA.into(),
                mode: None,
            }]
        });
        return vec![secret_projection(secret, items)];
    }
    if let Some(downward) = &source.downward_api {
        let (kept, moved) = split_downward(downward.items.clone().unwrap_or_default(), target);
        if !moved.is_empty() {
            *needs = true;
            let mut out = Vec::new();
            if !kept.is_empty() {
                out.push(VolumeProjection {
                    downward_api: Some(k8s_openapi::api::core::v1::DownwardAPIProjection {
                        items: Some(kept),
                    }),
                    ..Default::default()
                });
            }
            out.push(secret_projection(secret, moved));
            return out;
        }
    }
    vec![source]
}

/// Annotation on a super pod: the tokens it needs, as JSON (absent: it needs no token Secret).
pub const ANNOTATION_POD_TOKENS: &str = "tenancy.x-k8s.io/tokens";
/// Annotation on a super pod: the shared token Secret its volumes read (absent on pods of earlier
/// versions, which read `<pod>.vc-token`).
pub const ANNOTATION_TOKEN_SECRET: &str = "tenancy.x-k8s.io/token-secret";

/// The shared token Secret a super pod's volumes read, if it is not a pod of an earlier version.
pub fn secret_of(super_pod: &impl Tagged) -> Option<&str> {
    super_pod.annotation(ANNOTATION_TOKEN_SECRET)
}

/// The tokens a super pod needs, from its annotation; `None` when it needs no token Secret.
pub fn needs_of(super_pod: &impl Tagged) -> Option<Vec<TokenNeed>> {
    serde_json::from_str(super_pod.annotation(ANNOTATION_POD_TOKENS)?).ok()
}

/// The annotation value recording what tokens a pod needs.
pub fn needs_annotation(needs: &[TokenNeed]) -> String {
    serde_json::to_string(needs).unwrap_or_else(|_| "[]".into())
}

/// Suffix of shard Secret names. Tenant Secrets and references with it (or the per-pod `.vc-token` of
/// earlier versions) are refused ([`is_reserved_secret_name`]).
pub const SHARD_SUFFIX: &str = ".vc-tokens";

/// Whether a Secret name is the syncer's, for pods' tokens: shards (`*.vc-tokens`) and the per-pod Secrets
/// of earlier versions (`*.vc-token`). Tenant Secrets of such names are not synced and tenant pods may not
/// name them, so no tenant object can stand in for, or read, another pod's tokens.
pub fn is_reserved_secret_name(name: &str) -> bool {
    name.ends_with(".vc-token") || name.ends_with(SHARD_SUFFIX)
}

/// The prefix of a pod's keys: its name (a DNS subdomain, so a valid key), shortened with a hash when a
/// key would exceed the 253 characters a key may have.
pub fn key_prefix(pod: &str) -> String {
    if pod.len() <= 200 {
        return pod.to_owned();
    }
    let digest = hex::encode(Sha256::digest(pod.as_bytes()));
    format!("{}.{}", pod[..180].trim_end_matches('.'), &digest[..16])
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use serde_json::json;

    use super::*;

    /// The keys of `secret` a pod's volumes read.
    fn keys_read(spec: &PodSpec, secret: &str) -> Vec<String> {
        let mut keys = Vec::new();
        for volume in spec.volumes.iter().flatten() {
            if let Some(source) = volume
                .secret
                .as_ref()
                .filter(|s| s.secret_name.as_deref() == Some(secret))
            {
                keys.extend(source.items.iter().flatten().map(|i| i.key.clone()));
            }
            for source in volume.projected.iter().flat_map(|p| p.sources.iter().flatten()) {
                if let Some(projection) = source.secret.as_ref().filter(|s| s.name == secret) {
                    keys.extend(projection.items.iter().flatten().map(|i| i.key.clone()));
                }
            }
        }
        keys
    }

    #[test]
    fn volumes_read_the_pods_own_keys_and_the_shared_ones_from_the_token_secret() {
        let custom = token_key(Some("vault"), Some(900));
        // A volume; whether the pod needs the Secret, the keys it reads there, and the tokens to mint.
        let cases = [
            (
                json!({"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "token"}}]}}),
                true,
                vec!["p.token".to_owned()],
                vec![need(KEY_TOKEN)],
            ),
            (
                json!({"name": "v", "projected": {"sources": [{"serviceAccountToken":
                    {"path": "t", "audience": "vault", "expirationSeconds": 900}}]}}),
                true,
                vec![format!("p.{custom}")],
                vec![TokenNeed {
                    key: custom.clone(),
                    audience: Some("vault".into()),
                    expiration_seconds: Some(900),
                }],
            ),
            (
                json!({"name": "v", "configMap": {"name": ROOT_CA_CONFIG_MAP}}),
                true,
                vec![KEY_CA.to_owned()],
                vec![],
            ),
            (
                json!({"name": "v", "downwardAPI": {"items": [
                    {"path": "uid", "fieldRef": {"fieldPath": "metadata.uid"}},
                    {"path": "ns", "fieldRef": {"fieldPath": "metadata.namespace"}},
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}),
                true,
                vec!["p.uid".to_owned(), KEY_NAMESPACE.to_owned()],
                vec![],
            ),
            (
                json!({"name": "v", "configMap": {"name": "settings"}}),
                false,
                vec![],
                vec![],
            ),
            (json!({"name": "v", "emptyDir": {}}), false, vec![], vec![]),
        ];
        for (volume, needs_secret, keys, tokens) in cases {
            let mut spec = PodSpec {
                volumes: Some(vec![serde_json::from_value(volume.clone()).expect("volume")]),
                ..Default::default()
            };
            let (minted, needed) = rewrite_volumes(&mut spec, "shard-0.vc-tokens", "p");
            assert_eq!(needed, needs_secret, "{volume}");
            assert_eq!(keys_read(&spec, "shard-0.vc-tokens"), keys, "{volume}");
            assert_eq!(minted, tokens, "{volume}");
        }
    }

    #[test]
    fn the_syncers_token_secrets_may_not_be_named_by_a_tenant_pod() {
        for (name, reserved) in [
            ("shard-0.vc-tokens", true),
            ("web-1.vc-token", true),
            ("vc-tokens", false),
            ("web-1.vc-token-backup", false),
            ("default-token-abc", false),
        ] {
            assert_eq!(is_reserved_secret_name(name), reserved, "{name}");
            let spec: PodSpec = serde_json::from_value(json!({"containers": [{"name": "c",
                "envFrom": [{"secretRef": {"name": name}}]}], "imagePullSecrets": [{"name": name}]}))
            .expect("spec");
            assert_eq!(
                reserved_secret_references(&spec).len(),
                usize::from(reserved),
                "{name}"
            );
        }
    }

    fn need(key: &str) -> TokenNeed {
        TokenNeed {
            key: key.into(),
            audience: None,
            expiration_seconds: None,
        }
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
    fn key_prefixes_are_valid_keys_for_any_pod_name() {
        assert_eq!(key_prefix("web-1"), "web-1");
        let long = format!("{}.b", "a".repeat(251));
        let prefix = key_prefix(&long);
        assert!(pod_data_key(&prefix, "token-0123456789").len() <= 253);
        assert_ne!(key_prefix(&format!("{}.c", "a".repeat(251))), prefix);
    }
}
