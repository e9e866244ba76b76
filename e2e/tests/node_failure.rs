//! A super node dies (issue 32, item 13): its simulated kubelet stops renewing the node's lease and status
//! and stops running its pods. As on a plain cluster, the super cluster's node lifecycle controller marks
//! it NotReady and taints it, the taint evicts the pods that tolerate it for a short while only, and their
//! controllers replace them on a live node; the tenant sees its vNode turn NotReady and its Deployment's
//! pods replaced, without any restart of the syncer.
//!
//! - `a_dead_node_is_seen_and_its_pods_are_replaced`: prints the seconds from the node's death to the
//!   super node NotReady, to the tenant's vNode NotReady, and to the replacement pods Running in the tenant
//!   on the live node.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::{Api, Client, ResourceExt, api::PostParams};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions},
    wait,
};
use serde_json::json;
use syncer::{Metrics, Syncer, SyncerConfig, engine::config::VNodeMode};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];

fn ready(node: &Node) -> Option<bool> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| c.status == "True")
}

async fn node_ready(client: &Client, name: &str) -> Option<bool> {
    ready(&Api::<Node>::all(client.clone()).get_opt(name).await.ok()??)
}

/// The tenant's running pods of `app`, with their nodes.
async fn running(client: &Client, namespace: &str, app: &str) -> Vec<(String, String)> {
    Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&kube::api::ListParams::default().labels(&format!("app={app}")))
        .await
        .map(|list| {
            list.items
                .into_iter()
                .filter(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                })
                .map(|p| {
                    let node = p
                        .spec
                        .as_ref()
                        .and_then(|s| s.node_name.clone())
                        .unwrap_or_default();
                    (p.name_any(), node)
                })
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_node_is_seen_and_its_pods_are_replaced() -> anyhow::Result<()> {
    if !local_cluster::require("a_dead_node_is_seen_and_its_pods_are_replaced", NEEDS) {
        return Ok(());
    }
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        nodes: 2,
        // Leases renewed every second and a node counted lost after 8 s without one: the same mechanism as
        // a production cluster's 10 s and 40-50 s, made quicker for the test.
        node_heartbeat: Some(Duration::from_secs(1)),
        super_controller_manager_args: vec![
            "--node-monitor-period=1s".into(),
            "--node-monitor-grace-period=8s".into(),
        ],
        ..Default::default()
    })
    .await?;
    let super_client = tenancy.super_client();
    let tenant = tenancy.tenant("tenant-0");
    let tenant_client = tenant.client();
    let _syncer = Syncer::start(
        super_client.clone(),
        SyncerConfig {
            tenant_health_period: Duration::from_secs(2),
            vnode_mode: VNodeMode::Usable,
            downward_workers: 4,
            upward_workers: 4,
            ..SyncerConfig::for_tests()
        },
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(tenant_client.clone(), "default");
    wait::until(Duration::from_secs(60), "the default ServiceAccount", || {
        let accounts = accounts.clone();
        async move { accounts.get_opt("default").await.ok().flatten() }
    })
    .await?;
    // A tenant that wants quick failover tolerates a lost node for two seconds (the default is 300).
    let deployment: k8s_openapi::api::apps::v1::Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 4,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "automountServiceAccountToken": false,
                    "containers": [{"name": "main", "image": "busybox"}],
                    "tolerations": [
                        {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2},
                        {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2}
                    ]
                }
            }
        }
    }))?;
    Api::<k8s_openapi::api::apps::v1::Deployment>::namespaced(tenant_client.clone(), "default")
        .create(&PostParams::default(), &deployment)
        .await?;
    let before = wait::until(Duration::from_secs(90), "4 pods running on both nodes", || {
        let client = tenant_client.clone();
        async move {
            let pods = running(&client, "default", "web").await;
            let nodes: std::collections::BTreeSet<&String> = pods.iter().map(|(_, n)| n).collect();
            (pods.len() == 4 && nodes.len() == 2).then_some(pods)
        }
    })
    .await?;
    let victim = before.first().map(|(_, node)| node.clone()).context("a node")?;
    let on_victim: Vec<String> = before
        .iter()
        .filter(|(_, node)| *node == victim)
        .map(|(pod, _)| pod.clone())
        .collect();
    wait::until(Duration::from_secs(30), "the tenant's vNode Ready", || {
        let client = tenant_client.clone();
        let victim = victim.clone();
        async move { node_ready(&client, &victim).await.filter(|r| *r) }
    })
    .await?;

    // The node dies.
    let simulator = tenancy.nodes.simulated().context("simulated nodes")?;
    simulator.kill_node(&victim);
    let died = Instant::now();
    let timeout = Duration::from_secs(120);
    wait::until(timeout, "the super node NotReady", || {
        let client = super_client.clone();
        let victim = victim.clone();
        async move { node_ready(&client, &victim).await.filter(|r| !*r) }
    })
    .await?;
    let super_not_ready = died.elapsed();
    wait::until(timeout, "the tenant's vNode NotReady", || {
        let client = tenant_client.clone();
        let victim = victim.clone();
        async move { node_ready(&client, &victim).await.filter(|r| !*r) }
    })
    .await?;
    let vnode_not_ready = died.elapsed();
    let after = wait::until(timeout, "4 pods running again, none on the dead node", || {
        let client = tenant_client.clone();
        let victim = victim.clone();
        async move {
            let pods = running(&client, "default", "web").await;
            (pods.len() == 4 && pods.iter().all(|(_, node)| *node != victim)).then_some(pods)
        }
    })
    .await?;
    let replaced = died.elapsed();
    assert!(
        after.iter().all(|(pod, _)| !on_victim.contains(pod)),
        "the dead node's pods were not replaced: {after:?}"
    );
    println!(
        "node failure: super node NotReady after {:.1} s, the tenant's vNode NotReady after {:.1} s ({:.1} s after the super node), replacement pods Running after {:.1} s (node-monitor-grace-period 8 s, tolerationSeconds 2)",
        super_not_ready.as_secs_f64(),
        vnode_not_ready.as_secs_f64(),
        (vnode_not_ready - super_not_ready).as_secs_f64(),
        replaced.as_secs_f64()
    );
    Ok(())
}
