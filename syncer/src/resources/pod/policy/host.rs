//! Host access (network, PID, IPC, privileged containers, hostPath) and the volumes a pod may mount.

use crds::PodPolicy;
use k8s_openapi::api::core::v1::{PodSpec, Volume};

use super::input::{PolicyInput, containers};
use crate::resources::claim;

pub(super) fn host_access(spec: &PodSpec, policy: &PodPolicy, found: &mut Vec<String>) {
    if spec.host_network == Some(true) && !policy.host_network {
        found.push("hostNetwork".to_owned());
    }
    if spec.host_pid == Some(true) && !policy.host_pid {
        found.push("hostPID".to_owned());
    }
    if spec.host_ipc == Some(true) && !policy.host_ipc {
        found.push("hostIPC".to_owned());
    }
    if !policy.privileged {
        for c in containers(spec) {
            if c.security.and_then(|s| s.privileged) == Some(true) {
                found.push(format!("privileged {} {:?}", c.kind, c.name));
            }
        }
    }
    if !policy.host_path {
        for volume in spec.volumes.iter().flatten().filter(|v| v.host_path.is_some()) {
            found.push(format!("hostPath volume {:?}", volume.name));
        }
    }
}

/// The volume source types of a volume: the fields it sets besides its name (`configMap`, `nfs`, ...).
/// Read from its JSON, so that every type counts, those a newer Kubernetes adds included.
fn volume_types(volume: &Volume) -> Vec<String> {
    match serde_json::to_value(volume) {
        Ok(serde_json::Value::Object(fields)) => fields
            .into_iter()
            .filter(|(field, value)| field != "name" && !value.is_null())
            .map(|(field, _)| field)
            .collect(),
        _ => Vec::new(),
    }
}

/// Sources a projected volume may combine: the pod's own objects and its token. A `clusterTrustBundle`
/// (the super cluster's trust bundles, cluster-scoped) and whatever a newer Kubernetes adds are not.
const PROJECTED_SOURCES: &[&str] = &["configMap", "secret", "downwardAPI", "serviceAccountToken"];


/// Volume types on the platform's allow-list (`hostPath` is judged with host access, `csi` by driver),
/// projected sources, and generic ephemeral volumes held to the rules of claims.
pub(super) fn volumes(spec: &PodSpec, input: &PolicyInput<'_>, found: &mut Vec<String>) {
    let platform = input.platform;
    for volume in spec.volumes.iter().flatten() {
        let name = &volume.name;
        for type_ in volume_types(volume) {
            match type_.as_str() {
                "hostPath" => {}
                "csi" => {
                    let driver = volume.csi.as_ref().map_or("", |c| c.driver.as_str());
                    if !platform.allowed_csi_drivers.iter().any(|d| d == driver) {
                        found.push(format!(
                            "csi volume {name:?} of driver {driver:?} (the syncer's --pod-allowed-csi-drivers)"
                        ));
                    }
                }
                other if !platform.allowed_volume_types.iter().any(|t| t == other) => {
                    found.push(format!(
                        "{other} volume {name:?} (the syncer's --pod-allowed-volume-types)"
                    ));
                }
                "projected" => {
                    let sources = volume.projected.iter().flat_map(|p| p.sources.iter().flatten());
                    for source in sources {
                        let types = serde_json::to_value(source).ok();
                        let fields = types.iter().filter_map(|v| v.as_object()).flat_map(|o| o.keys());
                        for field in fields.filter(|f| !PROJECTED_SOURCES.contains(&f.as_str())) {
                            found.push(format!(
                                "{field} source of projected volume {name:?} (a projected volume may hold {})",
                                PROJECTED_SOURCES.join(", ")
                            ));
                        }
                    }
                }
                "ephemeral" => ephemeral_claim(volume, input, found),
                _ => {}
            }
        }
    }
}

/// A generic ephemeral volume's claim template, held to the rules of claims: its claim is the tenant's
/// own (made by the tenant's controller-manager and synced like any claim, counted against the quota), and
/// the super pod mounts that claim.
fn ephemeral_claim(volume: &Volume, input: &PolicyInput<'_>, found: &mut Vec<String>) {
    let name = &volume.name;
    let Some(template) = volume.ephemeral.as_ref().and_then(|e| e.volume_claim_template.as_ref()) else {
        found.push(format!("ephemeral volume {name:?} without a volumeClaimTemplate"));
        return;
    };
    let spec = &template.spec;
    if let Some(why) = claim::class_refusal(
        spec.storage_class_name.as_deref(),
        input.published_storage_class,
        input.published_default_storage_class,
    ) {
        found.push(format!("ephemeral volume {name:?}: {why}"));
    }
    for why in claim::binding_refusals(spec) {
        found.push(format!("ephemeral volume {name:?}: {why}"));
    }
}
