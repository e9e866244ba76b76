//! Connecting to a tenant: its kubeconfig (from the Secret or annotation its VirtualCluster names), the
//! client built from it within the tenant's response budget, and the checks made on connect: the apiserver
//! answers, accepts the credentials, and is the cluster the VirtualCluster was first synced with.

use base64::Engine;
use crds::{
    VirtualCluster,
    v1alpha1::Adoption,
    wellknown::{ANNOTATION_TENANT_IDENTITY, SECRET_ADMIN_KUBECONFIG},
};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams},
};
use sha2::{Digest, Sha256};
use vc_runtime::{
    clients::{ClientTimeouts, config_from_kubeconfig_yaml},
    error::chain as error_chain,
    limits::{ResponseBudget, ResponseLimits},
};

use super::eligibility::pinned_identity;
use crate::{
    engine::context::Context,
    tenancy::{identity::TenantIdentity, tenant::Connection},
};

/// Why a tenant could not be attached, as a condition reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// CamelCase reason.
    pub reason: &'static str,
    /// What exactly failed.
    pub message: String,
}

pub(super) fn failure(reason: &'static str, message: impl Into<String>) -> Failure {
    Failure {
        reason,
        message: message.into(),
    }
}

/// Reads a tenant's admin kubeconfig: an adopted tenant's from where its VirtualCluster's spec (or, in adopt
/// mode, the original annotations) says, a provisioned tenant's from Secret `admin-kubeconfig` in its root
/// namespace — computed from the VirtualCluster's identity (its cluster key), never read from its status,
/// which other writers can change.
pub async fn load_kubeconfig(
    client: &Client,
    vc: &VirtualCluster,
    identity: &TenantIdentity,
) -> Result<String, Failure> {
    let vc_namespace = identity.vc_namespace.clone();
    let (namespace, name, key) = match vc.adoption() {
        Some(Adoption::InlineBase64(encoded)) => {
            // The decoder's error names the offending byte: told without it.
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(encoded.trim())
                .map_err(|_| {
                    failure(
                        "KubeconfigInvalid",
                        format!(
                            "annotation {} is not valid base64",
                            crds::wellknown::ANNOTATION_ADMIN_KUBECONFIG
                        ),
                    )
                })?;
            return String::from_utf8(bytes)
                .map_err(|_| failure("KubeconfigInvalid", "the inline kubeconfig is not UTF-8 text"));
        }
        Some(Adoption::Secret(reference)) => (vc_namespace, reference.name, reference.key),
        None => (
            identity.cluster_key.clone(),
            SECRET_ADMIN_KUBECONFIG.to_owned(),
            SECRET_ADMIN_KUBECONFIG.to_owned(),
        ),
    };
    let secret = Api::<Secret>::namespaced(client.clone(), &namespace)
        .get_opt(&name)
        .await
        .map_err(|e| {
            failure(
                "KubeconfigUnavailable",
                format!("reading Secret {namespace}/{name}: {e}"),
            )
        })?
        .ok_or_else(|| {
            failure(
                "KubeconfigMissing",
                format!("Secret {namespace}/{name} not found"),
            )
        })?;
    if vc.adoption().is_some() {
        // Only a Secret labelled for this VirtualCluster: an editor who may not write Secrets cannot point
        // it at one meant for something else.
        crds::tenant::kubeconfig_secret_meant_for(&secret.metadata, &identity.vc_name)
            .map_err(|problem| failure(crds::wellknown::REASON_KUBECONFIG_SECRET_REFUSED, problem))?;
    }
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(&key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|d| d.get(&key))
                .map(|s| s.clone().into_bytes())
        })
        .ok_or_else(|| {
            failure(
                "KubeconfigMissing",
                format!("Secret {namespace}/{name} has no key {key:?}"),
            )
        })?;
    String::from_utf8(bytes).map_err(|_| {
        failure(
            "KubeconfigInvalid",
            format!("key {key:?} of Secret {namespace}/{name} is not UTF-8 text"),
        )
    })
}

/// Builds a client from a kubeconfig and asks the apiserver for its version. A provisioned tenant's
/// apiserver (`native_root`: the super client and the tenant's root namespace) is reached at its Service's
/// cluster IP, so the syncer does not depend on cluster DNS. `http2`: one multiplexed connection (see
/// [`vc_runtime::clients::multiplexed_client`]) rather than one per watch.
pub(super) async fn connect(
    kubeconfig: &str,
    native_root: Option<(&Client, &str)>,
    http2: bool,
    limits: ResponseLimits,
) -> Result<(Connection, Answer), Failure> {
    // Data, never a recipe: a kubeconfig that names a file, a program or a proxy builds no client.
    let mut config = config_from_kubeconfig_yaml(kubeconfig, ClientTimeouts::default())
        .await
        .map_err(|e| match e {
            vc_runtime::Error::KubeconfigRefused { .. } => failure("KubeconfigRefused", e.to_string()),
            e => failure("KubeconfigInvalid", error_chain(&e)),
        })?;
    if let Some((super_client, root)) = native_root {
        let server = config.cluster_url.to_string();
        let reachable = vc_runtime::clients::cluster_ip_url(super_client, &server, root)
            .await
            .map_err(|e| failure("TenantUnreachable", error_chain(&e)))?;
        config.cluster_url = reachable
            .parse()
            .map_err(|e| failure("KubeconfigInvalid", format!("server {reachable}: {e}")))?;
    }
    let ca_pem = config.root_cert.as_ref().map(|certs| {
        certs
            .iter()
            .map(|der| {
                let body = base64::engine::general_purpose::STANDARD.encode(der);
                let lines: Vec<&str> = body
                    .as_bytes()
                    .chunks(64)
                    .map(|c| std::str::from_utf8(c).unwrap_or(""))
                    .collect();
                format!(
                    "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
                    lines.join("\n")
                )
            })
            .collect::<String>()
    });
    let server = config.cluster_url.to_string();
    let literal = literal_address(&config.cluster_url);
    // Every response of the tenant apiserver is held to the tenant's budget: an endless body or watch
    // line is cut, and the supervisor detaches the tenant (`TenantResponseTooLarge`).
    let responses = ResponseBudget::new(limits);
    let client =
        vc_runtime::clients::tenant_client(config, ClientTimeouts::default(), http2, responses.clone())
            .map_err(|e| failure("KubeconfigInvalid", error_chain(&e)))?;
    let answer = match check(&client, &format!("at {server}")).await {
        Ok(answer) => answer,
        Err(_) if responses.exceeded().is_some() => {
            return Err(response_too_large(&responses));
        }
        Err(failed) => return Err(failed),
    };
    // The address the connection reached, not every address the server's name resolves to: only that one
    // is the tenant's apiserver as far as the syncer knows.
    let apiserver_addresses = answer
        .peer
        .or(literal)
        .map(|ip| ip.to_string())
        .into_iter()
        .collect();
    let connection = Connection {
        client,
        ca_pem,
        apiserver_addresses,
        responses,
    };
    Ok((connection, answer))
}

/// Reason of the `TenantSynced` condition of a tenant whose apiserver sent more than its responses may
/// hold (`--tenant-response-max-bytes`, `--tenant-watch-line-max-bytes`).
pub const REASON_RESPONSE_TOO_LARGE: &str = "TenantResponseTooLarge";

/// The failure of a tenant whose response was cut.
pub(super) fn response_too_large(responses: &ResponseBudget) -> Failure {
    let limits = responses.limits();
    let what = responses
        .exceeded()
        .map_or_else(|| "a response was cut".to_owned(), |e| e.to_string());
    failure(
        REASON_RESPONSE_TOO_LARGE,
        format!(
            "{what} (limits: {} bytes held at once, --tenant-response-max-bytes; {} bytes per watch line, --tenant-watch-line-max-bytes); the tenant is detached and attached again with backoff, nothing of it is deleted",
            limits.max_bytes, limits.max_line_bytes
        ),
    )
}

/// The IP address a server URL names literally, if it does.
fn literal_address(url: &http::Uri) -> Option<std::net::IpAddr> {
    let host = url.host()?;
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

/// What a tenant apiserver answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// Its `gitVersion`.
    pub version: String,
    /// The uid of its `kube-system` namespace: which cluster it is.
    pub kube_system_uid: String,
    /// The address its answer came from.
    pub peer: Option<std::net::IpAddr>,
}

/// Asks the tenant apiserver for its version (is it there?) and reads its `kube-system` namespace (does it
/// accept the credentials? which cluster is it?): `/version` alone answers anonymous callers too.
pub(super) async fn check(client: &Client, which: &str) -> Result<Answer, Failure> {
    let refused = |status: &kube::core::Status| {
        failure(
            "TenantUnauthorized",
            format!(
                "the tenant apiserver {which} refused the kubeconfig's credentials ({} {})",
                status.code, status.message
            ),
        )
    };
    let unreachable = |error: &kube::Error| {
        failure(
            "TenantUnreachable",
            format!(
                "the tenant apiserver {which} did not answer: {}",
                error_chain(error)
            ),
        )
    };
    let (version, peer) = match vc_runtime::clients::version_and_peer(client).await {
        Ok((version, peer)) => (version.git_version, peer),
        Err(kube::Error::Api(status)) if status.code == 401 || status.code == 403 => {
            return Err(refused(&status));
        }
        Err(error) => return Err(unreachable(&error)),
    };
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.get_opt("kube-system").await {
        Ok(Some(namespace)) => Ok(Answer {
            version,
            kube_system_uid: namespace.uid().unwrap_or_default(),
            peer,
        }),
        Ok(None) => Err(failure(
            "TenantUnreachable",
            format!("the tenant apiserver {which} has no kube-system namespace (yet)"),
        )),
        Err(kube::Error::Api(status)) if status.code == 401 || status.code == 403 => Err(refused(&status)),
        Err(error) => Err(unreachable(&error)),
    }
}

/// Reason of the condition when the tenant is another cluster than the one first synced.
pub const REASON_IDENTITY_CHANGED: &str = "TenantIdentityChanged";

pub(super) fn identity_changed(vc: &VirtualCluster, pinned: &str, found: &str) -> Failure {
    failure(
        REASON_IDENTITY_CHANGED,
        format!(
            "the tenant apiserver's kube-system namespace has uid {found}, but this VirtualCluster was first synced with a tenant whose kube-system has uid {pinned} (annotation {ANNOTATION_TENANT_IDENTITY}): its kubeconfig now leads to another cluster, or the tenant's etcd was replaced. Nothing is synced, and nothing the earlier tenant has in the super cluster is deleted. If the change is deliberate, remove the annotation: kubectl -n {} annotate virtualcluster {} {ANNOTATION_TENANT_IDENTITY}-",
            vc.namespace().unwrap_or_default(),
            vc.name_any()
        ),
    )
}

/// Compares the tenant with the identity recorded on the VirtualCluster, recording it when there is none
/// (the first attachment, or after a platform admin removed it to accept a new tenant).
pub(super) async fn pin_identity(ctx: &Context, vc: &VirtualCluster, found: &str) -> Result<(), Failure> {
    if let Some(pinned) = pinned_identity(vc) {
        return match pinned == found {
            true => Ok(()),
            false => Err(identity_changed(vc, pinned, found)),
        };
    }
    // Only onto the VirtualCluster as it was read: if it changed meanwhile, its update brings this back.
    let patch = serde_json::json!({
        "metadata": {
            "resourceVersion": vc.resource_version(),
            "annotations": { ANNOTATION_TENANT_IDENTITY: found },
        }
    });
    let api: Api<VirtualCluster> =
        Api::namespaced(ctx.super_client.clone(), &vc.namespace().unwrap_or_default());
    let params = PatchParams {
        field_manager: Some(crds::wellknown::FIELD_MANAGER_SYNCER.to_owned()),
        ..Default::default()
    };
    match api.patch(&vc.name_any(), &params, &Patch::Merge(&patch)).await {
        Ok(_) => {
            tracing::info!(vc = %format!("{}/{}", vc.namespace().unwrap_or_default(), vc.name_any()), kube_system_uid = found, "tenant identity recorded");
            Ok(())
        }
        Err(error) => Err(failure(
            "TenantIdentityNotRecorded",
            format!(
                "recording the tenant's identity in annotation {ANNOTATION_TENANT_IDENTITY}: {}",
                error_chain(&error)
            ),
        )),
    }
}

pub(super) fn fingerprint(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{
        engine::context::testing,
        tenancy::attach::fixtures::{KUBECONFIG, answer_kubeconfig, provisioned},
    };

    #[tokio::test]
    async fn a_provisioned_tenants_kubeconfig_is_read_where_its_identity_says_not_where_its_status_says() {
        let (super_client, mut supers) = testing::mock();
        let mut vc = provisioned(Some("Running"), None);
        // Whoever can write the status points it at another tenant's root namespace.
        vc.status.as_mut().expect("status").cluster_namespace = Some("victim-root".into());
        let identity = testing::identity();
        let (loaded, ()) = tokio::join!(load_kubeconfig(&super_client, &vc, &identity), async {
            answer_kubeconfig(&mut supers).await;
        });
        assert_eq!(loaded.expect("loaded"), KUBECONFIG);
        supers.idle().await;
    }

    #[tokio::test]
    async fn the_tenant_identity_is_recorded_once_and_a_different_one_is_refused() {
        let (super_client, mut supers) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let mut vc = provisioned(Some("Running"), None);
        vc.metadata.resource_version = Some("41".into());
        let (pinned, ()) = tokio::join!(pin_identity(&ctx, &vc, "uid-1"), async {
            let patch = supers
                .expect(
                    "PATCH",
                    "/apis/tenancy.x-k8s.io/v1alpha1/namespaces/team/virtualclusters/vc?",
                )
                .await;
            assert_eq!(
                patch.body,
                json!({"metadata": {"resourceVersion": "41", "annotations": {ANNOTATION_TENANT_IDENTITY: "uid-1"}}})
            );
            patch.respond(200, &serde_json::to_value(&vc).expect("json"));
        });
        pinned.expect("recorded");
        vc.metadata.annotations = Some([(ANNOTATION_TENANT_IDENTITY.to_owned(), "uid-1".to_owned())].into());
        pin_identity(&ctx, &vc, "uid-1").await.expect("the same cluster");
        let failed = pin_identity(&ctx, &vc, "uid-2")
            .await
            .expect_err("another cluster");
        assert_eq!(failed.reason, REASON_IDENTITY_CHANGED);
        assert!(failed.message.contains("uid-1") && failed.message.contains("uid-2"));
        assert!(
            failed.message.contains(&format!("{ANNOTATION_TENANT_IDENTITY}-")),
            "{}",
            failed.message
        );
        supers.idle().await;
    }
}
