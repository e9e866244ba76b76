//! What of a running pod flows down after its creation: images and deadlines, resized resources, and
//! tolerations (which can only grow).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Toleration;

use crate::cache::pods::{CachedPodSpec, ContainerImage};

/// The fields of a pod that may change after creation and flow down on update.
pub fn mutable_view(spec: &CachedPodSpec) -> serde_json::Value {
    let images = |containers: &[ContainerImage]| -> BTreeMap<String, Option<String>> {
        containers
            .iter()
            .map(|c| (c.name.clone(), c.image.clone()))
            .collect()
    };
    serde_json::json!({
        "images": images(&spec.containers),
        "initImages": images(&spec.init_containers),
        "activeDeadlineSeconds": spec.active_deadline_seconds,
    })
}

/// The strategic-merge patch of a super pod's `resize` subresource that gives its containers the tenant
/// pod's requests and limits, or `None` when the super pod has them. Only the keys the tenant states count:
/// the super cluster's admission (a LimitRange) may have added defaults of its own, and a resize cannot
/// remove a key anyway. Containers the super pod lacks are left out: a pod's containers never change.
pub fn resize_patch(tenant: &CachedPodSpec, super_spec: &CachedPodSpec) -> Option<serde_json::Value> {
    let changes = |tenant: &[ContainerImage], super_containers: &[ContainerImage]| -> Vec<serde_json::Value> {
        tenant
            .iter()
            .filter_map(|wanted| {
                let have = super_containers.iter().find(|c| c.name == wanted.name)?;
                let (want, have) = (&wanted.resources, &have.resources);
                if want.requests.covered_by(&have.requests) && want.limits.covered_by(&have.limits) {
                    return None;
                }
                Some(serde_json::json!({
                    "name": wanted.name,
                    "resources": {"requests": want.requests.to_json(), "limits": want.limits.to_json()},
                }))
            })
            .collect()
    };
    let containers = changes(&tenant.containers, &super_spec.containers);
    let init_containers = changes(&tenant.init_containers, &super_spec.init_containers);
    if containers.is_empty() && init_containers.is_empty() {
        return None;
    }
    let mut spec = serde_json::Map::new();
    if !containers.is_empty() {
        spec.insert("containers".into(), containers.into());
    }
    if !init_containers.is_empty() {
        spec.insert("initContainers".into(), init_containers.into());
    }
    Some(serde_json::json!({ "spec": spec }))
}

/// The names of the containers a resize patch changes, for messages.
pub fn resized_containers(patch: &serde_json::Value) -> Vec<String> {
    ["containers", "initContainers"]
        .into_iter()
        .flat_map(|list| {
            patch["spec"][list]
                .as_array()
                .into_iter()
                .flatten()
                .map(move |c| format!("spec.{list}[{}].resources", c["name"].as_str().unwrap_or_default()))
        })
        .collect()
}

/// The tenant's tolerations the super pod lacks (the super cluster's admission may have added more of its
/// own; a running pod's tolerations can only grow).
pub fn missing_tolerations<'t>(tenant: &'t CachedPodSpec, super_spec: &CachedPodSpec) -> Vec<&'t Toleration> {
    tenant
        .tolerations
        .iter()
        .filter(|t| !super_spec.tolerations.contains(t))
        .collect()
}
