//! A deleted pod that a finalizer holds (real nodes): on a plain cluster its node's kubelet stops its
//! containers and writes its end (containers terminated, phase `Failed`, not ready), and the pod stays until
//! the finalizer goes. A tenant's pod ends the same way: its super pod is deleted (the containers stop),
//! its status says so, and removing the finalizer lets it go (conformance: StatefulSet "canary updates and
//! phased rolling updates", whose pod-0 a finalizer holds while the test waits for it to stop being ready).
//!
//! - `a_deleted_pod_a_finalizer_holds_stops_and_says_so`: the same pod on the plain super cluster and in
//!   an adopted tenant, each checked alike.

use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Namespace, Pod, PodStatus};
use kube::{
    Api, Client,
    api::{DeleteParams, Patch, PatchParams, PostParams},
};
use local_cluster::{
    Binary, realnodes,
    sandbox::{NodeKind, Sandbox, SandboxOptions},
    wait,
};
use serde_json::json;

const TEST: &str = "a_deleted_pod_a_finalizer_holds_stops_and_says_so";
const NEEDS: &[Binary] = &[
    Binary::Etcd,
    Binary::KubeApiserver,
    Binary::KubeControllerManager,
    Binary::KubeScheduler,
];
const FINALIZER: &str = "e2e.virtualcluster.io/hold";
const PATIENCE: Duration = Duration::from_secs(120);

fn held_pod() -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "held", "finalizers": [FINALIZER]},
        "spec": {
            // `sleep` as PID 1 ignores SIGTERM: the kubelet kills it when the grace period ends.
            "terminationGracePeriodSeconds": 2,
            "containers": [{"name": "main", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"]}]
        }
    }))?)
}

fn ready(status: &PodStatus) -> bool {
    status
        .conditions
        .iter()
        .flatten()
        .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// What a node's kubelet leaves on a deleted pod that has stopped: every container terminated and not
/// ready, phase `Failed` (`sleep` was killed), `Ready` False.
fn stopped(status: &PodStatus) -> bool {
    let containers = status.container_statuses.as_deref().unwrap_or_default();
    !containers.is_empty()
        && containers
            .iter()
            .all(|c| !c.ready && c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
        && status.phase.as_deref() == Some("Failed")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "False")
}

/// Creates the held pod in `pods`, waits until it runs, deletes it, and waits until `gone_below` says its
/// containers were stopped and the pod says so; then removes the finalizer and waits until it is gone.
async fn delete_held_pod<F, Fut>(what: &str, pods: &Api<Pod>, gone_below: F) -> anyhow::Result<PodStatus>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    pods.create(&PostParams::default(), &held_pod()?).await?;
    wait::until_true(PATIENCE, &format!("{what}: held Running and ready"), || {
        let pods = pods.clone();
        async move {
            pods.get("held")
                .await
                .ok()
                .and_then(|p| p.status)
                .is_some_and(|s| s.phase.as_deref() == Some("Running") && ready(&s))
        }
    })
    .await?;
    pods.delete("held", &DeleteParams::default()).await?;
    wait::until_true(
        PATIENCE,
        &format!("{what}: held's containers stopped"),
        &gone_below,
    )
    .await?;
    let ended = wait::until(
        PATIENCE,
        &format!("{what}: held's status says it stopped"),
        || {
            let pods = pods.clone();
            async move { pods.get("held").await.ok()?.status.filter(stopped) }
        },
    )
    .await;
    let ended = match ended {
        Ok(status) => status,
        Err(error) => {
            let status = pods.get("held").await.ok().and_then(|p| p.status);
            anyhow::bail!("{error}; status: {status:?}");
        }
    };
    // It stays while the finalizer does.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let kept = pods
        .get("held")
        .await
        .context("held is gone while its finalizer holds it")?;
    assert!(kept.metadata.deletion_timestamp.is_some(), "{what}: {kept:?}");
    assert!(
        kept.status.as_ref().is_some_and(stopped),
        "{what}: the status changed back: {:?}",
        kept.status
    );
    pods.patch(
        "held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await?;
    wait::until_true(
        PATIENCE,
        &format!("{what}: held gone once its finalizer is"),
        || {
            let pods = pods.clone();
            async move { pods.get_opt("held").await.is_ok_and(|p| p.is_none()) }
        },
    )
    .await?;
    Ok(ended)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_pod_a_finalizer_holds_stops_and_says_so() -> anyhow::Result<()> {
    if !local_cluster::require(TEST, NEEDS) || !realnodes::require(TEST) {
        return Ok(());
    }
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: vec!["alpha".to_owned()],
        node_kind: NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;
    let super_client: Client = sandbox.tenancy().super_client();

    // The plain cluster: what its kubelet does is what the tenant must see.
    Api::<Namespace>::all(super_client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "plain"}}))?,
        )
        .await?;
    let plain: Api<Pod> = Api::namespaced(super_client.clone(), "plain");
    let plain_end = delete_held_pod("plain cluster", &plain, || {
        let plain = plain.clone();
        // The kubelet stops the containers, then records the pod's end: a terminated container.
        async move {
            plain
                .get_opt("held")
                .await
                .ok()
                .flatten()
                .and_then(|p| p.status)
                .is_some_and(|s| {
                    s.container_statuses
                        .iter()
                        .flatten()
                        .all(|c| c.state.as_ref().is_some_and(|s| s.terminated.is_some()))
                })
        }
    })
    .await?;
    eprintln!("plain cluster: held ended {:?}", plain_end.phase);

    // The tenant: its super pod goes (the kubelet stopped the containers and deleted it), and the tenant
    // pod tells the same end.
    let tenant = sandbox.tenancy().tenant("alpha");
    let pods: Api<Pod> = Api::namespaced(tenant.client(), "default");
    let super_pods: Api<Pod> = Api::namespaced(super_client.clone(), &tenant.super_namespace("default"));
    let tenant_end = delete_held_pod("tenant", &pods, || {
        let super_pods = super_pods.clone();
        async move { super_pods.get_opt("held").await.is_ok_and(|p| p.is_none()) }
    })
    .await?;
    eprintln!(
        "tenant: held ended {:?}, container {:?}",
        tenant_end.phase,
        tenant_end
            .container_statuses
            .as_deref()
            .unwrap_or_default()
            .first()
            .and_then(|c| c.state.clone()?.terminated)
    );
    Ok(())
}
