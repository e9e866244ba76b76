//! The local sandbox end to end: vc-manager, the syncer and vn-agent together on a real super cluster,
//! with two real tenant masters used through plain kubectl, as the README's walkthrough does.

use std::time::Duration;

use crate::kubectl_support::Kubectl;
use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::{Api, ResourceExt};
use local_cluster::{
    Binary,
    nodes::expected_log_lines,
    sandbox::{NEEDS, Sandbox, SandboxOptions},
    wait,
};

/// Waits until the tenant's pod `default/web` is bound and Running.
async fn running(client: &kube::Client, tenant: &str) -> anyhow::Result<Pod> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    Ok(wait::until(
        Duration::from_secs(60),
        &format!("{tenant}'s pod web Running"),
        || {
            let pods = pods.clone();
            async move {
                let pod = pods.get_opt("web").await.ok().flatten()?;
                let running = pod.status.as_ref()?.phase.as_deref() == Some("Running");
                (running && pod.spec.as_ref()?.node_name.is_some()).then_some(pod)
            }
        },
    )
    .await?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_run_pods_on_vnodes_and_read_their_logs() -> anyhow::Result<()> {
    let needs: Vec<Binary> = NEEDS.iter().copied().chain([Binary::Kubectl]).collect();
    if !local_cluster::require("tenants_run_pods_on_vnodes_and_read_their_logs", &needs) {
        return Ok(());
    }
    let started = std::time::Instant::now();
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: vec!["alpha".into(), "beta".into()],
        nodes: 2,
        ..SandboxOptions::default()
    })
    .await?;
    eprintln!("sandbox up in {:.1}s", started.elapsed().as_secs_f64());
    let kubeconfigs = sandbox.tenant_kubeconfigs();
    assert_eq!(kubeconfigs.keys().collect::<Vec<_>>(), ["alpha", "beta"]);
    for path in kubeconfigs.values() {
        assert!(path.starts_with(sandbox.dir()), "{}", path.display());
    }
    let alpha = Kubectl::new(&kubeconfigs["alpha"])?;
    let beta = Kubectl::new(&kubeconfigs["beta"])?;

    // Both tenants run a pod of the same name in the same namespace.
    for kubectl in [&alpha, &beta] {
        kubectl
            .run(&["run", "web", "--image=registry.k8s.io/pause:3.9"], None)
            .await?
            .ok()?;
    }
    let tenancy = sandbox.tenancy();
    let alpha_client = tenancy.tenant("alpha").client();
    let pod = running(&alpha_client, "alpha").await?;
    running(&tenancy.tenant("beta").client(), "beta").await?;
    let node = pod.spec.and_then(|s| s.node_name).context("node")?;
    assert!(tenancy.nodes.names().contains(&node), "bound to {node}");

    // The vNode: named after the super node, marked virtual, unschedulable, kubelet port = vn-agent's.
    let vnode = Api::<Node>::all(alpha_client).get(&node).await?;
    assert_eq!(
        vnode
            .labels()
            .get("tenancy.x-k8s.io/virtualnode")
            .map(String::as_str),
        Some("true")
    );
    assert_eq!(vnode.spec.as_ref().and_then(|s| s.unschedulable), Some(true));
    let port = vnode
        .status
        .as_ref()
        .and_then(|s| s.daemon_endpoints.as_ref())
        .and_then(|d| d.kubelet_endpoint.as_ref())
        .map(|e| e.port);
    assert_eq!(port, Some(i32::from(sandbox.vn_agent_address().port())));
    let wide = alpha.run(&["get", "pods", "-o", "wide"], None).await?.ok()?;
    assert!(
        wide.stdout.contains("Running") && wide.stdout.contains(&node),
        "{}",
        wide.stdout
    );

    // Logs through the tenant apiserver, vn-agent and the simulated kubelet: alpha reads its own pod's.
    let alpha_key = &tenancy.tenant("alpha").cluster_key;
    let super_namespace = crds::naming::super_namespace(alpha_key, "default");
    let logs = alpha.run(&["logs", "web"], None).await?.ok()?;
    assert_eq!(
        logs.stdout.lines().collect::<Vec<_>>(),
        expected_log_lines(&super_namespace, "web", "web"),
    );
    let beta_logs = beta.run(&["logs", "web"], None).await?.ok()?;
    let beta_namespace = crds::naming::super_namespace(&tenancy.tenant("beta").cluster_key, "default");
    assert_eq!(
        beta_logs.stdout.lines().collect::<Vec<_>>(),
        expected_log_lines(&beta_namespace, "web", "web"),
    );

    // Each tenant sees its own pod only, and the super cluster holds both, apart.
    let listed = beta.run(&["get", "pods", "-A", "-o", "name"], None).await?.ok()?;
    assert_eq!(listed.stdout.trim(), "pod/web");
    let super_pods: Api<Pod> = Api::all(sandbox.super_client());
    let synced: Vec<String> = super_pods
        .list(&Default::default())
        .await?
        .items
        .iter()
        .filter(|p| p.name_any() == "web")
        .map(|p| p.namespace().unwrap_or_default())
        .collect();
    assert_eq!(synced.len(), 2, "{synced:?}");
    assert!(synced.contains(&super_namespace) && synced.contains(&beta_namespace));

    // Deleting in the tenant deletes below.
    alpha
        .run(&["delete", "pod", "web", "--wait=false"], None)
        .await?
        .ok()?;
    let below: Api<Pod> = Api::namespaced(sandbox.super_client(), &super_namespace);
    wait::until_true(Duration::from_secs(60), "alpha's super pod gone", || {
        let below = below.clone();
        async move { matches!(below.get_opt("web").await, Ok(None)) }
    })
    .await?;

    let dir = sandbox.dir().to_owned();
    sandbox.shutdown().await;
    assert!(!dir.exists(), "{} left behind", dir.display());
    Ok(())
}
