//! VirtualClusters and apiserver answers the attach tests share.

use base64::Engine;
use crds::{VirtualCluster, wellknown::CONDITION_TENANT_SYNCED};
use serde_json::json;

use crate::engine::context::testing::{self, from_json};

pub(super) fn provisioned(phase: Option<&str>, synced: Option<&str>) -> VirtualCluster {
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

pub(super) const KUBECONFIG: &str = "apiVersion: v1\nkind: Config\n";

pub(super) fn kube_system(uid: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kube-system", "uid": uid}})
}

/// Answers the read of a tenant's kubeconfig Secret (super).
pub(super) async fn answer_kubeconfig(supers: &mut testing::ApiServer) {
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
}

/// Answers the reads of one `attach_or_check` of an attached tenant: its kubeconfig Secret (super),
/// then `/version` and a namespace list (tenant).
pub(super) async fn answer_check(supers: &mut testing::ApiServer, tenants: &mut testing::ApiServer) {
    answer_check_with(supers, tenants, "kube-system-uid").await;
}

/// [`answer_check`], with the tenant's `kube-system` of uid `kube_system_uid`.
pub(super) async fn answer_check_with(
    supers: &mut testing::ApiServer,
    tenants: &mut testing::ApiServer,
    kube_system_uid: &str,
) {
    answer_kubeconfig(supers).await;
    tenants.expect("GET", "/version").await.respond(
        200,
        &json!({"major": "1", "minor": "25", "gitVersion": "v1.25.9", "gitCommit": "x", "gitTreeState": "clean",
            "buildDate": "2023-04-12T12:00:00Z", "goVersion": "go1.19", "compiler": "gc", "platform": "linux/amd64"}),
    );
    tenants
        .expect("GET", "/api/v1/namespaces/kube-system")
        .await
        .respond(200, &kube_system(kube_system_uid));
}

pub(super) fn with_conditions(mut vc: VirtualCluster, conditions: serde_json::Value) -> VirtualCluster {
    vc.status.as_mut().expect("status").conditions = from_json(conditions);
    vc
}
