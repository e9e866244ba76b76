//! Which super nodes a tenant sees (the syncer's `--vnode-mode`), against real apiservers and
//! controller-managers:
//!
//! - `tenants_see_the_nodes_they_may_use_from_the_start` (simulated nodes): with `usable`, a tenant sees a
//!   ready, schedulable, untainted vNode for every super node it may use before it runs anything, and none for a node
//!   tainted with a key it may not tolerate; its own cordon and uncordon stay (the syncer no longer puts
//!   `unschedulable` back); a vNode it deletes comes back; its DaemonSet gets one pod per vNode, each on
//!   the super node of that name.
//! - `pods_select_among_the_vnodes_as_the_tenant_labelled_them` (simulated nodes): the super copies of
//!   pods with a node selector on a label the tenant put on its vNode, node affinity on names, a node
//!   name, and the pod of a DaemonSet with that node selector ask for exactly the super nodes of the
//!   vNodes they select, by name; a selection no vNode matches (a label no node has, the hostname of
//!   a node the tenant does not see) asks for a label no node has; a pod naming a node the tenant does
//!   not see is refused.
//! - `a_tenant_daemonset_runs_a_real_container_on_every_node` (real nodes): the same DaemonSet runs a real
//!   container on each real node, which reports the node it runs on; a pod bound to a vNode by name that
//!   the node cannot take (it asks for more CPU than the node has) fails at once with the kubelet's
//!   reason, its copy is removed, and it stays failed.

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
use syncer::{Metrics, Syncer, SyncerConfig, engine::config::VNodeMode};
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

/// Waits for the tenant's default ServiceAccount (pods need it).
async fn default_service_account(tenant: &Client) -> anyhow::Result<()> {
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(tenant.clone(), "default");
    crate::object_support::until(&accounts, "default", "the default ServiceAccount", |sa| {
        sa.is_some()
    })
    .await?;
    Ok(())
}

/// Three simulated super nodes, the third kept for the platform (a taint tenants may not tolerate, and
/// `platform_labels`), one tenant and the syncer in `--vnode-mode usable`.
async fn usable_nodes(platform_labels: serde_json::Value) -> anyhow::Result<(Tenancy, Syncer, Vec<String>)> {
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        nodes: 3,
        ..Default::default()
    })
    .await?;
    let super_client = tenancy.super_client();
    tenancy.nodes.wait_ready(&super_client).await?;
    let names = tenancy.nodes.names();
    Api::<Node>::all(super_client.clone())
        .patch(
            &names[2],
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": platform_labels}, "spec": {"taints": [
                {"key": "dedicated", "value": "infra", "effect": "NoSchedule"}]}}),
            ),
        )
        .await?;
    let syncer = Syncer::start(
        super_client,
        SyncerConfig {
            patrol_interval: Duration::from_secs(2),
            tenant_health_period: Duration::from_secs(2),
            token_ttl_seconds: 600,
            vnode_mode: VNodeMode::Usable,
            ..SyncerConfig::for_tests()
        },
        Arc::new(Metrics::default()),
        Health::new(),
    )
    .await?;
    Ok((tenancy, syncer, names))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn tenants_see_the_nodes_they_may_use_from_the_start() -> anyhow::Result<()> {
    if !local_cluster::require("tenants_see_the_nodes_they_may_use_from_the_start", NEEDS) {
        return Ok(());
    }
    let (tenancy, _syncer, names) = usable_nodes(json!({})).await?;
    let super_client = tenancy.super_client();
    let usable: BTreeSet<String> = names[..2].iter().cloned().collect();
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
    default_service_account(&tenant).await?;
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

/// The super pod of this name, once the syncer made it.
async fn until_found(pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait::until(PATIENCE, &format!("super pod {name}"), || {
        let pods = pods.clone();
        async move { pods.get_opt(name).await.ok().flatten() }
    })
    .await
    .map_err(Into::into)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_select_among_the_vnodes_as_the_tenant_labelled_them() -> anyhow::Result<()> {
    if !local_cluster::require("pods_select_among_the_vnodes_as_the_tenant_labelled_them", NEEDS) {
        return Ok(());
    }
    // The platform's node, which the tenant does not see, has the label the tenant will put on its vNode.
    let (tenancy, _syncer, names) = usable_nodes(json!({"color": "blue"})).await?;
    let super_client = tenancy.super_client();
    let super_nodes: Api<Node> = Api::all(super_client.clone());
    let tenant = tenancy.tenant("tenant-0").client();
    let usable: BTreeSet<String> = names[..2].iter().cloned().collect();
    wait::until_true(PATIENCE, "a vNode for each usable super node", || {
        let tenant = tenant.clone();
        let usable = usable.clone();
        async move { vnode_names(&tenant).await == usable }
    })
    .await?;
    default_service_account(&tenant).await?;
    // The tenant labels its first vNode; the super node keeps its own labels.
    Api::<Node>::all(tenant.clone())
        .patch(
            &names[0],
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"color": "blue"}}})),
        )
        .await?;
    let hostname_of_platform_node = super_nodes
        .get(&names[2])
        .await?
        .labels()
        .get("kubernetes.io/hostname")
        .cloned()
        .unwrap_or_else(|| names[2].clone());
    let pod = |name: &str, spec: serde_json::Value| -> anyhow::Result<Pod> {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "busybox"}]);
        spec["terminationGracePeriodSeconds"] = json!(1);
        Ok(serde_json::from_value(
            json!({"metadata": {"name": name}, "spec": spec}),
        )?)
    };
    let pods: Api<Pod> = Api::namespaced(tenant.clone(), "default");
    for (name, spec) in [
        ("blue", json!({"nodeSelector": {"color": "blue"}})),
        ("nowhere", json!({"nodeSelector": {"label": "nonempty"}})),
        // The platform's node, by its hostname and by its name: not a node of the tenant's.
        (
            "platform-host",
            json!({"nodeSelector": {"kubernetes.io/hostname": hostname_of_platform_node}}),
        ),
        ("platform-name", json!({"nodeName": names[2]})),
        ("second", json!({"nodeName": names[1]})),
        (
            "not-second",
            json!({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": [names[1]]}]}]}}}}),
        ),
    ] {
        pods.create(&PostParams::default(), &pod(name, spec)?).await?;
    }
    let mut daemon = daemon_set()?;
    if let Some(spec) = daemon.spec.as_mut().and_then(|s| s.template.spec.as_mut()) {
        spec.node_selector = Some([("color".to_owned(), "blue".to_owned())].into());
    }
    Api::<DaemonSet>::namespaced(tenant.clone(), "default")
        .create(&PostParams::default(), &daemon)
        .await?;

    // The super copies ask for the super nodes of the vNodes they select, by name. (The
    // simulated nodes here take pods without a scheduler; what the copies ask for is the syncer's part.)
    let super_pods: Api<Pod> = Api::namespaced(
        super_client.clone(),
        &tenancy.tenant("tenant-0").super_namespace("default"),
    );
    let hosts = |wanted: &[&String]| -> anyhow::Result<serde_json::Value> {
        Ok(serde_json::Value::Array(
            wanted
                .iter()
                .map(|name| json!({"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]}))
                .collect(),
        ))
    };
    let none =
        json!([{"matchExpressions": [{"key": "tenancy.x-k8s.io/no-matching-vnode", "operator": "Exists"}]}]);
    let daemon_pod = wait::until(PATIENCE, "the DaemonSet's one pod", || {
        let pods = pods.clone();
        async move {
            let list = pods.list(&ListParams::default().labels("app=agent")).await.ok()?;
            (list.items.len() == 1).then(|| list.items[0].name_any())
        }
    })
    .await?;
    for (name, terms) in [
        ("blue", hosts(&[&names[0]])?),
        ("not-second", hosts(&[&names[0]])?),
        ("second", hosts(&[&names[1]])?),
        (daemon_pod.as_str(), hosts(&[&names[0]])?),
        ("nowhere", none.clone()),
        ("platform-host", none.clone()),
    ] {
        let copy = until_found(&super_pods, name).await?;
        let spec = copy.spec.context("spec")?;
        assert_eq!(spec.node_selector, None, "{name}");
        let affinity = serde_json::to_value(spec.affinity.and_then(|a| a.node_affinity))?;
        assert_eq!(
            affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"], terms,
            "{name}: {affinity}"
        );
    }
    // The tenant's DaemonSet controller saw the label on the tenant's vNode only.
    let agent = pods.get(&daemon_pod).await?;
    let pinned = serde_json::to_value(agent.spec.and_then(|s| s.affinity))?;
    assert!(pinned.to_string().contains(&names[0]), "{pinned}");
    // A pod naming a node the tenant does not see is refused outright.
    wait::until_true(PATIENCE, "NotSupported for platform-name", || {
        let tenant = tenant.clone();
        async move {
            Api::<k8s_openapi::api::core::v1::Event>::namespaced(tenant, "default")
                .list(&ListParams::default())
                .await
                .is_ok_and(|list| {
                    list.items.iter().any(|e| {
                        e.involved_object.name.as_deref() == Some("platform-name")
                            && e.reason.as_deref() == Some("NotSupported")
                    })
                })
        }
    })
    .await?;
    assert!(super_pods.get_opt("platform-name").await?.is_none());
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

    // A pod bound to a vNode by name that its node cannot take fails at once, as the node's kubelet
    // would fail it (a StatefulSet then makes it again); its copy is removed so it never starts later.
    let node = nodes.iter().next().context("a node")?.clone();
    let too_big: Pod = serde_json::from_value(json!({
        "metadata": {"name": "too-big"},
        "spec": {"nodeName": node, "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "busybox", "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "3600"], "resources": {"requests": {"cpu": "1000"}}}]}
    }))?;
    api.create(&PostParams::default(), &too_big).await?;
    let failed = wait::until(PATIENCE, "too-big Failed", || {
        let api = api.clone();
        async move {
            let pod = api.get("too-big").await.ok()?;
            let status = pod.status?;
            (status.phase.as_deref() == Some("Failed")).then_some(status)
        }
    })
    .await?;
    assert_eq!(failed.reason.as_deref(), Some("OutOfcpu"), "{failed:?}");
    let message = failed.message.unwrap_or_default();
    assert!(
        message.starts_with(&format!("Pod was rejected: node {node} cannot run it: "))
            && message.contains("Insufficient cpu"),
        "{message}"
    );
    let super_pods: Api<Pod> = Api::namespaced(
        sandbox.tenancy().super_client(),
        &sandbox.tenancy().tenant("alpha").super_namespace("default"),
    );
    wait::until_true(PATIENCE, "too-big's super copy removed", || {
        let super_pods = super_pods.clone();
        async move { super_pods.get_opt("too-big").await.is_ok_and(|p| p.is_none()) }
    })
    .await?;
    // Without its copy, the failed pod stays as it ended: not made again, not deleted as lost.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let kept = api.get("too-big").await?;
    assert_eq!(kept.status.and_then(|s| s.phase).as_deref(), Some("Failed"));
    assert!(super_pods.get_opt("too-big").await?.is_none(), "copy made again");
    Ok(())
}
