//! Changes a plain cluster accepts on a running pod reach its super pod (issue 16, "Workload details"):
//! against real etcd and kube-apiserver processes (v1.33, where in-place resize is on) with simulated
//! nodes and the syncer in process.
//!
//! - `a_running_pods_changes_reach_its_super_pod`: a new image, a deadline and a label, an added
//!   toleration the pod policy allows (the one it does not is refused with `PodPolicyViolation` naming it
//!   and kept out), a label removed after creation (gone from the copy, which was created by POST), and a
//!   resize through the tenant's `resize` subresource, which reaches the super pod through the super
//!   pod's (on v1.33; v1.25 serves no `resize`, and that part is not run).

use crate::object_support::{create, until};
use std::{collections::BTreeMap, sync::Arc, time::Duration};

use crds::{VirtualClusterSpec, wellknown};
use k8s_openapi::{
    api::{
        core::v1::{Namespace, Pod, ServiceAccount},
        events::v1::Event,
    },
    apimachinery::pkg::api::resource::Quantity,
};
use kube::{
    Api, ResourceExt,
    api::{Patch, PatchParams},
};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions},
    wait,
};
use serde_json::json;
use syncer::{Metrics, Syncer, SyncerConfig};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];
const PATIENCE: Duration = Duration::from_secs(60);

async fn tenancy() -> anyhow::Result<(Tenancy, Syncer)> {
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let mut tenancy = Tenancy::start(TenancyOptions {
        tenants: 0,
        nodes: 1,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let spec: VirtualClusterSpec = serde_json::from_value(json!({"kubeconfigSecretRef": {"name": "x"}}))?;
    tenancy.add_tenant("team", spec).await?;
    let config = SyncerConfig {
        patrol_interval: Duration::from_secs(5),
        vnode_grace: Duration::from_secs(3),
        tenant_health_period: Duration::from_secs(2),
        downward_workers: 2,
        upward_workers: 2,
        ..SyncerConfig::for_tests()
    };
    let syncer = Syncer::start(
        tenancy.super_client(),
        config,
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?;
    let vcs: Api<crds::VirtualCluster> =
        Api::namespaced(tenancy.super_client(), local_cluster::tenancy::VC_NAMESPACE);
    until(&vcs, "team", "team TenantSynced=True", |vc| {
        vc.and_then(|vc| vc.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == wellknown::CONDITION_TENANT_SYNCED && c.status == "True")
        })
    })
    .await?;
    Ok((tenancy, syncer))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_running_pods_changes_reach_its_super_pod() -> anyhow::Result<()> {
    if !local_cluster::require("a_running_pods_changes_reach_its_super_pod", NEEDS) {
        return Ok(());
    }
    let (tenancy, _syncer) = tenancy().await?;
    let tenant = tenancy.tenant("team");
    let client = tenant.client();
    create::<Namespace>(&client, None, json!({"metadata": {"name": "apps"}})).await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "apps");
    until(&accounts, "default", "default ServiceAccount", |sa| sa.is_some()).await?;
    create::<Pod>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "web", "labels": {"stage": "canary"}}, "spec": {"containers": [{"name": "main", "image": "busybox:1.36",
            "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"cpu": "200m", "memory": "64Mi"}}}]}}),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "apps");
    until(&pods, "web", "tenant pod web Running", |p| {
        p.and_then(|p| p.status.as_ref()?.phase.as_deref()) == Some("Running")
    })
    .await?;
    let super_pods: Api<Pod> = Api::namespaced(tenancy.super_client(), &tenant.super_namespace("apps"));
    until(&super_pods, "web", "super pod web", |p| p.is_some()).await?;

    // What a plain cluster accepts on a running pod: image, deadline, labels, added tolerations.
    pods.patch(
        "web",
        &PatchParams::default(),
        &Patch::Strategic(json!({
            "metadata": {"labels": {"tier": "front"}},
            "spec": {
                "activeDeadlineSeconds": 3600,
                "containers": [{"name": "main", "image": "busybox:1.37"}],
                "tolerations": [
                    {"key": "node.kubernetes.io/disk-pressure", "operator": "Exists", "effect": "NoSchedule"},
                    {"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}
                ]
            }
        })),
    )
    .await?;
    let changed = until(&super_pods, "web", "super pod with the tenant's changes", |p| {
        let Some(p) = p else { return false };
        let spec = p.spec.clone().unwrap_or_default();
        p.labels().get("tier").map(String::as_str) == Some("front")
            && spec.active_deadline_seconds == Some(3600)
            && spec.containers[0].image.as_deref() == Some("busybox:1.37")
            && spec
                .tolerations
                .iter()
                .flatten()
                .any(|t| t.key.as_deref() == Some("node.kubernetes.io/disk-pressure"))
    })
    .await?
    .expect("super pod");
    let tolerations = changed.spec.unwrap_or_default().tolerations.unwrap_or_default();
    assert!(
        !tolerations.iter().any(|t| t.key.as_deref() == Some("dedicated")),
        "a toleration the pod policy refuses reached the super pod: {tolerations:?}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "apps");
    let note = wait::until(PATIENCE, "PodPolicyViolation about web", || {
        let events = events.clone();
        async move {
            events
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("PodPolicyViolation"))
                .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web"))
                .find_map(|e| e.note)
        }
    })
    .await?;
    assert!(note.contains("toleration of taint dedicated=gpu"), "{note}");

    // A label removed after creation leaves the copy too (the copy was created by POST; its first update
    // made the syncer's fields applied ones, so an apply that no longer sets a label removes it).
    pods.patch(
        "web",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"stage": null}}})),
    )
    .await?;
    let relabelled = until(&super_pods, "web", "super pod without the removed label", |p| {
        p.is_some_and(|p| !p.labels().contains_key("stage") && p.labels().contains_key("tier"))
    })
    .await?
    .expect("super pod");
    let syncer_entries: Vec<(String, String)> = relabelled
        .metadata
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| e.manager.as_deref() == Some(wellknown::FIELD_MANAGER_SYNCER) && e.subresource.is_none())
        .map(|e| {
            (
                e.manager.clone().unwrap_or_default(),
                e.operation.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        syncer_entries,
        [(wellknown::FIELD_MANAGER_SYNCER.to_owned(), "Apply".to_owned())],
        "the syncer owns the pod's fields as applied ones only"
    );

    // In-place resize, as `kubectl patch --subresource resize` does it.
    let resized = pods
        .patch_subresource(
            "resize",
            "web",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"containers": [{"name": "main",
                "resources": {"requests": {"cpu": "150m"}, "limits": {"cpu": "300m"}}}]}})),
        )
        .await;
    match resized {
        Ok(_) => {}
        // Kubernetes before v1.33 (the v1.25 run) serves no pods/resize: nothing to carry down.
        Err(kube::Error::Api(status))
            if status.code == 404 && status.message.contains("requested resource") =>
        {
            eprintln!(
                "the tenant apiserver serves no pods/resize (Kubernetes before v1.33); the resize part is not run"
            );
            return Ok(());
        }
        Err(error) => return Err(error.into()),
    }
    until(&super_pods, "web", "super pod resized", |p| {
        let resources = p
            .and_then(|p| p.spec.as_ref()?.containers.first()?.resources.clone())
            .unwrap_or_default();
        let cpu = |map: &Option<BTreeMap<String, Quantity>>| map.as_ref()?.get("cpu").map(|q| q.0.clone());
        cpu(&resources.requests).as_deref() == Some("150m")
            && cpu(&resources.limits).as_deref() == Some("300m")
    })
    .await?;
    Ok(())
}
