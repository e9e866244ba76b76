//! Attaching tenants: one supervisor per VirtualCluster reads its kubeconfig, checks the tenant apiserver,
//! starts the tenant's watches, reports on the VirtualCluster, and detaches it when it goes away — without
//! disturbing any other tenant.

use std::{collections::HashMap, sync::Arc, time::Duration};

use base64::Engine;
use crds::{
    VirtualCluster,
    v1alpha1::Adoption,
    wellknown::{ANNOTATION_TENANT_IDENTITY, CONDITION_TENANT_SYNCED, SECRET_ADMIN_KUBECONFIG},
};
use futures::{Stream, StreamExt};
use k8s_openapi::{
    api::core::v1::{Namespace, Pod, Secret},
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
    jiff::Timestamp,
};
use kube::{
    Api, Client, Resource, ResourceExt,
    api::{Patch, PatchParams},
    runtime::{
        events::{Event, EventType, Recorder, Reporter},
        reflector::ObjectRef,
        watcher,
    },
};
use sha2::{Digest, Sha256};
use tokio::{sync::watch, task::JoinHandle};
use vc_runtime::{
    backoff::Backoff,
    clients::{ClientTimeouts, config_from_kubeconfig_yaml},
    error::chain as error_chain,
    limits::{ResponseBudget, ResponseLimits},
};

use crate::{
    engine::{
        budget::REASON_LIMIT_EXCEEDED,
        context::Context,
        items::{Kind, UpItem},
    },
    metrics::StateLabels,
    tenancy::{
        identity::TenantIdentity,
        settings::TenantSettings,
        tenant::{Connection, Tenant},
    },
};

const RETRY_MIN: Duration = Duration::from_secs(1);
const RETRY_MAX: Duration = Duration::from_secs(300);
/// How often a tenant attached again after a detach for its cache limits is looked at until it is ready.
const LIMIT_RECHECK: Duration = Duration::from_millis(500);

/// Why attaching a tenant failed, as far as its retries go: each cause backs off on its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Failing {
    Unreachable,
    OverLimit,
}

/// The identity of a VirtualCluster, once the apiserver gave it a uid.
pub fn identity_of(vc: &VirtualCluster) -> Option<TenantIdentity> {
    TenantIdentity::of(vc).ok()
}

/// Whether the syncer should attach a VirtualCluster, or stay attached (`attached`).
///
/// - Adopted: always; the health check decides (and reports `TenantSynced`).
/// - Provisioned, `Running` or `Updating`: attached. `Updating` is a tenant that has run and whose
///   control plane is rolling out (a new ClusterVersion, a component not ready again): its apiserver
///   answers most of the time, and pausing would hold new pods, deletions and status for the whole rollout.
///   While it does not answer, the health check reports `TenantUnreachable`, nothing is deleted, and its
///   watches restart when it answers again — as during any outage.
/// - Provisioned, `Pending` or `Error` (or no phase yet): only a tenant the syncer already syncs — attached
///   now, or reported `TenantSynced=True` before a syncer restart — stays attached, for the same reasons:
///   vc-manager also reports these phases for tenants that ran (a failed reconcile while a component was
///   not ready, a root namespace recreated after an `Error`). A tenant that never ran is not attached:
///   while it is provisioned (or its provisioning failed) its kubeconfig and apiserver are not there yet,
///   and trying would only report failures until vc-manager says `Running`.
/// - Provisioned, `Paused`: not attached; the control plane is scaled to zero (a paused VirtualCluster is
///   handled before this is asked: its pods are removed, see `supervise_one`).
pub fn eligible(vc: &VirtualCluster, attached: bool) -> bool {
    if vc.meta().deletion_timestamp.is_some() {
        return false;
    }
    if vc.adoption().is_some() {
        return true;
    }
    let has_root = vc
        .status
        .as_ref()
        .and_then(|s| s.cluster_namespace.as_ref())
        .is_some_and(|n| !n.is_empty());
    if !has_root {
        return false;
    }
    match vc.phase() {
        Some(crds::ClusterPhase::Running | crds::ClusterPhase::Updating) => true,
        Some(crds::ClusterPhase::Pending | crds::ClusterPhase::Error) | None => attached || synced_before(vc),
        // Resumed, and vc-manager has not scaled the control plane back yet.
        Some(crds::ClusterPhase::Paused) => false,
    }
}

/// The `TenantSynced` reason of a paused tenant.
pub const REASON_TENANT_PAUSED: &str = "TenantPaused";
/// How soon a paused tenant's super pods are looked at again while some are still there.
const PAUSED_RECHECK: Duration = Duration::from_secs(2);

/// Whether the tenant is attached for the first time since a pause: the syncer's last word was that it is
/// paused, or (an attempt failed meanwhile) it is not synced and vc-manager says it was resumed.
fn resuming(vc: &VirtualCluster) -> bool {
    let Some(status) = vc.status.as_ref() else {
        return false;
    };
    let find = |type_: &str| status.conditions.iter().find(|c| c.type_ == type_);
    let synced = find(CONDITION_TENANT_SYNCED);
    synced.is_some_and(|c| c.reason == REASON_TENANT_PAUSED)
        || (synced.is_none_or(|c| c.status != "True")
            && find(crds::wellknown::CONDITION_PAUSED).is_some_and(|c| c.status == "False"))
}

/// Why the scheduled tenant pods that have no super copy when the tenant is attached are to be recreated
/// rather than treated as lost (deleted for their controllers to replace): the tenant was paused, or it is
/// attached for the first time (no identity pinned yet) and brings pods from elsewhere — a restored
/// snapshot, or an adopted cluster — whose copies never existed here.
fn recreates_missing_copies(vc: &VirtualCluster) -> Option<&'static str> {
    if resuming(vc) {
        Some("resumed after a pause")
    } else if pinned_identity(vc).is_none() {
        Some("first attachment")
    } else {
        None
    }
}

/// Removes a paused tenant's super pods, each pinned to its uid and with its own grace period; nothing in
/// the tenant is touched. Returns how many of its super pods are still there (terminating, or refused).
pub async fn remove_paused_pods(ctx: &Context, cluster_key: &str) -> usize {
    let mut remaining = 0;
    for pod in ctx.supers.pods.copies.state() {
        if !crate::tenancy::identity::belongs_to(pod.meta(), cluster_key) {
            continue;
        }
        remaining += 1;
        if pod.meta().deletion_timestamp.is_some() {
            continue;
        }
        let namespace = pod.namespace().unwrap_or_default();
        let api: Api<Pod> = Api::namespaced(ctx.super_client.clone(), &namespace);
        if let Err(error) = crate::resources::write::delete(ctx, &api, &pod.name_any(), pod.uid(), None).await
        {
            tracing::warn!(%namespace, pod = %pod.name_any(), error = &error as &dyn std::error::Error, "removing a paused tenant's super pod");
        }
    }
    remaining
}

/// Whether the syncer last reported the tenant as synced (`TenantSynced=True`).
fn synced_before(vc: &VirtualCluster) -> bool {
    vc.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == CONDITION_TENANT_SYNCED && c.status == "True")
    })
}

/// Why a tenant could not be attached, as a condition reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// CamelCase reason.
    pub reason: &'static str,
    /// What exactly failed.
    pub message: String,
}

fn failure(reason: &'static str, message: impl Into<String>) -> Failure {
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
async fn connect(
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
fn response_too_large(responses: &ResponseBudget) -> Failure {
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
async fn check(client: &Client, which: &str) -> Result<Answer, Failure> {
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

/// Why attaching stopped: the tenant was handed over to another replica meanwhile (never reported: the
/// new owner reports).
const REASON_HANDED_OVER: &str = "TenantHandedOver";

/// Reason of the condition when the tenant is another cluster than the one first synced.
pub const REASON_IDENTITY_CHANGED: &str = "TenantIdentityChanged";

/// The tenant identity the VirtualCluster was first synced with (the uid of the tenant's `kube-system`).
fn pinned_identity(vc: &VirtualCluster) -> Option<&str> {
    vc.annotations()
        .get(ANNOTATION_TENANT_IDENTITY)
        .map(String::as_str)
        .filter(|uid| !uid.is_empty())
}

fn identity_changed(vc: &VirtualCluster, pinned: &str, found: &str) -> Failure {
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
async fn pin_identity(ctx: &Context, vc: &VirtualCluster, found: &str) -> Result<(), Failure> {
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

fn fingerprint(text: &str) -> String {
    hex::encode(&Sha256::digest(text.as_bytes())[..8])
}

/// Writes the syncer's condition on a VirtualCluster (only when it changes) and an event on changes.
async fn report(
    ctx: &Context,
    recorder: &Recorder,
    vc: &VirtualCluster,
    ok: bool,
    reason: &str,
    message: &str,
) {
    let status = if ok { "True" } else { "False" };
    let current = vc.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_TENANT_SYNCED)
            .cloned()
    });
    if current
        .as_ref()
        .is_some_and(|c| c.status == status && c.reason == reason && c.message == message)
    {
        return;
    }
    let transition = match &current {
        Some(c) if c.status == status => c.last_transition_time.clone(),
        _ => Time(Timestamp::now()),
    };
    let condition = Condition {
        type_: CONDITION_TENANT_SYNCED.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.to_owned(),
        last_transition_time: transition,
        observed_generation: vc.metadata.generation,
    };
    let patch = serde_json::json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1",
        "kind": "VirtualCluster",
        "status": { "conditions": [condition] },
    });
    let api: Api<VirtualCluster> =
        Api::namespaced(ctx.super_client.clone(), &vc.namespace().unwrap_or_default());
    let params = crate::resources::write::apply_params().force();
    if let Err(error) = api
        .patch_status(&vc.name_any(), &params, &Patch::Apply(&patch))
        .await
    {
        tracing::warn!(vc = %vc.name_any(), namespace = %vc.namespace().unwrap_or_default(), %error, "writing the TenantSynced condition");
    }
    let changed_status = current
        .as_ref()
        .is_none_or(|c| c.status != status || c.reason != reason);
    if changed_status {
        let event = Event {
            type_: if ok { EventType::Normal } else { EventType::Warning },
            reason: reason.to_owned(),
            note: Some(message.chars().take(1000).collect()),
            action: "Attach".into(),
            secondary: None,
        };
        if let Err(error) = recorder.publish(&event, &vc.object_ref(&())).await {
            tracing::debug!(vc = %vc.name_any(), %error, "publishing an event on the VirtualCluster");
        }
    }
}

/// The settings the syncer runs a VirtualCluster with, within the platform's limits, and a note for each
/// field of its spec the platform limits ([`TenantSettings::within`]), the forced RuntimeClass included.
pub fn limited_settings(ctx: &Context, vc: &VirtualCluster) -> (TenantSettings, Vec<String>) {
    let (settings, mut notes) = TenantSettings::within(vc, &ctx.config.limits, &ctx.virtual_clusters.state());
    if let Some(forced) = settings.runtime_class_name.as_deref()
        && !crate::resources::runtime_class::forcible(ctx, forced)
    {
        notes.push(format!(
            "spec.runtimeClassName {forced:?} is neither published (label {}=true) nor listed by the platform (--pod-forcible-runtime-classes): the tenant's pods are refused until it is",
            crds::wellknown::LABEL_SUPER_PUBLIC
        ));
    }
    (settings, notes)
}

/// Type of the syncer's condition on a VirtualCluster saying whether its spec asks for more than the
/// platform allows (True: the tenant runs with less, as the message says field by field).
pub const CONDITION_SPEC_LIMITED: &str = "SpecLimited";

/// Reason of [`CONDITION_SPEC_LIMITED`] when the platform limited the spec.
pub const REASON_PLATFORM_LIMITS: &str = "PlatformLimits";

/// Field manager of [`CONDITION_SPEC_LIMITED`]: apart from the one of `TenantSynced`, so that applying one
/// condition never removes the other.
const FIELD_MANAGER_LIMITS: &str = "vc-syncer-limits";

/// Writes the `SpecLimited` condition (only when it changes) and a Warning event when the platform newly
/// limits the spec or limits it otherwise.
async fn report_limits(ctx: &Context, recorder: &Recorder, vc: &VirtualCluster, notes: &[String]) {
    let (status, reason, message) = match notes.is_empty() {
        true => (
            "False",
            "WithinPlatformLimits",
            "the spec is within the platform's limits".to_owned(),
        ),
        false => ("True", REASON_PLATFORM_LIMITS, notes.join("; ")),
    };
    let current = vc.status.as_ref().and_then(|s| {
        s.conditions
            .iter()
            .find(|c| c.type_ == CONDITION_SPEC_LIMITED)
            .cloned()
    });
    if current
        .as_ref()
        .is_some_and(|c| c.status == status && c.reason == reason && c.message == message)
    {
        return;
    }
    ctx.metrics
        .spec_limited
        .inc_by(u64::try_from(notes.len()).unwrap_or(0));
    let condition = Condition {
        type_: CONDITION_SPEC_LIMITED.to_owned(),
        status: status.to_owned(),
        reason: reason.to_owned(),
        message: message.clone(),
        last_transition_time: match &current {
            Some(c) if c.status == status => c.last_transition_time.clone(),
            _ => Time(Timestamp::now()),
        },
        observed_generation: vc.metadata.generation,
    };
    let patch = serde_json::json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1",
        "kind": "VirtualCluster",
        "status": { "conditions": [condition] },
    });
    let api: Api<VirtualCluster> =
        Api::namespaced(ctx.super_client.clone(), &vc.namespace().unwrap_or_default());
    let params = PatchParams::apply(FIELD_MANAGER_LIMITS).force();
    if let Err(error) = api
        .patch_status(&vc.name_any(), &params, &Patch::Apply(&patch))
        .await
    {
        tracing::warn!(vc = %vc.name_any(), namespace = %vc.namespace().unwrap_or_default(), %error, "writing the SpecLimited condition");
    }
    if notes.is_empty() {
        return;
    }
    tracing::warn!(vc = %vc.name_any(), namespace = %vc.namespace().unwrap_or_default(), %message, "the platform limits the VirtualCluster's spec");
    let event = Event {
        type_: EventType::Warning,
        reason: REASON_PLATFORM_LIMITS.to_owned(),
        note: Some(message.chars().take(1000).collect()),
        action: "Limit".into(),
        secondary: None,
    };
    if let Err(error) = recorder.publish(&event, &vc.object_ref(&())).await {
        tracing::debug!(vc = %vc.name_any(), %error, "publishing an event on the VirtualCluster");
    }
}

/// Stops syncing a tenant and forgets its queued work and series.
pub fn detach(ctx: &Context, cluster_key: &str) {
    if let Some(tenant) = ctx.tenants.remove(cluster_key) {
        tracing::info!(tenant = %tenant.identity.vc_ref(), "detaching tenant");
        tenant.stop();
        ctx.queues.down.remove_tenant(&tenant.id);
        ctx.queues.up.remove_tenant(&tenant.id);
        ctx.quota.forget(&tenant.id);
        ctx.events.forget(&tenant.id);
        ctx.metrics.forget_tenant(&tenant.identity.vc_ref());
    }
}

/// Deletes every super namespace of a tenant whose VirtualCluster is gone (their contents go with them).
pub async fn clean_up(ctx: &Context, cluster_key: &str) {
    delete_namespaces(ctx, |namespace| {
        crate::tenancy::identity::belongs_to(namespace.meta(), cluster_key)
    })
    .await;
}

/// Deletes the super namespaces of removed tenants that `doomed` picks, unless already being deleted, each
/// only while it has the uid the cache holds; returns how many it deleted.
pub async fn delete_namespaces(ctx: &Context, doomed: impl Fn(&Namespace) -> bool) -> usize {
    let api: Api<Namespace> = Api::all(ctx.super_client.clone());
    let mut deleted = 0;
    for namespace in ctx.supers.namespaces.store.state() {
        if namespace.meta().deletion_timestamp.is_some() || !doomed(&namespace) {
            continue;
        }
        match crate::resources::write::delete(ctx, &api, &namespace.name_any(), namespace.uid(), None).await {
            Ok(()) => deleted += 1,
            Err(error) => {
                tracing::warn!(namespace = %namespace.name_any(), error = &error as &dyn std::error::Error, "deleting a removed tenant's namespace")
            }
        }
    }
    deleted
}

fn set_state(ctx: &Context, state: &'static str, delta: i64) {
    ctx.metrics
        .tenants
        .get_or_create(&StateLabels { state })
        .inc_by(delta);
}

/// Follows one VirtualCluster for as long as it exists.
async fn supervise_one(
    ctx: Arc<Context>,
    recorder: Arc<Recorder>,
    mut updates: watch::Receiver<Arc<VirtualCluster>>,
) {
    let mut attached: Option<(Arc<Tenant>, String)> = None;
    // Failed attempts in a row, apart by cause. Detaches for the cache limits back off until the tenant
    // fits, even though each attempt attaches (only a full listing within the limits shows that it fits).
    let retry = Backoff::<Failing>::new(RETRY_MIN, RETRY_MAX);
    let mut state: Option<&'static str> = None;
    // Sharded: which tenants this replica holds changes under the supervisor's feet.
    let mut ownership = ctx.shards.as_ref().map(|shards| shards.subscribe());
    let mut enter = |ctx: &Context, new: Option<&'static str>| {
        if state != new {
            if let Some(old) = state {
                set_state(ctx, old, -1);
            }
            if let Some(new) = new {
                set_state(ctx, new, 1);
            }
            state = new;
        }
    };
    loop {
        let vc = updates.borrow_and_update().clone();
        let Some(identity) = identity_of(&vc) else {
            if updates.changed().await.is_err() {
                break;
            }
            continue;
        };
        // Detached meanwhile (handed over to another replica): nothing of it is attached here any more.
        if attached.as_ref().is_some_and(|(tenant, _)| {
            ctx.tenants
                .get(&identity.cluster_key)
                .is_none_or(|current| !Arc::ptr_eq(&current, tenant))
        }) {
            attached = None;
        }
        let owned = ctx.owns(&identity.cluster_key);
        let wait = if !owned {
            // Another replica syncs it (or will, once it takes the Lease): nothing is attached, reported or
            // removed from here.
            if attached.take().is_some() {
                detach(&ctx, &identity.cluster_key);
            }
            enter(&ctx, Some("elsewhere"));
            None
        } else if vc.spec.paused && vc.meta().deletion_timestamp.is_none() {
            // Paused: stop watching (a provisioned apiserver is going away) and remove the super pods; the
            // super Services and every other copy stay, so resuming gets the same cluster IPs back.
            if attached.take().is_some() {
                detach(&ctx, &identity.cluster_key);
            }
            enter(&ctx, Some("paused"));
            let remaining = remove_paused_pods(&ctx, &identity.cluster_key).await;
            report(
                &ctx,
                &recorder,
                &vc,
                false,
                REASON_TENANT_PAUSED,
                "spec.paused is true: the tenant's pods are removed from the super cluster and not recreated until it is resumed; nothing in the tenant is deleted",
            )
            .await;
            (remaining > 0).then_some(PAUSED_RECHECK)
        } else if !eligible(&vc, attached.is_some()) {
            if attached.take().is_some() {
                detach(&ctx, &identity.cluster_key);
            }
            enter(&ctx, Some("waiting"));
            None
        } else {
            // A syncer process that stopped while attaching it holds it back (for any replica).
            let judged = match (&ctx.journal, attached.is_some()) {
                (Some(journal), false) => {
                    Some(crate::tenancy::journal::stops::judge(&ctx, journal, &recorder, &vc).await)
                }
                _ => None,
            };
            if let Some((crate::tenancy::journal::Standing::HeldBack { until }, Some(record))) = judged {
                // A syncer process stopped while attaching it: not attached (by any replica) before `until`.
                enter(&ctx, Some("held_back"));
                report(
                    &ctx,
                    &recorder,
                    &vc,
                    false,
                    crate::tenancy::journal::REASON_TENANT_HELD_BACK,
                    &crate::tenancy::journal::stop_message(&record),
                )
                .await;
                let wait = until.duration_since(Timestamp::now());
                Some(
                    Duration::try_from(wait)
                        .unwrap_or_default()
                        .max(Duration::from_secs(1)),
                )
            } else {
                let kind = match judged {
                    Some((crate::tenancy::journal::Standing::Attach(kind), _)) => kind,
                    _ => crate::tenancy::journal::kind_of(&vc),
                };
                let recovering = retry.failures(&Failing::Unreachable) > 0;
                let (settings, limited) = limited_settings(&ctx, &vc);
                let mut ticket = None;
                let journal = ctx.journal.as_ref().map(|journal| JournalEntry {
                    journal,
                    kind,
                    interrupt: updates.clone(),
                    ticket: &mut ticket,
                });
                // After the attempt: the first attach pins the tenant's identity with a resourceVersion-pinned
                // patch of the VirtualCluster, which a status write just before would make conflict.
                let attempt =
                    attach_or_check(&ctx, &vc, &identity, &mut attached, recovering, settings, journal).await;
                if let (Some(ticket), Some((tenant, _))) = (ticket, attached.as_ref()) {
                    // In the journal until it has listed and stayed attached for the probation.
                    crate::tenancy::journal::stops::probation(ctx.clone(), tenant.clone(), ticket);
                }
                if ctx.owns(&identity.cluster_key) {
                    report_limits(&ctx, &recorder, &vc, &limited).await;
                }
                match attempt {
                    Err(failed) if failed.reason == REASON_QUEUED => {
                        // The VirtualCluster changed while the tenant waited for its turn: looked at again.
                        None
                    }
                    Ok(_)
                        if retry.failures(&Failing::OverLimit) > 0
                            && !attached.as_ref().is_some_and(|(tenant, _)| tenant.is_ready()) =>
                    {
                        // Attached again after a detach for the cache limits, still listing: the condition keeps
                        // saying why it was detached until the tenant shows that it fits.
                        Some(LIMIT_RECHECK)
                    }
                    Ok(version) => {
                        enter(&ctx, Some("attached"));
                        retry.reset(&Failing::Unreachable);
                        retry.reset(&Failing::OverLimit);
                        report(
                            &ctx,
                            &recorder,
                            &vc,
                            true,
                            "TenantAttached",
                            &format!("syncing with the tenant apiserver ({version})"),
                        )
                        .await;
                        Some(ctx.config.tenant_health_period)
                    }
                    Err(_) if !ctx.owns(&identity.cluster_key) => {
                        // Handed over while attaching: the new owner reports.
                        enter(&ctx, Some("elsewhere"));
                        None
                    }
                    Err(failed) => {
                        let over_limit = failed.reason == REASON_LIMIT_EXCEEDED
                            || failed.reason == REASON_RESPONSE_TOO_LARGE;
                        enter(&ctx, Some(if over_limit { "over_limit" } else { "unreachable" }));
                        let wait = retry.failed(&if over_limit {
                            Failing::OverLimit
                        } else {
                            Failing::Unreachable
                        });
                        tracing::warn!(vc = %identity.vc_ref(), reason = failed.reason, message = %failed.message, retry_in_s = wait.as_secs(), "tenant not synced");
                        report(&ctx, &recorder, &vc, false, failed.reason, &failed.message).await;
                        Some(wait)
                    }
                }
            }
        };
        // A tenant that goes over its cache limits is detached at once, not at the next health check.
        let over_limit = {
            let budgets = attached
                .as_ref()
                .map(|(tenant, _)| (tenant.budget.clone(), tenant.responses.clone()));
            async move {
                match budgets {
                    Some((cache, responses)) => tokio::select! {
                        () = cache.wait_exceeded() => {}
                        _ = responses.wait_exceeded() => {}
                    },
                    None => std::future::pending().await,
                }
            }
        };
        // Wakes only when this tenant's ownership changed since the look above, not on every other
        // tenant's handover.
        let owner_changed = async {
            match ownership.as_mut() {
                Some(ownership) => loop {
                    if ownership.changed().await.is_err() {
                        std::future::pending::<()>().await;
                    }
                    if ctx.owns(&identity.cluster_key) != owned {
                        break;
                    }
                },
                None => std::future::pending().await,
            }
        };
        let changed = match wait {
            Some(wait) => tokio::select! {
                changed = updates.changed() => changed,
                _ = tokio::time::sleep(wait) => Ok(()),
                _ = over_limit => Ok(()),
                () = owner_changed => Ok(()),
            },
            None => tokio::select! {
                changed = updates.changed() => changed,
                () = owner_changed => Ok(()),
            },
        };
        if changed.is_err() {
            break;
        }
    }
    enter(&ctx, None);
}

/// Why attaching stopped before its turn in the attach journal came: the VirtualCluster changed (never
/// reported; the supervisor looks again).
const REASON_QUEUED: &str = "TenantAttachQueued";

/// How an attach enters the journal: as what kind, given up when the VirtualCluster changes meanwhile,
/// and where the ticket goes once the tenant is attached.
struct JournalEntry<'a> {
    journal: &'a Arc<crate::tenancy::journal::Journal>,
    kind: crate::tenancy::journal::Kind,
    interrupt: watch::Receiver<Arc<VirtualCluster>>,
    ticket: &'a mut Option<crate::tenancy::journal::Ticket>,
}

/// Attaches the tenant (again, if its kubeconfig changed) or checks that it still answers. Its caches
/// start listing only once the tenant is in the attach journal (`journal`).
async fn attach_or_check(
    ctx: &Context,
    vc: &VirtualCluster,
    identity: &TenantIdentity,
    attached: &mut Option<(Arc<Tenant>, String)>,
    recovering: bool,
    settings: TenantSettings,
    journal: Option<JournalEntry<'_>>,
) -> Result<String, Failure> {
    let kubeconfig = load_kubeconfig(&ctx.super_client, vc, identity).await?;
    let print = fingerprint(&kubeconfig);
    if let Some((tenant, _)) = attached.as_ref()
        && tenant.responses.exceeded().is_some()
    {
        // A response was cut: its caches may miss what it held. Detached, and attached again with backoff.
        let failed = response_too_large(&tenant.responses);
        attached.take();
        detach(ctx, &identity.cluster_key);
        return Err(failed);
    }
    if let Some((tenant, _)) = attached.as_ref()
        && let Some(exceeded) = tenant.budget.exceeded()
    {
        // Its caches miss what did not fit, and its work is held; detaching frees what they hold. The
        // next attempt lists the tenant anew and stays attached if it fits by then.
        attached.take();
        detach(ctx, &identity.cluster_key);
        return Err(failure(REASON_LIMIT_EXCEEDED, exceeded));
    }
    if let Some((tenant, current)) = attached.as_ref()
        && *current == print
    {
        update_settings(ctx, tenant, settings.clone());
        // Its labels decide which custom resource kinds it gets.
        crate::resources::custom_resource::definition::queue_changed(ctx, tenant);
        // During an outage the tenant stays attached and its watches retry on their own, with a backoff
        // that may have grown long; once the apiserver answers again, fresh watches catch up at once.
        let answer = check(&tenant.client, &format!("of {}", identity.vc_ref())).await?;
        if answer.kube_system_uid != tenant.kube_system_uid {
            // Same kubeconfig, another cluster (its etcd was replaced): stop before anything is deleted.
            // The tenant's own check already holds its work (see Tenant::is_ready).
            let changed = identity_changed(vc, &tenant.kube_system_uid, &answer.kube_system_uid);
            attached.take();
            detach(ctx, &identity.cluster_key);
            return Err(changed);
        }
        if !recovering {
            return Ok(answer.version);
        }
        tracing::info!(vc = %identity.vc_ref(), "tenant apiserver answers again; restarting its watches");
    }
    let native_root = vc
        .adoption()
        .is_none()
        .then_some((&ctx.super_client, identity.cluster_key.as_str()));
    let (connection, answer) = connect(
        &kubeconfig,
        native_root,
        ctx.config.tenant_http2,
        ctx.config.tenant_response_limits,
    )
    .await?;
    if let Err(failed) = pin_identity(ctx, vc, &answer.kube_system_uid).await {
        // A kubeconfig that now leads elsewhere: whatever was attached (the earlier cluster, through the
        // earlier kubeconfig) stops too, so that the tenant is not synced from two places in turn.
        if failed.reason == REASON_IDENTITY_CHANGED && attached.take().is_some() {
            detach(ctx, &identity.cluster_key);
        }
        return Err(failed);
    }
    // Its place in the journal before anything large is read: should the process stop from here until the
    // tenant has stayed attached for the probation, the stop counts against it. Not before the connection:
    // its replies are small and bounded, and an apiserver that never answers would write the journal at
    // every retry.
    let ticket = match journal {
        Some(JournalEntry {
            journal,
            kind,
            mut interrupt,
            ticket,
        }) => {
            let entered = tokio::select! {
                entered = journal.enter(&identity.cluster_key, kind) => entered,
                _ = interrupt.changed() => {
                    return Err(failure(REASON_QUEUED, "waiting for its turn in the attach journal"));
                }
            };
            Some((entered, ticket))
        }
        None => None,
    };
    let version = answer.version.clone();
    if attached.take().is_some() {
        detach(ctx, &identity.cluster_key);
    }
    // A detach (just now, or earlier for the tenant's cache limits) forgot the tenant's usage; its running
    // pods send no events that would count them. Counting is idempotent, so a first attach costs nothing.
    let id: crate::engine::queue::TenantId = Arc::from(identity.cluster_key.as_str());
    let pods = ctx.supers.pods.copies.state();
    ctx.quota.recount(&id, pods.iter().map(|p| &**p));
    recount_objects(ctx, &id);
    tracing::info!(vc = %identity.vc_ref(), cluster_key = %identity.cluster_key, %version, "attaching tenant");
    let tenant = Tenant::start(
        identity.clone(),
        connection,
        answer.kube_system_uid,
        settings,
        &ctx.queues,
        ctx.config.sync_ingresses,
        &ctx.config.custom_resources,
        ctx.config.tenant_cache_limits,
    );
    if let Some(why) = recreates_missing_copies(vc) {
        // Before the caches are ready, so before any pod is synced.
        let _ = tenant
            .resumed
            .set(crate::tenancy::tenant::Resumed::at(Timestamp::now()));
        tracing::info!(vc = %identity.vc_ref(), why, "scheduled tenant pods without a super copy are recreated, not treated as lost");
    }
    // Sharded: only while this replica holds the tenant's Lease, checked atomically with the insert.
    let Some(previous) = ctx.admit(&identity.cluster_key, || ctx.tenants.insert(tenant.clone())) else {
        tenant.stop();
        return Err(failure(
            REASON_HANDED_OVER,
            "another syncer replica syncs this tenant now",
        ));
    };
    if let Some(previous) = previous {
        previous.stop();
    }
    tokio::spawn({
        let tenant = tenant.clone();
        let listed = ctx.metrics.tenant_list_duration.clone();
        let attached_at = std::time::Instant::now();
        async move {
            tenant.become_ready().await;
            listed.observe(attached_at.elapsed().as_secs_f64());
        }
    });
    // Outside `pods` mode the tenant sees its nodes from the start.
    if ctx.config.vnode_mode != crate::engine::config::VNodeMode::Pods {
        for node in ctx.supers.nodes.state() {
            ctx.queues
                .up
                .add(&tenant.id, UpItem::cluster(Kind::Node, &node.name_any()));
        }
    }
    // Public classes only change rarely; a new tenant needs the current set.
    for class in ctx.supers.storage_classes.state() {
        ctx.queues
            .up
            .add(&tenant.id, UpItem::cluster(Kind::StorageClass, &class.name_any()));
    }
    for class in ctx.supers.priority_classes.state() {
        ctx.queues.up.add(
            &tenant.id,
            UpItem::cluster(Kind::PriorityClass, &class.name_any()),
        );
    }
    for class in ctx.supers.runtime_classes.state() {
        ctx.queues
            .up
            .add(&tenant.id, UpItem::cluster(Kind::RuntimeClass, &class.name_any()));
    }
    for class in ctx.supers.ingress_classes.iter().flat_map(|s| s.state()) {
        ctx.queues
            .up
            .add(&tenant.id, UpItem::cluster(Kind::IngressClass, &class.name_any()));
    }
    *attached = Some((tenant, print));
    if let Some((entered, ticket)) = ticket {
        *ticket = Some(entered);
    }
    Ok(version)
}

/// Applies a VirtualCluster's settings to its attached tenant; returns whether they changed. A changed
/// quota (raised, lowered or removed) queues the pods waiting for quota at once: they may fit now, and if
/// not, they wait as before.
pub fn update_settings(ctx: &Context, tenant: &Tenant, settings: TenantSettings) -> bool {
    let quota_changed = tenant.settings().quota != settings.quota;
    if !tenant.update_settings(settings, &ctx.queues) {
        return false;
    }
    tracing::info!(vc = %tenant.identity.vc_ref(), "tenant settings updated");
    if quota_changed {
        let queued = ctx.quota.requeue_waiting(&tenant.id);
        tracing::info!(vc = %tenant.identity.vc_ref(), queued, "quota changed; pods waiting for quota queued again");
    }
    true
}

struct Supervised {
    updates: watch::Sender<Arc<VirtualCluster>>,
    task: JoinHandle<()>,
    cluster_key: Option<String>,
}

/// The recorder of the syncer's events on VirtualClusters.
pub fn recorder(ctx: &Context) -> Recorder {
    Recorder::new(
        ctx.super_client.clone(),
        Reporter {
            controller: crds::wellknown::FIELD_MANAGER_SYNCER.into(),
            instance: Some(vc_runtime::leader::identity()),
        },
    )
}

/// Follows every VirtualCluster: one supervisor each, detaching and cleaning up when one is deleted.
pub async fn supervise<S>(ctx: Arc<Context>, events: S)
where
    S: Stream<Item = Result<watcher::Event<VirtualCluster>, watcher::Error>>,
{
    let recorder = Arc::new(recorder(&ctx));
    let mut supervised: HashMap<String, Supervised> = HashMap::new();
    let mut listed: Vec<String> = Vec::new();
    let mut events = std::pin::pin!(events);
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Init) => listed.clear(),
            Ok(watcher::Event::InitApply(vc)) => {
                listed.push(vc.uid().unwrap_or_default());
                upsert(&ctx, &recorder, &mut supervised, vc);
            }
            Ok(watcher::Event::InitDone) => {
                let gone: Vec<String> = supervised
                    .keys()
                    .filter(|uid| !listed.contains(uid))
                    .cloned()
                    .collect();
                for uid in gone {
                    remove(&ctx, &mut supervised, &uid).await;
                }
            }
            Ok(watcher::Event::Apply(vc)) => upsert(&ctx, &recorder, &mut supervised, vc),
            Ok(watcher::Event::Delete(vc)) => {
                remove(&ctx, &mut supervised, &vc.uid().unwrap_or_default()).await
            }
            Err(error) => tracing::debug!(%error, "VirtualCluster watch interrupted; retrying"),
        }
    }
}

fn upsert(
    ctx: &Arc<Context>,
    recorder: &Arc<Recorder>,
    supervised: &mut HashMap<String, Supervised>,
    vc: VirtualCluster,
) {
    let Some(uid) = vc.uid() else { return };
    let cluster_key = crds::naming::cluster_key_of(&vc);
    let vc = Arc::new(vc);
    match supervised.get_mut(&uid) {
        Some(entry) => {
            entry.cluster_key = cluster_key;
            let _ = entry.updates.send(vc);
        }
        None => {
            let (updates, receiver) = watch::channel(vc);
            let task = tokio::spawn(supervise_one(ctx.clone(), recorder.clone(), receiver));
            supervised.insert(
                uid,
                Supervised {
                    updates,
                    task,
                    cluster_key,
                },
            );
        }
    }
}

async fn remove(ctx: &Arc<Context>, supervised: &mut HashMap<String, Supervised>, uid: &str) {
    let Some(entry) = supervised.remove(uid) else {
        return;
    };
    entry.task.abort();
    if let Some(key) = entry.cluster_key {
        detach(ctx, &key);
        // Sharded: the replica that held the tenant removes its namespaces when it sees the VirtualCluster
        // gone (see `shards::handover::balance`), and the cluster-wide patrol catches what a dead one left.
        if ctx.shards.is_none() {
            clean_up(ctx, &key).await;
        }
    }
}

/// Whether a super namespace belongs to no live VirtualCluster (its tenant was deleted while the syncer
/// was not running).
pub fn orphaned(ctx: &Context, namespace: &Namespace) -> bool {
    let Some(key) = crate::tenancy::identity::owner_cluster(namespace.meta()) else {
        return false;
    };
    let vc_namespace = namespace
        .annotations()
        .get(crds::wellknown::ANNOTATION_VC_NAMESPACE);
    let vc_name = namespace.annotations().get(crds::wellknown::ANNOTATION_VC_NAME);
    let (Some(vc_namespace), Some(vc_name)) = (vc_namespace, vc_name) else {
        return false;
    };
    let live = ctx
        .virtual_clusters
        .get(&ObjectRef::new(vc_name).within(vc_namespace))
        .is_some_and(|vc| crds::naming::cluster_key_of(&vc).as_deref() == Some(key));
    !live
}

/// Counts a tenant's super Services and PersistentVolumeClaims again from the cache, as its pods are.
fn recount_objects(ctx: &Context, tenant: &crate::engine::queue::TenantId) {
    use kube::Resource;
    let ours =
        |meta: &kube::api::ObjectMeta| crate::tenancy::identity::owner_cluster(meta) == Some(&**tenant);
    for service in ctx.supers.services.state().iter().filter(|s| ours(s.meta())) {
        let usage = crate::accounting::quota::service_usage(service.spec.as_ref());
        ctx.quota
            .observe_object(service.meta(), Kind::Service, Some(usage));
    }
    for claim in ctx.supers.claims.state().iter().filter(|c| ours(c.meta())) {
        let usage = crate::accounting::quota::claim_usage(claim.spec.as_ref());
        ctx.quota
            .observe_object(claim.meta(), Kind::PersistentVolumeClaim, Some(usage));
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use serde_json::json;

    use super::*;
    use crate::{
        accounting::quota::Usage,
        engine::{
            context::testing::{self, from_json},
            items::{DownItem, Kind},
        },
    };

    fn provisioned(phase: Option<&str>, synced: Option<&str>) -> VirtualCluster {
        let mut status = json!({"clusterNamespace": "team-abc123-vc"});
        if let Some(phase) = phase {
            status["phase"] = json!(phase);
        }
        if let Some(synced) = synced {
            status["conditions"] = json!([{"type": CONDITION_TENANT_SYNCED, "status": synced, "reason": "R",
                "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]);
        }
        from_json(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": "vc", "namespace": "team", "uid": "vc-uid"},
            "spec": {"clusterVersionName": "v1", "quota": {"pods": "1"}},
            "status": status,
        }))
    }

    #[test]
    fn provisioned_tenants_are_synced_while_they_run_or_roll_out() {
        for phase in ["Running", "Updating"] {
            for attached in [false, true] {
                assert!(eligible(&provisioned(Some(phase), None), attached), "{phase}");
            }
        }
        // Never synced: a tenant being provisioned, or whose provisioning failed, has nothing to talk to.
        for phase in [Some("Pending"), Some("Error"), None] {
            assert!(!eligible(&provisioned(phase, None), false), "{phase:?}");
            assert!(!eligible(&provisioned(phase, Some("False")), false), "{phase:?}");
            // Synced before (now, or before a restart): it stays synced; the health check decides.
            assert!(eligible(&provisioned(phase, None), true), "{phase:?}");
            assert!(eligible(&provisioned(phase, Some("True")), false), "{phase:?}");
        }
        // Without a root namespace there is no kubeconfig to read; being deleted ends syncing.
        let mut rootless = provisioned(Some("Running"), None);
        rootless.status.as_mut().expect("status").cluster_namespace = None;
        assert!(!eligible(&rootless, true));
        let mut deleting = provisioned(Some("Updating"), Some("True"));
        deleting.metadata.deletion_timestamp = Some(Time(Timestamp::now()));
        assert!(!eligible(&deleting, true));
        // Adopted tenants do not go by the phase.
        let adopted: VirtualCluster = from_json(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": "vc", "namespace": "team", "uid": "vc-uid"},
            "spec": {"kubeconfigSecretRef": {"name": "k"}},
            "status": {"phase": "Error"},
        }));
        assert!(eligible(&adopted, false));
    }

    const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\n";

    fn kube_system(uid: &str) -> serde_json::Value {
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system", "uid": uid}})
    }

    /// Answers the reads of one `attach_or_check` of an attached tenant: its kubeconfig Secret (super),
    /// then `/version` and a namespace list (tenant).
    async fn answer_check(supers: &mut testing::ApiServer, tenants: &mut testing::ApiServer) {
        let secret = supers
            .expect(
                "GET",
                "/api/v1/namespaces/team-abc123-vc/secrets/admin-kubeconfig",
            )
            .await;
        secret.respond(
            200,
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "admin-kubeconfig"},
                "data": {"admin-kubeconfig": base64::engine::general_purpose::STANDARD.encode(KUBECONFIG)}}),
        );
        tenants.expect("GET", "/version").await.respond(
            200,
            &json!({"major": "1", "minor": "25", "gitVersion": "v1.25.9", "gitCommit": "x", "gitTreeState": "clean",
                "buildDate": "2023-04-12T12:00:00Z", "goVersion": "go1.19", "compiler": "gc", "platform": "linux/amd64"}),
        );
        tenants
            .expect("GET", "/api/v1/namespaces/kube-system")
            .await
            .respond(200, &kube_system("kube-system-uid"));
    }

    #[tokio::test]
    async fn a_provisioned_tenants_kubeconfig_is_read_where_its_identity_says_not_where_its_status_says() {
        let (super_client, mut supers) = testing::mock();
        let mut vc = provisioned(Some("Running"), None);
        // Whoever can write the status points it at another tenant's root namespace.
        vc.status.as_mut().expect("status").cluster_namespace = Some("victim-root".into());
        let identity = testing::identity();
        let (loaded, ()) = tokio::join!(load_kubeconfig(&super_client, &vc, &identity), async {
            supers
                .expect(
                    "GET",
                    "/api/v1/namespaces/team-abc123-vc/secrets/admin-kubeconfig",
                )
                .await
                .respond(
                    200,
                    &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "admin-kubeconfig"},
                        "data": {"admin-kubeconfig": base64::engine::general_purpose::STANDARD.encode(KUBECONFIG)}}),
                );
        });
        assert_eq!(loaded.expect("loaded"), KUBECONFIG);
        supers.idle().await;
    }

    #[tokio::test]
    async fn a_kubeconfig_that_runs_a_program_is_refused_before_any_request() {
        let (super_client, mut supers) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let hostile = "apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: 'https://attacker.example:6443'}}]
users: [{name: u, user: {exec: {apiVersion: client.authentication.k8s.io/v1, command: /bin/sh, args: [-c, 'cat /var/run/secrets/kubernetes.io/serviceaccount/token']}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
";
        let vc: VirtualCluster = from_json(json!({
            "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
            "metadata": {"name": "vc", "namespace": "team", "uid": "vc-uid", "annotations": {
                crds::wellknown::ANNOTATION_ADMIN_KUBECONFIG: base64::engine::general_purpose::STANDARD.encode(hostile)}},
            "spec": {"clusterVersionName": "v1"},
        }));
        let mut attached = None;
        let failed = attach_or_check(
            &ctx,
            &vc,
            &testing::identity(),
            &mut attached,
            false,
            TenantSettings::of(&vc),
            None,
        )
        .await
        .expect_err("refused");
        assert_eq!(failed.reason, "KubeconfigRefused");
        assert!(failed.message.contains("users[u].exec"), "{}", failed.message);
        assert!(attached.is_none() && ctx.tenants.all().is_empty());
        supers.idle().await;
    }

    /// The super namespace of tenant namespace `tenant_namespace`, as the syncer writes it.
    fn super_namespace(tenant_namespace: &str, cluster_key: &str, deleting: bool) -> Namespace {
        let name = crds::naming::super_namespace(cluster_key, tenant_namespace);
        let mut namespace: Namespace = from_json(json!({
            "metadata": {
                "name": name,
                "uid": format!("uid-{name}"),
                "annotations": {
                    crds::wellknown::ANNOTATION_CLUSTER: cluster_key,
                    crds::wellknown::ANNOTATION_NAMESPACE: tenant_namespace,
                },
            }
        }));
        if deleting {
            namespace.metadata.deletion_timestamp =
                Some(Time(Timestamp::from_second(1_800_000_000).expect("time")));
        }
        namespace
    }

    #[tokio::test]
    async fn a_removed_tenants_namespaces_are_deleted_pinned_and_a_failure_does_not_stop_the_rest() {
        let (super_client, mut supers) = testing::mock();
        let (ctx, mut writers) = testing::context(super_client);
        let key = testing::identity().cluster_key;
        for namespace in [
            super_namespace("mine-a", &key, false),
            super_namespace("mine-b", &key, false),
            super_namespace("mine-going", &key, true),
            super_namespace("theirs", "team-ffffff-vc", false),
        ] {
            testing::put(&mut writers.namespaces, namespace);
        }
        let ((), mut deleted) = tokio::join!(clean_up(&ctx, &key), async {
            let mut deleted = Vec::new();
            for _ in 0..2 {
                let call = supers.expect("DELETE", "/api/v1/namespaces/").await;
                let name = call.uri["/api/v1/namespaces/".len()..]
                    .trim_end_matches('?')
                    .to_owned();
                assert_eq!(
                    call.body["preconditions"]["uid"],
                    format!("uid-{name}"),
                    "{}",
                    call.body
                );
                // The first answer refuses; the other namespace is still deleted.
                if deleted.is_empty() {
                    call.fail(403, "Forbidden", "namespaces is forbidden");
                } else {
                    call.ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
                }
                deleted.push(name);
            }
            deleted
        });
        deleted.sort();
        assert_eq!(deleted, [format!("{key}-mine-a"), format!("{key}-mine-b")]);
        // Every delete asked counts as a write to the super cluster, the refused one too.
        assert_eq!(ctx.metrics.super_writes_total(), 2);
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

    #[tokio::test]
    async fn an_attached_tenant_that_turns_into_another_cluster_is_detached() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let vc = provisioned(Some("Running"), Some("True"));
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::of(&vc));
        let identity = testing::identity();
        let mut attached = Some((tenant.clone(), fingerprint(KUBECONFIG)));
        // Same kubeconfig, same address; its etcd was wiped: kube-system is new.
        let (result, ()) = tokio::join!(
            attach_or_check(
                &ctx,
                &vc,
                &identity,
                &mut attached,
                false,
                TenantSettings::of(&vc),
                None,
            ),
            async {
                supers
                    .expect(
                        "GET",
                        "/api/v1/namespaces/team-abc123-vc/secrets/admin-kubeconfig",
                    )
                    .await
                    .respond(
                        200,
                        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "admin-kubeconfig"},
                            "data": {"admin-kubeconfig": base64::engine::general_purpose::STANDARD.encode(KUBECONFIG)}}),
                    );
                tenants.expect("GET", "/version").await.respond(
                    200,
                    &json!({"major": "1", "minor": "25", "gitVersion": "v1.25.9", "gitCommit": "x", "gitTreeState": "clean",
                        "buildDate": "2023-04-12T12:00:00Z", "goVersion": "go1.19", "compiler": "gc", "platform": "linux/amd64"}),
                );
                tenants
                    .expect("GET", "/api/v1/namespaces/kube-system")
                    .await
                    .respond(200, &kube_system("a-new-uid"));
            }
        );
        let failed = result.expect_err("refused");
        assert_eq!(failed.reason, REASON_IDENTITY_CHANGED);
        assert!(attached.is_none());
        assert!(ctx.tenants.get(&identity.cluster_key).is_none(), "detached");
        supers.idle().await;
        tenants.idle().await;
    }

    #[tokio::test]
    async fn a_changed_quota_queues_the_pods_waiting_for_quota_at_once() {
        let (super_client, mut supers) = testing::mock();
        let (tenant_client, mut tenants) = testing::mock();
        let (ctx, _) = testing::context(super_client);
        let mut vc = provisioned(Some("Running"), Some("True"));
        let (tenant, _) = testing::tenant(&ctx, tenant_client, TenantSettings::of(&vc));
        let identity = testing::identity();
        let one = Usage {
            pods: 1,
            ..Default::default()
        };
        let quota = tenant.settings().quota.clone();
        assert!(
            ctx.quota
                .admit(&tenant.id, quota.as_ref(), "ns", "first", one)
                .is_ok()
        );
        assert!(
            ctx.quota
                .admit(&tenant.id, quota.as_ref(), "ns", "second", one)
                .is_err()
        );
        let mut attached = Some((tenant.clone(), fingerprint(KUBECONFIG)));

        // A status change (here: a rollout begins) changes no setting: nothing is queued.
        vc.status.as_mut().expect("status").phase = Some(crds::ClusterPhase::Updating);
        assert!(eligible(&vc, true));
        let (result, ()) = tokio::join!(
            attach_or_check(
                &ctx,
                &vc,
                &identity,
                &mut attached,
                false,
                TenantSettings::of(&vc),
                None,
            ),
            answer_check(&mut supers, &mut tenants)
        );
        assert_eq!(result.expect("checked"), "v1.25.9");
        assert!(testing::drain_down(&ctx).await.is_empty());

        // The quota is raised while the tenant rolls out: the waiting pod is queued at once.
        vc.spec.quota.as_mut().expect("quota").pods = Some(Quantity("2".into()));
        let (result, ()) = tokio::join!(
            attach_or_check(
                &ctx,
                &vc,
                &identity,
                &mut attached,
                false,
                TenantSettings::of(&vc),
                None,
            ),
            answer_check(&mut supers, &mut tenants)
        );
        result.expect("checked");
        assert!(
            Arc::ptr_eq(&attached.as_ref().expect("attached").0, &tenant),
            "not attached again"
        );
        assert_eq!(tenant.settings().quota, vc.spec.quota);
        assert_eq!(
            testing::drain_down(&ctx).await,
            [DownItem::new(Kind::Pod, "ns", "second")]
        );

        // Removing the quota does it too; any other edit does not.
        vc.spec.quota = None;
        assert!(update_settings(&ctx, &tenant, TenantSettings::of(&vc)));
        assert_eq!(testing::drain_down(&ctx).await.len(), 1);
        vc.spec.weight = 7;
        assert!(update_settings(&ctx, &tenant, TenantSettings::of(&vc)));
        assert!(!update_settings(&ctx, &tenant, TenantSettings::of(&vc)));
        assert!(testing::drain_down(&ctx).await.is_empty());
        supers.idle().await;
        tenants.idle().await;
    }

    fn super_pod(name: &str, cluster_key: &str, deleting: bool) -> crate::cache::pods::SuperPod {
        let mut pod: crate::cache::pods::SuperPod = from_json(json!({"metadata": {
            "name": name, "namespace": format!("{cluster_key}-shop"), "uid": format!("uid-{name}"),
            "annotations": {crds::wellknown::ANNOTATION_CLUSTER: cluster_key, crds::wellknown::ANNOTATION_NAMESPACE: "shop"},
        }}));
        if deleting {
            pod.metadata.deletion_timestamp =
                Some(Time(Timestamp::from_second(1_800_000_000).expect("time")));
        }
        pod
    }

    #[tokio::test]
    async fn a_paused_tenants_super_pods_are_removed_pinned_and_nothing_else() {
        let (super_client, mut supers) = testing::mock();
        let (ctx, mut writers) = testing::context(super_client);
        let key = testing::identity().cluster_key;
        for pod in [
            super_pod("web-a", &key, false),
            super_pod("web-b", &key, false),
            super_pod("web-going", &key, true),
            super_pod("theirs", "team-ffffff-vc", false),
        ] {
            testing::put(&mut writers.pods, pod);
        }
        let prefix = format!("/api/v1/namespaces/{key}-shop/pods/");
        let (remaining, mut deleted) = tokio::join!(remove_paused_pods(&ctx, &key), async {
            let mut deleted = Vec::new();
            for _ in 0..2 {
                let call = supers.expect("DELETE", &prefix).await;
                let name = call.uri[prefix.len()..].trim_end_matches('?').to_owned();
                assert_eq!(
                    call.body["preconditions"]["uid"],
                    format!("uid-{name}"),
                    "{}",
                    call.body
                );
                // A refused delete does not stop the others; it counts as still there.
                if deleted.is_empty() {
                    call.fail(403, "Forbidden", "pods is forbidden");
                } else {
                    call.ok(json!({"apiVersion": "v1", "kind": "Status", "status": "Success"}));
                }
                deleted.push(name);
            }
            deleted
        });
        deleted.sort();
        assert_eq!(deleted, ["web-a", "web-b"]);
        // The terminating one is not deleted again but is still there, as are the two just deleted (the
        // cache shows them until their watch events come).
        assert_eq!(remaining, 3);
        supers.idle().await;
    }

    fn with_conditions(mut vc: VirtualCluster, conditions: serde_json::Value) -> VirtualCluster {
        vc.status.as_mut().expect("status").conditions = from_json(conditions);
        vc
    }

    #[test]
    fn a_tenant_is_resuming_until_the_syncer_attached_it_again() {
        let condition = |type_: &str, status: &str, reason: &str| {
            json!({"type": type_, "status": status, "reason": reason, "message": "m",
                "lastTransitionTime": "2026-01-01T00:00:00Z"})
        };
        let paused = crds::wellknown::CONDITION_PAUSED;
        let vc = provisioned(Some("Running"), None);
        assert!(!resuming(&vc), "never paused");
        let reported_paused = with_conditions(
            vc.clone(),
            json!([condition(CONDITION_TENANT_SYNCED, "False", REASON_TENANT_PAUSED)]),
        );
        assert!(resuming(&reported_paused));
        // An attempt failed after the resume: vc-manager's Paused=False still says so.
        let failed_since = with_conditions(
            vc.clone(),
            json!([
                condition(CONDITION_TENANT_SYNCED, "False", "TenantUnreachable"),
                condition(paused, "False", "Resumed"),
            ]),
        );
        assert!(resuming(&failed_since));
        // Attached since: the pods it lost after that are lost.
        let attached = with_conditions(
            vc.clone(),
            json!([
                condition(CONDITION_TENANT_SYNCED, "True", "TenantAttached"),
                condition(paused, "False", "Resumed"),
            ]),
        );
        assert!(!resuming(&attached));
        // A paused provisioned tenant is not attached; resumed, it waits for vc-manager to leave Paused.
        assert!(!eligible(&provisioned(Some("Paused"), Some("True")), true));
    }

    #[test]
    fn missing_copies_are_recreated_after_a_pause_or_on_the_first_attachment_only() {
        let mut pinned = provisioned(Some("Running"), Some("True"));
        pinned.metadata.annotations.get_or_insert_default().insert(
            ANNOTATION_TENANT_IDENTITY.to_owned(),
            "kube-system-uid".to_owned(),
        );
        // Synced before with this identity: a copy missing now was lost.
        assert_eq!(recreates_missing_copies(&pinned), None);
        // Never attached (a restored snapshot, an adopted cluster): its scheduled pods never had a copy here.
        let first = provisioned(Some("Running"), None);
        assert_eq!(recreates_missing_copies(&first), Some("first attachment"));
        // An empty annotation pins nothing.
        let mut emptied = pinned.clone();
        emptied
            .metadata
            .annotations
            .get_or_insert_default()
            .insert(ANNOTATION_TENANT_IDENTITY.to_owned(), String::new());
        assert_eq!(recreates_missing_copies(&emptied), Some("first attachment"));
        let paused = with_conditions(
            pinned,
            json!([{"type": CONDITION_TENANT_SYNCED, "status": "False", "reason": REASON_TENANT_PAUSED,
                "message": "m", "lastTransitionTime": "2026-01-01T00:00:00Z"}]),
        );
        assert_eq!(recreates_missing_copies(&paused), Some("resumed after a pause"));
    }

    #[test]
    fn only_pods_older_than_the_resume_and_not_recreated_yet_were_paused_away() {
        let resumed =
            crate::tenancy::tenant::Resumed::at(Timestamp::from_second(1_800_000_000).expect("time"));
        let pod = |uid: &str, created: i64| crate::cache::meta::PackedMeta {
            uid: Some(uid.into()),
            creation_timestamp: Some(Time(Timestamp::from_second(created).expect("time"))),
            ..Default::default()
        };
        let old = pod("old", 1_700_000_000);
        assert!(resumed.removed(&old));
        // Created during the pause or after: never had a copy the pause removed.
        assert!(!resumed.removed(&pod("new", 1_800_000_001)));
        // Recreated once: a copy lost after that is lost.
        resumed.restored(&old);
        assert!(!resumed.removed(&old));
        assert!(resumed.removed(&pod("other-old", 1_700_000_000)));
    }
}
