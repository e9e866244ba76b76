//! Ephemeral containers a tenant adds to its running pod, converted one by one and compared by name and
//! image.

use crds::PodPolicy;
use k8s_openapi::api::core::v1::{EphemeralContainer, Pod};

use super::{Hardening, dns::{literal_downward_env, set_apiserver_env}};
use crate::{
    cache::pods::{CachedPodSpec, ContainerImage},
    engine::config::PlatformPodPolicy,
    resources::pod::policy,
    tokens::mounts,
};

/// Everything an ephemeral container's conversion depends on.
pub struct EphemeralConversion<'a> {
    /// The VirtualCluster's `podPolicy`.
    pub pod_policy: &'a PodPolicy,
    /// What the platform allows every tenant.
    pub platform_policy: &'a PlatformPodPolicy,
    /// Super cluster IP and port of the tenant's `default/kubernetes` Service.
    pub apiserver: Option<(&'a str, i32)>,
    /// How containers are hardened on shared nodes.
    pub hardening: Hardening,
}

/// The ephemeral container a tenant added to its running pod, as the super pod gets it: translated as the
/// pod's own containers were when it was created (the tenant's apiserver in the `KUBERNETES_*` variables,
/// downward-API namespace and uid as the tenant's values; volumes, ConfigMaps and Secrets keep their names
/// in the super namespace, and a mounted token volume is already the tenant's), or what the pod policy
/// refuses in it.
pub fn ephemeral_to_super(
    tenant: &Pod,
    container: &EphemeralContainer,
    cx: &EphemeralConversion<'_>,
) -> Result<EphemeralContainer, Vec<String>> {
    let spec = tenant.spec.clone().unwrap_or_default();
    let input = policy::PolicyInput {
        tenant: cx.pod_policy,
        platform: cx.platform_policy,
        // Placement, priority and runtime class are the pod's, fixed at creation.
        forced_runtime_class: None,
        published_priority_class: &|_| false,
        node_selection_resolved: false,
        published_storage_class: &|_| false,
        published_default_storage_class: None,
    };
    let mut violations = policy::ephemeral_container_violations(
        container,
        &spec,
        tenant.metadata.annotations.as_ref(),
        &input,
    );
    violations.extend(mounts::reserved_env_references(
        container.env.as_deref(),
        container.env_from.as_deref(),
    ));
    if !violations.is_empty() {
        return Err(violations);
    }
    let mut converted = container.clone();
    cx.hardening
        .apply(&mut converted.image_pull_policy, &mut converted.security_context);
    if let Some((ip, port)) = cx.apiserver {
        set_apiserver_env(&mut converted.env, ip, port);
    }
    literal_downward_env(
        &mut converted.env,
        tenant.metadata.namespace.as_deref().unwrap_or_default(),
        tenant.metadata.uid.as_deref().unwrap_or_default(),
    );
    Ok(converted)
}

/// How a tenant pod's ephemeral containers stand against its super pod's.
#[derive(Debug, Default, PartialEq)]
pub struct EphemeralChanges<'t> {
    /// The tenant's the super pod lacks: to be added.
    pub missing: Vec<&'t ContainerImage>,
    /// The tenant's that the super pod has under the same name with another image: ephemeral containers
    /// can never change, so these stay as the super pod has them.
    pub changed: Vec<&'t ContainerImage>,
}

impl EphemeralChanges<'_> {
    /// Whether the super pod has every ephemeral container of the tenant's, as the tenant has it.
    pub fn is_empty(&self) -> bool {
        self.missing.is_empty() && self.changed.is_empty()
    }
}

/// Compares ephemeral containers by name and image. Those only the super pod has are left alone: they
/// cannot be removed, and one the platform added to debug the super pod is not the tenant's.
pub fn ephemeral_changes<'t>(tenant: &'t CachedPodSpec, super_spec: &CachedPodSpec) -> EphemeralChanges<'t> {
    let mut changes = EphemeralChanges::default();
    for wanted in &tenant.ephemeral_containers {
        match super_spec
            .ephemeral_containers
            .iter()
            .find(|have| have.name == wanted.name)
        {
            None => changes.missing.push(wanted),
            Some(have) if have.image != wanted.image => changes.changed.push(wanted),
            Some(_) => {}
        }
    }
    changes
}
