//! Which super nodes a tenant sees (the syncer's `--vnode-mode`), against real apiservers and
//! controller-managers:
//!
//! - `tenants_see_the_nodes_they_may_use_from_the_start` (simulated nodes): with `usable`, a tenant sees a
//!   ready, schedulable, untainted vNode for every super node it may use before it runs anything, and none for a node
//!   tainted with a key it may not tolerate; its own cordon and uncordon stay (the syncer no longer puts
//!   `unschedulable` back); a vNode it deletes comes back; its DaemonSet gets one pod per vNode, each on
//!   the super node of that name.
//! - `a_tenant_daemonset_runs_a_real_container_on_every_node` (real nodes): the same DaemonSet runs a real
//!   container on each real node, which reports the node it runs on.

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use anyhow::Context as _;
use k8s_openapi::api::{
    apps::v1::DaemonSet,
    core::v1::{Node, Pod},
};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use local_cluster::{
    Binary, realnodes,
    sandbox::{NodeKind, Sandbox, SandboxOptions},
    tenancy::{Tenancy, TenancyOptions},
    wait,
};
use serde_json::json;
use syncer::{Metrics, Syncer, SyncerConfig, config::VNodeMode};
use vc_runtime::admin::Health;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];
const PATIENCE: Duration = Duration::from_secs(60);

/// The tenant's vNodes by name.
async fn vnode_names(client: &Client) -> BTreeSet<String> {
    Api::<Node>::all(client.clone())
        .list(&ListParams::default().labels(crds::wellknown::LABEL_VIRTUAL_NODE))
        .await
        .map(|list| list.items.iter().map(ResourceExt::name_any).collect())
        .unwrap_or_default()
}

fn unschedulable(node: &Node) -> bool {
    node.spec.as_ref().and_then(|s| s.unschedulable) == Some(true)
}

/// A DaemonSet whose container says which node it runs on, then sleeps.
fn daemon_set() -> anyhow::Result<DaemonSet> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": "agent"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "agent", "image": "busybox",
                        "command": ["sh", "-c", "echo on node $NODE; exec sleep 3600"],
                        "env": [{"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
                    }]
                }
            }
        }
    }))?)
}

/// Waits until the DaemonSet has one Running pod on each of `nodes`, and returns them.
async fn daemon_pods(
    client: &Client,
    nodes: &BTreeSet<String>,
    patience: Duration,
) -> anyhow::Result<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    wait::until(patience, "one Running agent pod per vNode", || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels("app=agent")).await.ok()?;
            let running: Vec<Pod> = list
                .items
                .into_iter()
                .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                .collect();
            let on: BTreeSet<String> = running
                .iter()
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            (running.len() == nodes.len() && on == *nodes).then_some(running)
        }
    })
    .await
    .map_err(|error| {
        // Say where each pod is, and why, for the failure.
        let seen = futures::executor::block_on(async {
            let list = pods.list(&ListParams::default().labels("app=agent")).await.ok()?;
            let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), "default")
                .list(&ListParams::default())
                .await
                .ok()?;
            let daemon_set = Api::<DaemonSet>::namespaced(client.clone(), "default")
                .get_opt("agent")
                .await
                .ok()
                .flatten()
                .and_then(|d| d.status);
            let taints: Vec<_> = Api::<Node>::all(client.clone())
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .map(|n| (n.name_any(), n.spec.and_then(|s| s.taints)))
                .collect();
            Some(format!(
                "vNode taints: {taints:?}; DaemonSet status: {daemon_set:?}; pods: {:?}; events: {:?}",
                list.items
                    .iter()
                    .map(|p| (
                        p.name_any(),
                        p.spec.as_ref().and_then(|s| s.node_name.clone()),
                        p.status.as_ref().and_then(|s| s.phase.clone())
                    ))
                    .collect::<Vec<_>>(),
                events
                    .items
                    .iter()
                    .map(|e| format!(
                        "{}: {}",
                        e.reason.clone().unwrap_or_default(),
                        e.message.clone().unwrap_or_default()
                    ))
                    .collect::<Vec<_>>()
            ))
        });
        anyhow::anyhow!("{error}; {}", seen.unwrap_or_default())
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_see_the_nodes_they_may_use_from_the_start() -> anyhow::Result<()> {
    if !local_cluster::require("tenants_see_the_nodes_they_may_use_from_the_start", NEEDS) {
        return Ok(());
    }
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        nodes: 3,
        ..Default::default()
    })
    .await?;
    let super_client = tenancy.super_client();
    tenancy.nodes.wait_ready(&super_client).await?;
    let names = tenancy.nodes.names();
    // A node kept for the platform: its taint is not one tenants may tolerate.
    Api::<Node>::all(super_client.clone())
        .patch(
            &names[2],
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"taints": [
                {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}})),
        )
        .await?;
    let usable: BTreeSet<String> = names[..2].iter().cloned().collect();
    let _syncer = Syncer::start(
        super_client.clone(),
        SyncerConfig {
            patrol_interval: Duration::from_secs(2),
            tenant_health_period: Duration::from_secs(2),
            token_ttl_seconds: 600,
            vnode_mode: VNodeMode::Usable,
            ..Default::default()
        },
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?;
    let tenant = tenancy.tenant("tenant-0").client();
    let nodes: Api<Node> = Api::all(tenant.clone());

    // Before any pod: the usable nodes, ready and schedulable; not the platform's.
    wait::until_true(PATIENCE, "a vNode for each usable super node", || {
        let tenant = tenant.clone();
        let usable = usable.clone();
        async move { vnode_names(&tenant).await == usable }
    })
    .await?;
    // Without the not-ready taint the tenant apiserver's admission gives every new node (no node
    // lifecycle controller in the tenant would take it off): what DaemonSets and the conformance suite
    // look for.
    wait::until_true(PATIENCE, "the vNodes untainted", || {
        let nodes = nodes.clone();
        let usable = usable.clone();
        async move {
            let mut untainted = true;
            for name in &usable {
                let taints = nodes.get(name).await.ok().and_then(|n| n.spec?.taints);
                untainted &= taints.unwrap_or_default().is_empty();
            }
            untainted
        }
    })
    .await?;
    for name in &usable {
        let vnode = nodes.get(name).await?;
        assert!(!unschedulable(&vnode), "{name} is cordoned");
        let ready = vnode
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
            .map(|c| c.status.clone());
        assert_eq!(ready.as_deref(), Some("True"), "{name} Ready");
    }

    // The tenant's cordon is its own: patrols leave it, and leave the uncordon too.
    let cordon = |value: bool| Patch::Merge(json!({"spec": {"unschedulable": value}}));
    nodes
        .patch(&names[0], &PatchParams::default(), &cordon(true))
        .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(unschedulable(&nodes.get(&names[0]).await?), "cordon undone");
    nodes
        .patch(&names[0], &PatchParams::default(), &cordon(false))
        .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!unschedulable(&nodes.get(&names[0]).await?), "cordoned again");

    // A vNode the tenant deletes comes back.
    nodes.delete(&names[1], &Default::default()).await?;
    wait::until_true(PATIENCE, "the deleted vNode back", || {
        let nodes = nodes.clone();
        let name = names[1].clone();
        async move {
            nodes
                .get_opt(&name)
                .await
                .ok()
                .flatten()
                .is_some_and(|n| n.metadata.deletion_timestamp.is_none())
        }
    })
    .await?;

    // A DaemonSet: one pod per vNode, each on the super node of its vNode's name.
    wait::until_true(PATIENCE, "the default ServiceAccount", || {
        let tenant = tenant.clone();
        async move {
            Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(tenant, "default")
                .get_opt("default")
                .await
                .ok()
                .flatten()
                .is_some()
        }
    })
    .await?;
    Api::<DaemonSet>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &daemon_set()?)
        .await?;
    let pods = daemon_pods(&tenant, &usable, PATIENCE).await?;
    let super_namespace = tenancy.tenant("tenant-0").super_namespace("default");
    let super_pods: Api<Pod> = Api::namespaced(super_client.clone(), &super_namespace);
    for pod in &pods {
        let super_pod = super_pods.get(&pod.name_any()).await?;
        assert_eq!(
            super_pod.spec.and_then(|s| s.node_name),
            pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            "{} runs on another super node than its vNode",
            pod.name_any()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_daemonset_runs_a_real_container_on_every_node() -> anyhow::Result<()> {
    const TEST: &str = "a_tenant_daemonset_runs_a_real_container_on_every_node";
    let needs = [NEEDS, &[Binary::KubeScheduler]].concat();
    if !local_cluster::require(TEST, &needs) || !realnodes::require(TEST) {
        return Ok(());
    }
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: vec!["alpha".to_owned()],
        node_kind: NodeKind::Real,
        vnode_mode: VNodeMode::Usable,
        ..SandboxOptions::default()
    })
    .await?;
    let tenant = sandbox.tenancy().tenant("alpha").client();
    let nodes: BTreeSet<String> = sandbox.tenancy().nodes.names().into_iter().collect();
    wait::until_true(PATIENCE, "a vNode for every real node", || {
        let tenant = tenant.clone();
        let nodes = nodes.clone();
        async move { vnode_names(&tenant).await == nodes }
    })
    .await?;
    Api::<DaemonSet>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &daemon_set()?)
        .await?;
    let pods = daemon_pods(&tenant, &nodes, Duration::from_secs(180)).await?;
    let api: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    for pod in &pods {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .context("node")?;
        // The container itself reports the node it runs on (the super pod's spec.nodeName).
        let logs = wait::until(Duration::from_secs(30), "the agent's log", || {
            let api = api.clone();
            let name = pod.name_any();
            async move {
                api.logs(&name, &Default::default())
                    .await
                    .ok()
                    .filter(|l| l.contains("on node"))
            }
        })
        .await?;
        assert_eq!(logs.trim(), format!("on node {node}"), "{}", pod.name_any());
    }
    Ok(())
}
