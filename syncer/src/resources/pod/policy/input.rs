//! What the rules read: the settings they consult besides the pod, and every container of a pod (init
//! and ephemeral ones included) seen alike.

use crds::PodPolicy;
use k8s_openapi::api::core::v1::{PodSpec, SecurityContext};

use crate::resources::pod::flags::PlatformPodPolicy;

/// What the policy consults besides the pod.
pub struct PolicyInput<'a> {
    /// The VirtualCluster's `podPolicy`.
    pub tenant: &'a PodPolicy,
    /// The platform's flags.
    pub platform: &'a PlatformPodPolicy,
    /// The RuntimeClass the VirtualCluster forces, if any.
    pub forced_runtime_class: Option<&'a str>,
    /// Whether a PriorityClass is published (a super PriorityClass labelled
    /// `tenancy.x-k8s.io/super.public=true`).
    pub published_priority_class: &'a dyn Fn(&str) -> bool,
    /// Whether the pod's node selection is resolved against the tenant's vNodes
    /// ([`crate::resources::pod::placement`]): then it can only reach nodes the tenant sees, whatever labels
    /// it names, and they are not judged.
    pub node_selection_resolved: bool,
    /// Whether a StorageClass is published (for generic ephemeral volumes, held to the rules of claims).
    pub published_storage_class: &'a dyn Fn(&str) -> bool,
    /// The published StorageClass marked default, when exactly one is.
    pub published_default_storage_class: Option<&'a str>,
}

/// A container of any kind, with what the policy looks at.
pub(super) struct ContainerView<'a> {
    pub(super) kind: &'static str,
    pub(super) name: &'a str,
    pub(super) security: Option<&'a SecurityContext>,
    pub(super) host_ports: Vec<i32>,
}

pub(super) fn containers(spec: &PodSpec) -> Vec<ContainerView<'_>> {
    let host_ports = |ports: Option<&Vec<k8s_openapi::api::core::v1::ContainerPort>>| -> Vec<i32> {
        ports
            .into_iter()
            .flatten()
            .filter_map(|p| p.host_port.filter(|h| *h != 0))
            .collect()
    };
    let mut all: Vec<ContainerView<'_>> = spec
        .containers
        .iter()
        .map(|c| ContainerView {
            kind: "container",
            name: &c.name,
            security: c.security_context.as_ref(),
            host_ports: host_ports(c.ports.as_ref()),
        })
        .collect();
    all.extend(spec.init_containers.iter().flatten().map(|c| ContainerView {
        kind: "init container",
        name: &c.name,
        security: c.security_context.as_ref(),
        host_ports: host_ports(c.ports.as_ref()),
    }));
    all.extend(spec.ephemeral_containers.iter().flatten().map(|c| ContainerView {
        kind: "ephemeral container",
        name: &c.name,
        security: c.security_context.as_ref(),
        host_ports: host_ports(c.ports.as_ref()),
    }));
    all
}
