//! Pausing and resuming tenants: the syncer removes a paused tenant's super pods and keeps everything else,
//! and recreates the same pods on resume (a provisioned tenant stand-in, phases set as vc-manager sets
//! them); vc-manager scales a native control plane to zero and back (simulated nodes).

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use crds::{VirtualCluster, wellknown};
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret, Service},
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use local_cluster::{
    Binary, ControlPlane, ControlPlaneOptions, NodeSimulator, NodeSimulatorOptions, apply,
    tenancy::{Tenancy, TenancyOptions},
    wait,
};
use serde_json::json;

use crate::{
    object_support::{create, until},
    syncer::{config, pod_json, seed, start_syncer, tenant_synced},
    vc_manager_support::{RunningManager, condition, fast_settings, init_logging, wait_vc},
};

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];
const PATIENCE: Duration = Duration::from_secs(60);

fn tenancy_annotation<'a>(object: &'a impl kube::Resource, key: &str) -> Option<&'a str> {
    object.meta().annotations.as_ref()?.get(key).map(String::as_str)
}

/// The uids of the pods in `api`, by name.
async fn uids(api: &Api<Pod>) -> anyhow::Result<BTreeMap<String, String>> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_paused_tenant_loses_its_super_pods_only_and_gets_the_same_ones_back() -> anyhow::Result<()> {
    if !local_cluster::require(
        "a_paused_tenant_loses_its_super_pods_only_and_gets_the_same_ones_back",
        NEEDS,
    ) {
        return Ok(());
    }
    let mut tenancy = Tenancy::start(TenancyOptions {
        tenants: 0,
        ..Default::default()
    })
    .await?;
    // A tenant master registered as vc-manager registers a provisioned tenant (root namespace, admin
    // kubeconfig); the test writes the phases vc-manager writes while it pauses and resumes one.
    let super_client = tenancy.super_client();
    let vcs: Api<VirtualCluster> =
        Api::namespaced(super_client.clone(), local_cluster::tenancy::VC_NAMESPACE);
    tenancy.add_tenant("master", Default::default()).await?;
    vcs.delete("master", &DeleteParams::default()).await?;
    until(&vcs, "master", "adopted VirtualCluster gone", |vc| vc.is_none()).await?;
    let master = tenancy.tenant("master");
    let vc = create::<VirtualCluster>(
        &super_client,
        Some(local_cluster::tenancy::VC_NAMESPACE),
        json!({"metadata": {"name": "sleepy"}, "spec": {"clusterVersionName": "v1"}}),
    )
    .await?;
    let key = crds::naming::cluster_key_of(&vc).context("cluster key")?;
    create::<Namespace>(&super_client, None, json!({"metadata": {"name": key}})).await?;
    create::<Secret>(
        &super_client,
        Some(&key),
        json!({"metadata": {"name": "admin-kubeconfig"},
            "stringData": {"admin-kubeconfig": master.control_plane.apiserver().admin_kubeconfig()}}),
    )
    .await?;
    let set_phase = |phase: &'static str| {
        let (vcs, key) = (vcs.clone(), key.clone());
        async move {
            vcs.patch_status(
                "sleepy",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase, "clusterNamespace": key}})),
            )
            .await
        }
    };
    // As `kubectl vc pause` / `resume` patch it.
    let set_paused = |paused: bool| {
        let vcs = vcs.clone();
        async move {
            vcs.patch(
                "sleepy",
                &PatchParams::default(),
                &Patch::Merge(kubectl_vc::pause::patch(paused)),
            )
            .await
        }
    };
    set_phase("Running").await?;
    let syncer = start_syncer(&tenancy, config()).await?;
    tenant_synced(&tenancy, "sleepy", "True").await?;

    seed(master, "apps").await?;
    let client = master.client();
    let tenant_pods = Api::<Pod>::namespaced(client.clone(), "apps");
    let super_apps = crds::naming::super_namespace(&key, "apps");
    let super_pods = Api::<Pod>::namespaced(super_client.clone(), &super_apps);
    let running = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Running")
    };
    for name in ["web-1", "web-2"] {
        create::<Pod>(
            &client,
            Some("apps"),
            pod_json(name, json!({"app": "web"}), "busybox"),
        )
        .await?;
        until(&tenant_pods, name, &format!("{name} Running"), running).await?;
    }
    create::<Service>(
        &client,
        Some("apps"),
        json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}),
    )
    .await?;
    let super_services = Api::<Service>::namespaced(super_client.clone(), &super_apps);
    let service = until(&super_services, "web", "super Service", |s| s.is_some())
        .await?
        .context("super Service")?;
    let cluster_ip = service.spec.as_ref().and_then(|s| s.cluster_ip.clone());
    assert!(cluster_ip.is_some(), "{service:?}");
    let tenant_uids = uids(&tenant_pods).await?;
    let tenant_service_uid = Api::<Service>::namespaced(client.clone(), "apps")
        .get("web")
        .await?
        .uid();

    // Pause: the super pods go, the tenant is detached, nothing in the tenant changes.
    set_paused(true).await?;
    set_phase("Paused").await?;
    let vc = until(&vcs, "sleepy", "TenantSynced=False TenantPaused", |vc| {
        vc.and_then(|vc| vc.status.as_ref()).is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == wellknown::CONDITION_TENANT_SYNCED && c.reason == "TenantPaused")
        })
    })
    .await?
    .context("VirtualCluster")?;
    println!(
        "paused: {:?}",
        vc.status
            .as_ref()
            .map(|s| &s.conditions)
            .into_iter()
            .flatten()
            .find(|c| c.type_ == wellknown::CONDITION_TENANT_SYNCED)
    );
    wait::until_true(PATIENCE, "super pods removed", || async {
        super_pods
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await?;
    assert!(
        syncer.context.tenants.all().is_empty(),
        "a paused tenant stays attached"
    );
    // Health checks and patrols come and go (2 s and 3 s): nothing is recreated while paused.
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert!(super_pods.list(&ListParams::default()).await?.items.is_empty());
    assert_eq!(
        uids(&tenant_pods).await?,
        tenant_uids,
        "tenant pods changed during the pause"
    );
    let kept = super_services.get("web").await?;
    assert_eq!(kept.uid(), service.uid(), "the super Service was replaced");
    println!(
        "while paused: tenant pods {:?}, super pods 0, super Service web {:?}",
        tenant_uids.keys().collect::<Vec<_>>(),
        cluster_ip
    );

    // Resume: vc-manager brings the control plane back (Pending, then Running); the same pods return.
    set_paused(false).await?;
    set_phase("Pending").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        syncer.context.tenants.all().is_empty(),
        "attached before vc-manager said Running"
    );
    set_phase("Running").await?;
    tenant_synced(&tenancy, "sleepy", "True").await?;
    for (name, uid) in &tenant_uids {
        let copy = until(&super_pods, name, &format!("{name} recreated"), |p| p.is_some())
            .await?
            .context("super pod")?;
        assert_eq!(
            tenancy_annotation(&copy, "tenancy.x-k8s.io/uid"),
            Some(uid.as_str()),
            "{name} is a copy of another pod"
        );
        until(&super_pods, name, &format!("{name} Running again"), running).await?;
        // The copy prefers the node the tenant pod is bound to. Only a preference: the super scheduler's
        // other scores (spreading among them) may outweigh it, so where it lands is reported, not asserted.
        let tenant_node = tenant_pods.get(name).await?.spec.and_then(|s| s.node_name);
        let copy = super_pods.get(name).await?;
        let super_node = copy.spec.as_ref().and_then(|s| s.node_name.clone());
        let preferred = copy
            .spec
            .as_ref()
            .and_then(|s| s.affinity.as_ref())
            .and_then(|a| a.node_affinity.as_ref())
            .and_then(|n| n.preferred_during_scheduling_ignored_during_execution.as_ref())
            .and_then(|terms| terms.first())
            .and_then(|term| term.preference.match_fields.as_ref())
            .and_then(|fields| fields.first())
            .and_then(|field| field.values.clone());
        assert_eq!(
            preferred,
            tenant_node.clone().map(|node| vec![node]),
            "{name}'s copy does not prefer its node"
        );
        if super_node != tenant_node {
            eprintln!("{name}: recreated on {super_node:?}, not on its preferred node {tenant_node:?}");
        }
    }
    assert_eq!(
        uids(&tenant_pods).await?,
        tenant_uids,
        "tenant pods replaced on resume"
    );
    let after = super_services.get("web").await?;
    assert_eq!(after.spec.as_ref().and_then(|s| s.cluster_ip.clone()), cluster_ip);
    assert_eq!(
        Api::<Service>::namespaced(client.clone(), "apps")
            .get("web")
            .await?
            .uid(),
        tenant_service_uid
    );
    println!(
        "resumed: pods {:?} recreated for the same tenant uids, super Service web {:?}",
        tenant_uids.keys().collect::<Vec<_>>(),
        cluster_ip
    );
    Ok(())
}

/// Runs `kubectl vc` (the library, as the binary does) against `client`; returns stdout and stderr.
async fn kubectl_vc(client: &kube::Client, line: &str) -> anyhow::Result<(String, String)> {
    use clap::Parser;
    let args =
        kubectl_vc::Args::try_parse_from(std::iter::once("kubectl-vc").chain(line.split_whitespace()))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let streams = kubectl_vc::Streams::new(&mut out, &mut err, true);
    kubectl_vc::run_with(&args, client.clone(), streams, std::future::pending()).await?;
    Ok((String::from_utf8(out)?, String::from_utf8(err)?))
}

/// Names and uids of what the control plane keeps while paused: Secrets, Services and claims.
async fn kept(client: &kube::Client, root: &str) -> anyhow::Result<BTreeMap<String, String>> {
    let mut kept = BTreeMap::new();
    let params = ListParams::default();
    for s in Api::<Secret>::namespaced(client.clone(), root)
        .list(&params)
        .await?
        .items
    {
        kept.insert(format!("secret/{}", s.name_any()), s.uid().unwrap_or_default());
    }
    for s in Api::<Service>::namespaced(client.clone(), root)
        .list(&params)
        .await?
        .items
    {
        kept.insert(format!("service/{}", s.name_any()), s.uid().unwrap_or_default());
    }
    for c in Api::<PersistentVolumeClaim>::namespaced(client.clone(), root)
        .list(&params)
        .await?
        .items
    {
        kept.insert(format!("pvc/{}", c.name_any()), c.uid().unwrap_or_default());
    }
    Ok(kept)
}

#[tokio::test]
async fn a_paused_native_control_plane_scales_to_zero_keeps_its_state_and_comes_back() -> anyhow::Result<()> {
    if !local_cluster::require(
        "a_paused_native_control_plane_scales_to_zero_keeps_its_state_and_comes_back",
        NEEDS,
    ) {
        return Ok(());
    }
    Box::pin(native_pause()).await
}

async fn native_pause() -> anyhow::Result<()> {
    init_logging();
    let cluster = ControlPlane::start(ControlPlaneOptions::super_cluster()).await?;
    let client = cluster.client();
    local_cluster::install_crds(&client).await?;
    let _nodes = NodeSimulator::start(
        &cluster,
        NodeSimulatorOptions {
            kubelet: false,
            ..Default::default()
        },
    )
    .await?;
    let cv = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/clusterversion-clusterip.yaml"),
    )?;
    apply::apply_yaml(&client, &cv, "default").await?;
    create::<Namespace>(&client, None, json!({"metadata": {"name": "tenants"}})).await?;
    let _manager = RunningManager::start(client.clone(), fast_settings(), None).await?;
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), "tenants");
    create::<VirtualCluster>(
        &client,
        Some("tenants"),
        json!({"metadata": {"name": "nap"},
            "spec": {"clusterVersionName": "cv-v1-33-clusterip", "serviceCidr": "10.32.0.0/16"}}),
    )
    .await?;
    let running = |vc: &VirtualCluster| {
        vc.status.as_ref().and_then(|s| s.phase) == Some(crds::ClusterPhase::Running)
            && vc.status.as_ref().and_then(|s| s.observed_generation) == vc.metadata.generation
    };
    let vc = wait_vc(&vcs, "nap", Duration::from_secs(120), "Running", running).await?;
    let root = crds::naming::cluster_key_of(&vc).context("cluster key")?;
    let statefulsets = Api::<StatefulSet>::namespaced(client.clone(), &root);
    let pods = Api::<Pod>::namespaced(client.clone(), &root);
    let before = kept(&client, &root).await?;
    assert!(before.contains_key("secret/admin-kubeconfig") && before.contains_key("service/apiserver-svc"));

    let (out, err) = kubectl_vc(&client, "pause nap -n tenants --wait --timeout 2m").await?;
    println!("kubectl vc pause nap --wait\n{err}{out}");
    assert!(out.contains("tenants/nap is Paused"), "{out}");
    for sts in statefulsets.list(&ListParams::default()).await?.items {
        let spec = sts.spec.as_ref().and_then(|s| s.replicas);
        let ready = sts.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0);
        assert_eq!((spec, ready), (Some(0), 0), "{}", sts.name_any());
    }
    wait::until_true(Duration::from_secs(60), "control-plane pods gone", || async {
        pods.list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await?;
    let vc = vcs.get("nap").await?;
    assert_eq!(
        vc.status.as_ref().and_then(|s| s.phase),
        Some(crds::ClusterPhase::Paused)
    );
    let paused = condition(&vc, wellknown::CONDITION_PAUSED).context("Paused condition")?;
    assert_eq!(paused.status, "True");
    assert_eq!(
        condition(&vc, wellknown::CONDITION_READY).map(|c| c.status.as_str()),
        Some("False")
    );
    // A while later, after resyncs: still at zero, nothing deleted.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        kept(&client, &root).await?,
        before,
        "a paused control plane lost state"
    );
    assert!(
        statefulsets
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .all(|s| s.spec.as_ref().and_then(|s| s.replicas) == Some(0))
    );

    let (out, err) = kubectl_vc(&client, "resume nap -n tenants --wait --timeout 2m").await?;
    println!("kubectl vc resume nap --wait\n{err}{out}");
    assert!(out.contains("tenants/nap is Running"), "{out}");
    for sts in statefulsets.list(&ListParams::default()).await?.items {
        assert_eq!(
            sts.spec.as_ref().and_then(|s| s.replicas),
            Some(1),
            "{}",
            sts.name_any()
        );
        assert_eq!(
            sts.status.as_ref().and_then(|s| s.ready_replicas),
            Some(1),
            "{}",
            sts.name_any()
        );
    }
    let vc = vcs.get("nap").await?;
    let resumed = condition(&vc, wellknown::CONDITION_PAUSED).context("Paused condition")?;
    assert_eq!(
        (resumed.status.as_str(), resumed.reason.as_str()),
        ("False", "Resumed")
    );
    assert!(!vc.spec.paused);
    assert_eq!(kept(&client, &root).await?, before, "resuming replaced state");
    Ok(())
}

/// Whether the VirtualCluster's `TenantSynced` condition has `reason`.
fn synced_reason(vc: Option<&VirtualCluster>, reason: &str) -> bool {
    vc.and_then(|vc| vc.status.as_ref()).is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == wellknown::CONDITION_TENANT_SYNCED && c.reason == reason)
    })
}

#[tokio::test]
async fn a_native_tenant_on_real_nodes_pauses_quietly_and_resumes_with_the_same_pods() -> anyhow::Result<()> {
    const TEST: &str = "a_native_tenant_on_real_nodes_pauses_quietly_and_resumes_with_the_same_pods";
    let needs = [
        Binary::Etcd,
        Binary::KubeApiserver,
        Binary::KubeControllerManager,
        Binary::KubeScheduler,
    ];
    if !local_cluster::require(TEST, &needs) || !local_cluster::realnodes::require(TEST) {
        return Ok(());
    }
    Box::pin(native_real_pause()).await
}

async fn native_real_pause() -> anyhow::Result<()> {
    use local_cluster::sandbox::{NodeKind, Sandbox, SandboxOptions};
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        native_tenants: vec!["dozy".to_owned()],
        node_kind: NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;
    let super_client = sandbox.super_client();
    let kubeconfig = sandbox.tenant_kubeconfigs()["dozy"].clone();
    let client = local_cluster::client_from_kubeconfig_file(&kubeconfig).await?;
    let vcs: Api<VirtualCluster> =
        Api::namespaced(super_client.clone(), local_cluster::tenancy::VC_NAMESPACE);
    let vc = vcs.get("dozy").await?;
    let key = crds::naming::cluster_key_of(&vc).context("cluster key")?;

    let accounts = Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client.clone(), "default");
    until(&accounts, "default", "the default service account", |sa| {
        sa.is_some()
    })
    .await?;
    let tenant_pods = Api::<Pod>::namespaced(client.clone(), "default");
    create::<Pod>(
        &client,
        Some("default"),
        json!({"metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "busybox", "command": ["sleep", "3600"]}]}}),
    )
    .await?;
    let running = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()).and_then(|s| s.phase.as_deref()) == Some("Running")
    };
    wait::until_true(Duration::from_secs(120), "web Running", || async {
        running(tenant_pods.get_opt("web").await.ok().flatten().as_ref())
    })
    .await?;
    create::<Service>(
        &client,
        Some("default"),
        json!({"metadata": {"name": "web"}, "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}}),
    )
    .await?;
    let super_default = crds::naming::super_namespace(&key, "default");
    let super_pods = Api::<Pod>::namespaced(super_client.clone(), &super_default);
    let super_services = Api::<Service>::namespaced(super_client.clone(), &super_default);
    let service = until(&super_services, "web", "super Service", |s| s.is_some())
        .await?
        .context("super Service")?;
    let web_uid = tenant_pods.get("web").await?.uid();

    // Pause: the control plane and the pod stop; the syncer says so once and stays quiet.
    vcs.patch(
        "dozy",
        &PatchParams::default(),
        &Patch::Merge(kubectl_vc::pause::patch(true)),
    )
    .await?;
    wait::until_true(
        Duration::from_secs(120),
        "Paused with everything stopped",
        || async {
            vcs.get("dozy")
                .await
                .is_ok_and(|vc| kubectl_vc::pause::is_paused(&vc, vc.metadata.generation))
        },
    )
    .await?;
    wait::until_true(Duration::from_secs(60), "super pod gone", || async {
        super_pods.get_opt("web").await.is_ok_and(|p| p.is_none())
    })
    .await?;
    let root_pods = Api::<Pod>::namespaced(super_client.clone(), &key);
    wait::until_true(Duration::from_secs(120), "control-plane pods gone", || async {
        root_pods
            .list(&ListParams::default())
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await?;
    // The apiserver is gone: the syncer does not report it unreachable (it is not watching it).
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(synced_reason(vcs.get("dozy").await.ok().as_ref(), "TenantPaused"));
    assert!(
        super_pods.get_opt("web").await?.is_none(),
        "recreated while paused"
    );

    // Resume: same kubeconfig, same pod, same super Service.
    vcs.patch(
        "dozy",
        &PatchParams::default(),
        &Patch::Merge(kubectl_vc::pause::patch(false)),
    )
    .await?;
    wait::until_true(Duration::from_secs(180), "Running and synced again", || async {
        vcs.get("dozy").await.is_ok_and(|vc| {
            vc.status.as_ref().and_then(|s| s.phase) == Some(crds::ClusterPhase::Running)
                && synced_reason(Some(&vc), "TenantAttached")
        })
    })
    .await?;
    wait::until_true(
        Duration::from_secs(120),
        "web Running again in the super cluster",
        || async { running(super_pods.get_opt("web").await.ok().flatten().as_ref()) },
    )
    .await?;
    let copy = super_pods.get("web").await?;
    assert_eq!(
        tenancy_annotation(&copy, "tenancy.x-k8s.io/uid"),
        web_uid.as_deref(),
        "the copy is of another pod"
    );
    assert_eq!(
        tenant_pods.get("web").await?.uid(),
        web_uid,
        "the tenant pod was replaced"
    );
    let after = super_services.get("web").await?;
    assert_eq!(after.uid(), service.uid());
    assert_eq!(
        after.spec.and_then(|s| s.cluster_ip),
        service.spec.and_then(|s| s.cluster_ip)
    );
    Ok(())
}
