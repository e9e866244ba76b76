//! Ephemeral containers (`kubectl debug`) a tenant adds to its running pod reach the super pod through the
//! super pod's `ephemeralcontainers` subresource: translated as the pod's own containers were at creation
//! and held to the same pod policy. They can only ever be added. One the policy refuses, one the super
//! cluster refuses, and one the super pod already has under the same name with another image are each told
//! once in an event naming the container; [`ANNOTATION_REFUSED`] on the super pod records what was told, so
//! a refused container is not tried again until it or the pod policy changes.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::{
    Api,
    api::{GetParams, Patch},
};

use super::{
    convert::{self, EphemeralConversion},
    refusal::{REASON_POLICY_VIOLATION, is_refusal},
    tenant_endpoints::tenant_apiserver,
};
use crate::{
    cache::{meta::Tagged, pods::{ContainerImage, SuperPod, TenantPod}},
    engine::{context::Context, events},
    error::{Result, on_super, on_tenant},
    tenancy::{identity, tenant::Tenant},
};

/// Annotation on a super pod: comma-separated keys of the ephemeral containers whose refusal the tenant
/// was told (each a hash of the container's name and image and of the pod policy).
pub const ANNOTATION_REFUSED: &str = "tenancy.x-k8s.io/refused-ephemeral-containers";

/// Reason of the event on a tenant pod whose ephemeral container the super cluster refused, or which the
/// super pod already has in another form.
pub const REASON_EPHEMERAL_REFUSED: &str = "EphemeralContainerRefused";

/// What syncing a pod's ephemeral containers did.
#[derive(Debug, Default)]
pub struct EphemeralSync {
    /// Writes to the super cluster.
    pub writes: u32,
    /// Whether a container was added (the super pod is then read afresh before it is applied).
    pub added: bool,
    /// The value [`ANNOTATION_REFUSED`] should have (`None`: nothing refused).
    pub refused: Option<String>,
    /// Why containers wait to be added, when they do.
    pub waiting: Option<String>,
}

/// The key under which a refusal is recorded: a container keeps its name and image for good, so a new key
/// means a new container or a changed pod policy, which are judged again.
fn refusal_key(container: &ContainerImage, policy: &str) -> String {
    identity::sync_hash(&(&container.name, &container.image, policy))
}

/// Adds the tenant's new ephemeral containers to the super pod and tells what cannot be added.
pub async fn sync(
    ctx: &Context,
    tenant: &Tenant,
    tenant_pod: &TenantPod,
    super_pod: &SuperPod,
    api: &Api<Pod>,
) -> Result<EphemeralSync> {
    let changes = convert::ephemeral_changes(&tenant_pod.spec, &super_pod.spec);
    let mut outcome = EphemeralSync::default();
    if changes.is_empty() {
        return Ok(outcome);
    }
    let settings = tenant.settings();
    // The platform's policy is flags, not data: its rendering stands for it (a changed rendering only
    // means one more look at a refused container).
    let policy = identity::sync_hash(&(
        &settings.pod_policy,
        format!("{:?}", ctx.config.pod_policy),
    ));
    let told: BTreeSet<&str> = super_pod.meta().annotation(ANNOTATION_REFUSED)
        .map(|value| value.split(',').collect())
        .unwrap_or_default();
    let reference = tenant_pod.object_ref(&());
    let name = super_pod.name_any();
    let mut refused = BTreeSet::new();
    // One event per reason and sync: the event recorder counts repeats of a reason on an object as a
    // series of the first note, so a second event would lose its container's name.
    let (mut told_refused, mut told_violations) = (Vec::new(), Vec::new());

    for container in &changes.changed {
        let key = refusal_key(container, &policy);
        if !told.contains(key.as_str()) {
            let have = super_pod
                .spec
                .ephemeral_containers
                .iter()
                .find(|c| c.name == container.name)
                .and_then(|c| c.image.clone())
                .unwrap_or_default();
            let message = format!(
                "the super pod already has an ephemeral container {:?} with image {have:?}, not {:?}: ephemeral containers can only be added, never changed or removed; it keeps running as it is",
                container.name,
                container.image.as_deref().unwrap_or_default()
            );
            // The event, one for all of them, follows once every container is looked at.
            events::refuse(&ctx.metrics, tenant, None, "pod", REASON_EPHEMERAL_REFUSED, &message).await;
            told_refused.push(message);
        }
        refused.insert(key);
    }

    let mut untried = Vec::new();
    for container in &changes.missing {
        let key = refusal_key(container, &policy);
        match told.contains(key.as_str()) {
            true => {
                refused.insert(key);
            }
            false => untried.push((*container, key)),
        }
    }
    if !untried.is_empty() {
        let apiserver = match tenant_apiserver(ctx, tenant) {
            Ok(apiserver) => apiserver,
            // Without the tenant's apiserver in its variables a debug container would be handed the super
            // cluster's by the kubelet.
            Err(reason) => {
                outcome.waiting = Some(reason);
                tell(tenant, &reference, told_refused, told_violations).await;
                outcome.refused = joined(refused);
                return Ok(outcome);
            }
        };
        let Some(full) = read_tenant_pod(tenant, tenant_pod).await? else {
            tell(tenant, &reference, told_refused, told_violations).await;
            outcome.refused = joined(refused);
            return Ok(outcome);
        };
        let cx = EphemeralConversion {
            pod_policy: &settings.pod_policy,
            platform_policy: &ctx.config.pod_policy,
            apiserver: apiserver.as_ref().map(|(ip, port)| (ip.as_str(), *port)),
            hardening: super::convert::Hardening::of(&ctx.config),
        };
        let written = full
            .spec
            .as_ref()
            .and_then(|s| s.ephemeral_containers.clone())
            .unwrap_or_default();
        for (container, key) in untried {
            // The cache may be ahead of the read: the container is looked at again with the next change.
            let Some(wanted) = written.iter().find(|c| c.name == container.name) else {
                continue;
            };
            let converted = match convert::ephemeral_to_super(&full, wanted, &cx) {
                Ok(converted) => converted,
                Err(violations) => {
                    let message = format!(
                        "the pod policy does not allow {}; ephemeral container {:?} is not added to the running pod",
                        violations.join("; "),
                        container.name
                    );
                    // The event, one for all of them, follows once every container is looked at.
                    events::refuse(&ctx.metrics, tenant, None, "pod", REASON_POLICY_VIOLATION, &message).await;
                    told_violations.push(message);
                    refused.insert(key);
                    continue;
                }
            };
            // The uid pins the patch to the super pod looked at: never a pod recreated under the name.
            let patch = serde_json::json!({
                "metadata": {"uid": super_pod.uid()},
                "spec": {"ephemeralContainers": [converted]},
            });
            ctx.metrics.resources.super_write("pod", "ephemeralcontainers");
            let result = api
                .patch_subresource(
                    "ephemeralcontainers",
                    &name,
                    &crate::resources::write::apply_params(),
                    &Patch::Strategic(&patch),
                )
                .await
                .map_err(on_super(format!(
                    "adding ephemeral container {} to pod {}/{name}",
                    container.name,
                    super_pod.namespace().unwrap_or_default()
                )));
            match result {
                Ok(_) => {
                    outcome.writes += 1;
                    outcome.added = true;
                }
                Err(error) if is_refusal(&error) => {
                    let message = format!(
                        "the super cluster refused to add ephemeral container {:?} to the running pod: {}",
                        container.name,
                        error.status_message().unwrap_or_default()
                    );
                    // The event, one for all of them, follows once every container is looked at.
                    events::refuse(&ctx.metrics, tenant, None, "pod", REASON_EPHEMERAL_REFUSED, &message).await;
                    told_refused.push(message);
                    refused.insert(key);
                }
                Err(error) => {
                    tell(tenant, &reference, told_refused, told_violations).await;
                    return Err(error);
                }
            }
        }
    }
    tell(tenant, &reference, told_refused, told_violations).await;
    outcome.refused = joined(refused);
    Ok(outcome)
}

/// Tells the tenant what was refused: one event per reason, naming every container.
async fn tell(tenant: &Tenant, reference: &ObjectReference, refused: Vec<String>, violations: Vec<String>) {
    for (reason, messages) in [
        (REASON_EPHEMERAL_REFUSED, refused),
        (REASON_POLICY_VIOLATION, violations),
    ] {
        if !messages.is_empty() {
            events::warn(tenant, reference, reason, &messages.join("; ")).await;
        }
    }
}

fn joined(keys: BTreeSet<String>) -> Option<String> {
    (!keys.is_empty()).then(|| keys.into_iter().collect::<Vec<_>>().join(","))
}

/// The whole tenant pod (the cache keeps names and images of its containers only), at least as new as the
/// cached one; `None` when it is gone.
async fn read_tenant_pod(tenant: &Tenant, cached: &TenantPod) -> Result<Option<Pod>> {
    let namespace = cached.namespace().unwrap_or_default();
    let name = cached.name_any();
    let api: Api<Pod> = Api::namespaced(tenant.client.clone(), &namespace);
    let at = GetParams::at(cached.meta().resource_version.as_deref().unwrap_or("0"));
    match api.get_with(&name, &at).await {
        Ok(pod) => Ok(Some(pod)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(on_tenant(
            &tenant.identity.cluster_key,
            format!("reading pod {namespace}/{name}"),
        )(e)),
    }
}
