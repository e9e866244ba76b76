//! Whether a VirtualCluster is attached, and what its status and annotations say about the tenant's past:
//! synced before, paused and resumed, the identity it was first synced with. Pure: read from the
//! VirtualCluster alone.

use crds::{
    VirtualCluster,
    wellknown::{ANNOTATION_TENANT_IDENTITY, CONDITION_TENANT_SYNCED},
};
use kube::{Resource, ResourceExt};

use crate::tenancy::identity::TenantIdentity;

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
pub(super) fn recreates_missing_copies(vc: &VirtualCluster) -> Option<&'static str> {
    if resuming(vc) {
        Some("resumed after a pause")
    } else if pinned_identity(vc).is_none() {
        Some("first attachment")
    } else {
        None
    }
}

/// Whether the syncer last reported the tenant as synced (`TenantSynced=True`).
fn synced_before(vc: &VirtualCluster) -> bool {
    vc.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == CONDITION_TENANT_SYNCED && c.status == "True")
    })
}

/// The tenant identity the VirtualCluster was first synced with (the uid of the tenant's `kube-system`).
pub(super) fn pinned_identity(vc: &VirtualCluster) -> Option<&str> {
    vc.annotations()
        .get(ANNOTATION_TENANT_IDENTITY)
        .map(String::as_str)
        .filter(|uid| !uid.is_empty())
}

#[cfg(test)]
mod tests {
    use k8s_openapi::{apimachinery::pkg::apis::meta::v1::Time, jiff::Timestamp};
    use serde_json::json;

    use super::*;
    use crate::{
        engine::context::testing::from_json,
        tenancy::attach::fixtures::{provisioned, with_conditions},
    };

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
}
