//! What a tenant pod may ask of the super cluster: host access, volumes, placement, priority, scheduler,
//! runtime class and the security profiles of its containers (init and ephemeral ones included).
//!
//! Two layers decide. The platform's flags ([`crate::resources::pod::flags::PlatformPodPolicy`]) hold for every
//! tenant; a VirtualCluster's `podPolicy` widens host access and security profiles for its tenant, and
//! placement (tolerations, node labels) only by keys the platform lets VirtualClusters grant. Whatever
//! podPolicy allows, the Pod Security level of the super namespaces (see
//! [`crate::resources::pod::flags::PodSecurityLabels`]) still applies in the super apiserver: a VirtualCluster
//! editor cannot lift the platform's backstop.
//!
//! Everything is checked before anything is written; a pod asking for more is not synced, and every
//! violation is named in one event on the tenant pod.
//!
//! The rules are apart by what they judge: host access and volumes (`host`), security profiles and
//! capabilities (`profiles`), and the nodes a pod may reach (`nodes`: tolerations, node selector,
//! node affinity), all over what they read (`input`).

mod host;
mod input;
mod nodes;
mod profiles;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EphemeralContainer, PodSpec};

use self::{
    host::{host_access, volumes},
    input::containers,
    nodes::placement,
    profiles::{APPARMOR_ANNOTATION_PREFIX, SECCOMP_CONTAINER_ANNOTATION_PREFIX, security_profiles},
};
pub use self::{
    input::PolicyInput,
    nodes::{may_tolerate, refused_tolerations},
};

/// Everything a pod asks for that the policy does not allow, each naming the field and the setting that
/// would allow it; empty when the pod may be synced.
pub fn violations(
    spec: &PodSpec,
    annotations: Option<&BTreeMap<String, String>>,
    input: &PolicyInput<'_>,
) -> Vec<String> {
    let mut found = Vec::new();
    host_access(spec, input.tenant, &mut found);
    let containers = containers(spec);
    // With the host's network a container's ports are the host's anyway (the apiserver fills hostPort in).
    let host_network_allowed = spec.host_network == Some(true) && input.tenant.host_network;
    if !input.tenant.host_ports && !host_network_allowed {
        for c in &containers {
            for port in &c.host_ports {
                found.push(format!(
                    "hostPort {port} of {} {:?} (podPolicy.hostPorts)",
                    c.kind, c.name
                ));
            }
        }
    }
    volumes(spec, input, &mut found);
    security_profiles(spec, &containers, annotations, input, &mut found);
    if let Some(class) = spec.priority_class_name.as_deref().filter(|c| !c.is_empty())
        && !(input.published_priority_class)(class)
    {
        found.push(format!(
            "priorityClassName {class:?} (only PriorityClasses the platform publishes with label {}=true)",
            crds::wellknown::LABEL_SUPER_PUBLIC
        ));
    }
    if let Some(scheduler) = spec.scheduler_name.as_deref().filter(|s| !s.is_empty())
        && !input.platform.allowed_schedulers.iter().any(|s| s == scheduler)
    {
        found.push(format!(
            "schedulerName {scheduler:?} (the syncer's --pod-allowed-schedulers)"
        ));
    }
    if let (Some(forced), Some(asked)) = (
        input.forced_runtime_class,
        spec.runtime_class_name.as_deref().filter(|r| !r.is_empty()),
    ) && forced != asked
    {
        found.push(format!(
            "runtimeClassName {asked:?} (the VirtualCluster runs every pod with {forced:?})"
        ));
    }
    placement(spec, input, &mut found);
    found
}

/// Everything an ephemeral container a tenant adds to its running pod asks for that the policy does not
/// allow, as [`violations`] names it for a pod's own containers; plus references the tenant apiserver
/// should have refused (a volume the pod does not have, a target that is not one of its containers), since
/// whatever the tenant writes is checked here again. Only this container and the annotations about it are
/// looked at: the rest of the pod was judged when it was created.
pub fn ephemeral_container_violations(
    container: &EphemeralContainer,
    pod: &PodSpec,
    annotations: Option<&BTreeMap<String, String>>,
    input: &PolicyInput<'_>,
) -> Vec<String> {
    let alone = PodSpec {
        ephemeral_containers: Some(vec![container.clone()]),
        ..Default::default()
    };
    let own_keys: BTreeMap<String, String> = annotations
        .into_iter()
        .flatten()
        .filter(|(key, _)| {
            [APPARMOR_ANNOTATION_PREFIX, SECCOMP_CONTAINER_ANNOTATION_PREFIX]
                .iter()
                .any(|prefix| key.strip_prefix(prefix) == Some(container.name.as_str()))
        })
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect();
    let mut found = violations(&alone, Some(&own_keys), input);
    let volumes: Vec<&str> = pod.volumes.iter().flatten().map(|v| v.name.as_str()).collect();
    let mounted = container
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| m.name.as_str())
        .chain(container.volume_devices.iter().flatten().map(|d| d.name.as_str()));
    for volume in mounted.filter(|v| !volumes.contains(v)) {
        found.push(format!(
            "volume {volume:?} of ephemeral container {:?}, which the pod does not have",
            container.name
        ));
    }
    if let Some(target) = container.target_container_name.as_deref()
        && !pod.containers.iter().any(|c| c.name == target)
    {
        found.push(format!(
            "targetContainerName {target:?} of ephemeral container {:?}, which is not a container of the pod",
            container.name
        ));
    }
    found
}
