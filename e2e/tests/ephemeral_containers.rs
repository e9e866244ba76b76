//! `kubectl debug` in a tenant (issue 16): ephemeral containers the tenant adds to its running pod reach
//! the super pod, run next to its containers on a real node, and are reached through vn-agent by
//! `kubectl logs`, `exec`, `attach` and `debug -i`, also sharing the target container's processes
//! (`--target`); one the pod policy refuses is told in an event and never reaches the super pod.
//!
//! - `kubectl_debug_reaches_the_running_super_pod_through_vn_agent`: the sandbox (vc-manager, syncer,
//!   vn-agent on the kubelet backend, vc-dns) with one adopted tenant on one real node.

use std::time::Duration;

use crate::{kubectl_support::Kubectl, object_support::create};
use anyhow::Context as _;
use k8s_openapi::api::{
    core::v1::{ContainerStatus, Pod, ServiceAccount},
    events::v1::Event,
};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use local_cluster::{
    Binary,
    sandbox::{NodeKind, Sandbox, SandboxOptions},
    wait,
};
use serde_json::json;

const TEST: &str = "kubectl_debug_reaches_the_running_super_pod_through_vn_agent";
const PATIENCE: Duration = Duration::from_secs(120);

/// The status of ephemeral container `name` in `pod`.
fn ephemeral_status<'p>(pod: &'p Pod, name: &str) -> Option<&'p ContainerStatus> {
    pod.status
        .as_ref()?
        .ephemeral_container_statuses
        .iter()
        .flatten()
        .find(|s| s.name == name)
}

fn running(status: Option<&ContainerStatus>) -> bool {
    status
        .and_then(|s| s.state.as_ref())
        .is_some_and(|s| s.running.is_some())
}

fn ephemeral_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .map(|c| c.name.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_debug_reaches_the_running_super_pod_through_vn_agent() -> anyhow::Result<()> {
    let needs = [
        Binary::Etcd,
        Binary::KubeApiserver,
        Binary::KubeControllerManager,
        Binary::KubeScheduler,
        Binary::Kubectl,
    ];
    if !local_cluster::require(TEST, &needs) || !local_cluster::realnodes::require(TEST) {
        return Ok(());
    }
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: vec!["debugged".to_owned()],
        nodes: 1,
        node_kind: NodeKind::Real,
        ..Default::default()
    })
    .await?;
    let kubeconfig = sandbox.tenant_kubeconfigs()["debugged"].clone();
    let client = local_cluster::client_from_kubeconfig_file(&kubeconfig).await?;
    let kubectl = Kubectl::new(&kubeconfig)?;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    wait::until_true(PATIENCE, "the default service account", || async {
        accounts.get_opt("default").await.is_ok_and(|a| a.is_some())
    })
    .await?;
    create::<Pod>(
        &client,
        Some("default"),
        json!({"metadata": {"name": "web"}, "spec": {"terminationGracePeriodSeconds": 1,
            "containers": [{"name": "web", "image": "busybox", "command": ["sleep", "3600"]}]}}),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait::until_true(PATIENCE, "tenant pod web Running", || async {
        pods.get("web")
            .await
            .is_ok_and(|p| p.status.and_then(|s| s.phase).as_deref() == Some("Running"))
    })
    .await?;
    let super_namespace = sandbox.tenancy().tenant("debugged").super_namespace("default");
    let super_pods: Api<Pod> = Api::namespaced(sandbox.super_client(), &super_namespace);

    // A debug container that prints a line, then ticks: in the super pod, Running there and in the tenant,
    // its log read and attached to through vn-agent.
    let started = tokio::time::Instant::now();
    kubectl
        .run(
            &[
                "-n",
                "default",
                "debug",
                "web",
                "--image=busybox",
                "--container=dbg",
                "--",
                "sh",
                "-c",
                "echo hello-from-debug; while true; do echo tick; sleep 1; done",
            ],
            None,
        )
        .await?
        .ok()?;
    wait::until_true(PATIENCE, "dbg Running in the super pod", || async {
        super_pods
            .get("web")
            .await
            .is_ok_and(|p| running(ephemeral_status(&p, "dbg")))
    })
    .await?;
    wait::until_true(PATIENCE, "dbg Running in the tenant pod", || async {
        pods.get("web")
            .await
            .is_ok_and(|p| running(ephemeral_status(&p, "dbg")))
    })
    .await?;
    eprintln!(
        "kubectl debug --container=dbg: Running in the tenant pod after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let logs = wait::until(Duration::from_secs(30), "dbg's log through vn-agent", || {
        let kubectl = kubectl.clone();
        async move {
            let out = kubectl
                .run(&["-n", "default", "logs", "web", "-c", "dbg"], None)
                .await
                .ok()?;
            out.stdout.contains("hello-from-debug").then_some(out.stdout)
        }
    })
    .await?;
    assert_eq!(logs.lines().next(), Some("hello-from-debug"), "{logs}");
    // `kubectl attach` without input: what the container prints from then on.
    let attached = kubectl
        .first_lines(&["-n", "default", "attach", "web", "-c", "dbg"], 2)
        .await?;
    assert_eq!(attached, ["tick", "tick"]);
    let exec = kubectl
        .run(
            &[
                "-n",
                "default",
                "exec",
                "web",
                "-c",
                "dbg",
                "--",
                "echo",
                "exec-in-debug",
            ],
            None,
        )
        .await?
        .ok()?;
    assert_eq!(exec.stdout, "exec-in-debug\n");

    // `kubectl debug -i --target`: waits for the container to run in the tenant pod, then attaches through
    // vn-agent; sharing the target's process namespace, it sees the target container's `sleep`.
    let started = tokio::time::Instant::now();
    let attached = kubectl
        .run_typing(
            &[
                "-n",
                "default",
                "debug",
                "web",
                "-i",
                "--image=busybox",
                "--container=shell",
                "--target=web",
                "--",
                "sh",
            ],
            // The pause before `exit`: what a container prints just before it ends can miss an attached
            // client (the runtime closes the attach streams on exit; the CI once lost `ps`'s lines so).
            b"echo hi-from-attach; ps -o args; sleep 2; exit\n",
        )
        .await?
        .ok()?;
    eprintln!(
        "kubectl debug -i --target=web took {:.1} s and printed:\n{}{}",
        started.elapsed().as_secs_f64(),
        attached.stdout,
        attached.stderr
    );
    assert!(attached.stdout.contains("hi-from-attach"), "{attached:?}");
    assert!(attached.stdout.contains("sleep 3600"), "{attached:?}");
    let super_pod = super_pods.get("web").await?;
    let shell = super_pod
        .spec
        .iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .find(|c| c.name == "shell")
        .context("shell in the super pod")?;
    assert_eq!(shell.target_container_name.as_deref(), Some("web"));
    let env: Vec<_> = shell.env.iter().flatten().map(|e| e.name.as_str()).collect();
    assert!(env.contains(&"KUBERNETES_SERVICE_HOST"), "{env:?}");

    // What `kubectl debug --profile=sysadmin` writes (kubectl v1.25 has no profiles): a privileged
    // container, which the default pod policy refuses. The tenant's apiserver takes it; the super pod never
    // gets it, and the tenant is told once.
    pods.patch_subresource(
        "ephemeralcontainers",
        "web",
        &PatchParams::default(),
        &Patch::Strategic(
            json!({"spec": {"ephemeralContainers": [{"name": "root", "image": "busybox",
            "command": ["sleep", "3600"], "securityContext": {"privileged": true}}]}}),
        ),
    )
    .await?;
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let refusals = || async {
        events
            .list(&Default::default())
            .await
            .map(|list| {
                list.items
                    .into_iter()
                    .filter(|e| e.reason.as_deref() == Some("PodPolicyViolation"))
                    .filter_map(|e| e.note)
                    .filter(|note| note.contains("\"root\""))
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default()
    };
    let note = wait::until(PATIENCE, "PodPolicyViolation about root", || async {
        refusals().await.into_iter().next()
    })
    .await?;
    assert!(note.contains("privileged ephemeral container \"root\""), "{note}");
    // Long enough for status changes and a patrol (15 s) to look at the pod again.
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(refusals().await.len(), 1, "told more than once");
    let mut names = ephemeral_names(&super_pods.get("web").await?);
    names.sort();
    assert_eq!(names, ["dbg", "shell"], "the super pod's ephemeral containers");
    assert!(ephemeral_names(&pods.get("web").await?).contains(&"root".to_owned()));
    sandbox.shutdown().await;
    Ok(())
}
