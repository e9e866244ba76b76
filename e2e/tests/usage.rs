//! What tenants consume: the syncer's usage figures (series, `status.usage`, `kubectl vc top`) against
//! what the simulated kubelets report through the super apiserver's node proxy, for a provisioned tenant
//! stand-in (its apiserver's request rate is measured too) next to an adopted tenant whose pods, claims
//! and Services must not count for it.

use std::{collections::BTreeMap, time::Duration};

use anyhow::Context as _;
use crds::{TenantUsage, VirtualCluster, quantity::parse_quantity, wellknown};
use k8s_openapi::api::{
    core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret, Service},
    storage::v1::StorageClass,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, ListParams, Patch, PatchParams},
};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions, VC_NAMESPACE},
    wait,
};
use serde_json::{Value, json};

use crate::{
    object_support::{create, syncer_series, until},
    syncer::{config, pod_json, seed, start_syncer, tenant_synced},
};

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager];
const PATIENCE: Duration = Duration::from_secs(90);

/// What the test creates in one tenant: its name, pods, claims (name, size) and Services (name, type,
/// ports).
type TenantObjects = (
    &'static str,
    usize,
    &'static [(&'static str, &'static str)],
    &'static [(&'static str, &'static str, &'static [i32])],
);

/// What the test expects of one tenant, computed from the super cluster and its kubelets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Expected {
    cpu_nano_cores: u64,
    memory_bytes: u64,
    pods: i64,
    claims: i64,
    storage_bytes: i64,
    load_balancers: i64,
    node_ports: i64,
}

/// The super pods of the tenant with cluster key `key`.
async fn super_pods_of(client: &Client, key: &str) -> anyhow::Result<Vec<Pod>> {
    Ok(Api::<Pod>::all(client.clone())
        .list(&ListParams::default().labels(wellknown::LABEL_VC_NAME))
        .await?
        .items
        .into_iter()
        .filter(|p| crds::tenant::owner_cluster(&p.metadata) == Some(key))
        .collect())
}

/// CPU and memory of the tenant's pods as the kubelets report them: each node's `/stats/summary` read
/// through the super apiserver's node proxy, each pod taken from the node it is bound to.
async fn kubelet_figures(client: &Client, pods: &[Pod]) -> anyhow::Result<(u64, u64)> {
    let mut summaries: BTreeMap<String, Value> = BTreeMap::new();
    let (mut cpu, mut memory) = (0, 0);
    for pod in pods {
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .context("a bound pod")?;
        if !summaries.contains_key(&node) {
            let request =
                http::Request::get(format!("/api/v1/nodes/{node}/proxy/stats/summary")).body(Vec::new())?;
            summaries.insert(node.clone(), client.request::<Value>(request).await?);
        }
        let uid = pod.uid().context("uid")?;
        let entry = summaries[&node]["pods"]
            .as_array()
            .context("pods in the summary")?
            .iter()
            .find(|e| e["podRef"]["uid"] == uid.as_str())
            .with_context(|| format!("pod {uid} in the summary of {node}"))?
            .clone();
        let pod_cpu = entry["cpu"]["usageNanoCores"].as_u64().context("cpu")?;
        let pod_memory = entry["memory"]["workingSetBytes"].as_u64().context("memory")?;
        // The simulated kubelet's figures are a function of the uid, so the summary is what it claims.
        assert_eq!((pod_cpu, pod_memory), local_cluster::nodes::pod_usage(&uid));
        cpu += pod_cpu;
        memory += pod_memory;
    }
    Ok((cpu, memory))
}

/// What the tenant holds, from the super cluster.
async fn expected(client: &Client, key: &str) -> anyhow::Result<Expected> {
    let pods = super_pods_of(client, key).await?;
    let (cpu_nano_cores, memory_bytes) = kubelet_figures(client, &pods).await?;
    let claims: Vec<PersistentVolumeClaim> = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| crds::tenant::owner_cluster(&c.metadata) == Some(key))
        .collect();
    let services: Vec<Service> = Api::<Service>::all(client.clone())
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|s| crds::tenant::owner_cluster(&s.metadata) == Some(key))
        .collect();
    let storage_bytes = claims
        .iter()
        .filter_map(|c| {
            c.spec
                .as_ref()?
                .resources
                .as_ref()?
                .requests
                .as_ref()?
                .get("storage")
                .cloned()
        })
        .filter_map(|q| parse_quantity(&q.0, 1.0))
        .sum();
    let spec_type = |s: &Service| s.spec.as_ref().and_then(|s| s.type_.clone()).unwrap_or_default();
    Ok(Expected {
        cpu_nano_cores,
        memory_bytes,
        pods: pods.len() as i64,
        claims: claims.len() as i64,
        storage_bytes,
        load_balancers: services.iter().filter(|s| spec_type(s) == "LoadBalancer").count() as i64,
        node_ports: services
            .iter()
            .flat_map(|s| s.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default())
            .filter(|p| p.node_port.is_some())
            .count() as i64,
    })
}

/// Whether `status.usage` shows exactly `expected`.
fn shows(usage: &TenantUsage, expected: &Expected) -> bool {
    let quantity = |q: &Option<k8s_openapi::apimachinery::pkg::api::resource::Quantity>, scale| {
        q.as_ref().and_then(|q| parse_quantity(&q.0, scale))
    };
    usage.cpu.as_ref().and_then(kubectl_vc::top::thousandths)
        == Some(((expected.cpu_nano_cores + 500_000) / 1_000_000) as i64)
        && quantity(&usage.memory, 1.0) == Some(expected.memory_bytes as i64)
        && usage.pods == Some(expected.pods)
        && usage.measured_pods == Some(expected.pods)
        && usage.persistent_volume_claims == Some(expected.claims)
        && quantity(&usage.storage, 1.0) == Some(expected.storage_bytes)
        && usage.load_balancers == Some(expected.load_balancers)
        && usage.node_ports == Some(expected.node_ports)
}

/// Runs `kubectl vc` against the super cluster; returns stdout.
async fn kubectl_vc(client: &Client, args: &[&str]) -> anyhow::Result<String> {
    let args: kubectl_vc::Args =
        clap::Parser::try_parse_from(std::iter::once("kubectl-vc").chain(args.iter().copied()))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    kubectl_vc::run(&args, client.clone(), &mut out, &mut err).await?;
    Ok(String::from_utf8(out)?)
}

/// An IPv4 address of this machine that is not loopback: the source address of a route out (nothing is
/// sent).
fn machine_address() -> Option<std::net::IpAddr> {
    let socket = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    socket.connect("203.0.113.1:9").ok()?;
    let address = socket.local_addr().ok()?.ip();
    (!address.is_loopback() && !address.is_unspecified()).then_some(address)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn usage_matches_what_the_kubelets_report_per_tenant() -> anyhow::Result<()> {
    if !local_cluster::require("usage_matches_what_the_kubelets_report_per_tenant", NEEDS) {
        return Ok(());
    }
    // The super apiserver's node proxy refuses loopback addresses: the simulated kubelet listens on one
    // of the machine's own.
    let Some(address) = machine_address() else {
        local_cluster::skip(
            "usage_matches_what_the_kubelets_report_per_tenant",
            "this machine has no non-loopback IPv4 address for the simulated kubelet (the node proxy refuses loopback)",
        );
        return Ok(());
    };
    let mut tenancy = Tenancy::start(TenancyOptions {
        tenants: 0,
        kubelet_address: Some(address),
        ..Default::default()
    })
    .await?;
    let super_client = tenancy.super_client();
    let vcs: Api<VirtualCluster> = Api::namespaced(super_client.clone(), VC_NAMESPACE);

    // "metered": a provisioned tenant stand-in (a tenant master registered as vc-manager registers one, so
    // the syncer reads its apiserver's request counter); "other": an adopted tenant next to it.
    tenancy.add_tenant("master", Default::default()).await?;
    vcs.delete("master", &DeleteParams::default()).await?;
    until(&vcs, "master", "adopted VirtualCluster gone", |vc| vc.is_none()).await?;
    let vc = create::<VirtualCluster>(
        &super_client,
        Some(VC_NAMESPACE),
        json!({"metadata": {"name": "metered"}, "spec": {"clusterVersionName": "v1"}}),
    )
    .await?;
    let key = crds::naming::cluster_key_of(&vc).context("cluster key")?;
    create::<Namespace>(&super_client, None, json!({"metadata": {"name": key}})).await?;
    create::<Secret>(
        &super_client,
        Some(&key),
        json!({"metadata": {"name": "admin-kubeconfig"},
            "stringData": {"admin-kubeconfig": tenancy.tenant("master").control_plane.apiserver().admin_kubeconfig()}}),
    )
    .await?;
    vcs.patch_status(
        "metered",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Running", "clusterNamespace": key}})),
    )
    .await?;
    tenancy.add_tenant("other", Default::default()).await?;
    let other_key = tenancy.tenant("other").cluster_key.clone();

    let mut syncer_config = config();
    syncer_config.usage.interval = Some(Duration::from_secs(2));
    syncer_config.usage.status_interval = Duration::from_secs(2);
    let syncer = start_syncer(&tenancy, syncer_config).await?;
    tenant_synced(&tenancy, "metered", "True").await?;
    tenant_synced(&tenancy, "other", "True").await?;
    create::<StorageClass>(&super_client, None, json!({"metadata": {"name": "fast", "labels": {(wellknown::LABEL_SUPER_PUBLIC): "true"}}, "provisioner": "example.com/fast"})).await?;

    // Pods, claims and Services in both tenants; the other tenant holds more of everything.
    let claim = |name: &str, size: &str| json!({"metadata": {"name": name}, "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "resources": {"requests": {"storage": size}}}});
    let service = |name: &str, type_: &str, ports: &[i32]| {
        let ports: Vec<Value> = ports
            .iter()
            .map(|p| json!({"name": format!("p{p}"), "port": p}))
            .collect();
        json!({"metadata": {"name": name}, "spec": {"type": type_, "selector": {"app": "web"}, "ports": ports}})
    };
    let plan: [TenantObjects; 2] = [
        (
            "master",
            3,
            &[("data", "1Gi"), ("scratch", "512Mi")],
            &[
                ("public", "LoadBalancer", &[80, 443]),
                ("admin", "NodePort", &[8443]),
                ("internal", "ClusterIP", &[80]),
            ],
        ),
        (
            "other",
            4,
            &[("big", "100Gi")],
            &[("edge", "LoadBalancer", &[80]), ("ops", "NodePort", &[22, 23])],
        ),
    ];
    for (tenant, pods, claims, services) in plan {
        let tenant = tenancy.tenant(tenant);
        seed(tenant, "apps").await?;
        let client = tenant.client();
        for i in 0..pods {
            create::<Pod>(
                &client,
                Some("apps"),
                pod_json(&format!("web-{i}"), json!({"app": "web"}), "nginx:1"),
            )
            .await?;
        }
        for (name, size) in claims {
            create::<PersistentVolumeClaim>(&client, Some("apps"), claim(name, size)).await?;
        }
        for (name, type_, ports) in services {
            create::<Service>(&client, Some("apps"), service(name, type_, ports)).await?;
        }
    }

    // Every super pod Running and bound, claims and node-port Services in the super cluster.
    for (tenant_key, pods, claims, node_ports) in [(&key, 3, 2, 3), (&other_key, 4, 1, 3)] {
        wait::until(PATIENCE, &format!("{tenant_key}: super objects in place"), || {
            let client = super_client.clone();
            async move {
                let running = super_pods_of(&client, tenant_key)
                    .await
                    .ok()?
                    .iter()
                    .filter(|p| {
                        p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
                            && p.spec.as_ref().is_some_and(|s| s.node_name.is_some())
                    })
                    .count();
                let held = expected(&client, tenant_key).await.ok()?;
                (running == pods
                    && held.pods == pods as i64
                    && held.claims == claims
                    && held.node_ports == node_ports)
                    .then_some(())
            }
        })
        .await?;
    }
    let metered = expected(&super_client, &key).await?;
    let other = expected(&super_client, &other_key).await?;
    eprintln!("expected figures: metered {metered:?}, other {other:?}");
    assert_eq!(
        (
            metered.pods,
            metered.claims,
            metered.storage_bytes,
            metered.load_balancers,
            metered.node_ports
        ),
        (3, 2, 1536 << 20, 1, 3)
    );
    assert_eq!(
        (other.pods, other.claims, other.load_balancers, other.node_ports),
        (4, 1, 1, 3)
    );

    // status.usage shows exactly the metered tenant's own figures (and the apiserver's request rate once
    // it has been read twice); the other tenant's shows its own.
    let vc = match until(&vcs, "metered", "status.usage of metered", |vc| {
        vc.and_then(|vc| vc.status.as_ref()?.usage.as_ref())
            .is_some_and(|u| shows(u, &metered) && u.apiserver_requests_per_second.is_some())
    })
    .await
    {
        Ok(vc) => vc.context("metered")?,
        Err(error) => {
            let seen = vcs.get("metered").await?.status.and_then(|s| s.usage);
            let now = expected(&super_client, &key).await?;
            anyhow::bail!("{error}: status.usage {seen:?}, expected {metered:?}, now {now:?}");
        }
    };
    let usage = vc.status.and_then(|s| s.usage).context("usage")?;
    eprintln!("status.usage of metered: {}", serde_json::to_string(&usage)?);
    let requests = kubectl_vc::top::thousandths(&usage.apiserver_requests_per_second.context("rate")?)
        .context("rate quantity")?;
    assert!(requests > 0, "the syncer's own watches and reads make requests");
    let other_vc = match until(&vcs, "other", "status.usage of other", |vc| {
        vc.and_then(|vc| vc.status.as_ref()?.usage.as_ref())
            .is_some_and(|u| shows(u, &other))
    })
    .await
    {
        Ok(vc) => vc.context("other")?,
        Err(error) => {
            let seen = vcs.get("other").await?.status.and_then(|s| s.usage);
            let now = expected(&super_client, &other_key).await?;
            anyhow::bail!("{error}: status.usage {seen:?}, expected {other:?}, now {now:?}");
        }
    };
    let other_usage = other_vc.status.and_then(|s| s.usage).context("usage")?;
    assert_eq!(
        other_usage.apiserver_requests_per_second, None,
        "an adopted tenant's apiserver is not the platform's to meter"
    );

    // The series say the same, per tenant.
    let series = syncer_series(&syncer)?;
    let value = |name: &str, vc: &str| -> anyhow::Result<f64> {
        series
            .get(&format!("syncer_{name}{{tenant=\"{VC_NAMESPACE}/{vc}\"}}"))
            .copied()
            .with_context(|| format!("series {name} of {vc} in {series:#?}"))
    };
    for (vc, figures) in [("metered", &metered), ("other", &other)] {
        assert_eq!(
            value("tenant_cpu_usage_cores", vc)?,
            figures.cpu_nano_cores as f64 / 1e9,
            "{vc}"
        );
        assert_eq!(
            value("tenant_memory_working_set_bytes", vc)?,
            figures.memory_bytes as f64,
            "{vc}"
        );
        assert_eq!(value("tenant_measured_pods", vc)?, figures.pods as f64, "{vc}");
        assert_eq!(
            value("tenant_persistentvolumeclaims", vc)?,
            figures.claims as f64,
            "{vc}"
        );
        assert_eq!(
            value("tenant_storage_requests_bytes", vc)?,
            figures.storage_bytes as f64,
            "{vc}"
        );
        assert_eq!(
            value("tenant_load_balancers", vc)?,
            figures.load_balancers as f64,
            "{vc}"
        );
        assert_eq!(value("tenant_node_ports", vc)?, figures.node_ports as f64, "{vc}");
    }
    assert!(value("tenant_apiserver_requests_total", "metered")? > 0.0);
    assert!(value("tenant_apiserver_requests_total", "other").is_err());

    // kubectl vc top prints the same figures.
    let top = kubectl_vc(&super_client, &["top", "-n", VC_NAMESPACE]).await?;
    eprintln!("$ kubectl vc top -n {VC_NAMESPACE}\n{top}");
    let row = |vc: &str| -> anyhow::Result<Vec<String>> {
        top.lines()
            .find(|l| l.split_whitespace().next() == Some(vc))
            .map(|l| l.split_whitespace().map(str::to_owned).collect())
            .with_context(|| format!("{vc} in {top}"))
    };
    let expected_row = |figures: &Expected| -> Vec<String> {
        vec![
            format!("{}m", (figures.cpu_nano_cores + 500_000) / 1_000_000),
            format!("{}Mi", figures.memory_bytes >> 20),
            figures.pods.to_string(),
            kubectl_vc::usage::format_memory(figures.storage_bytes),
            figures.load_balancers.to_string(),
            figures.node_ports.to_string(),
        ]
    };
    assert_eq!(row("metered")?[1..7], expected_row(&metered)[..]);
    assert_eq!(row("other")?[1..7], expected_row(&other)[..]);
    assert_eq!(row("other")?[7], "-");
    let document: Value =
        serde_json::from_str(&kubectl_vc(&super_client, &["top", "metered", "-o", "json"]).await?)?;
    assert_eq!(
        document["virtualClusters"][0]["usage"]["pods"],
        json!(metered.pods)
    );

    // A tenant that goes away takes its series with it.
    vcs.delete("other", &DeleteParams::default()).await?;
    wait::until(PATIENCE, "the other tenant's series removed", || {
        let syncer = &syncer;
        async move {
            let series = syncer_series(syncer).ok()?;
            (!series
                .keys()
                .any(|k| k.contains(&format!("tenant=\"{VC_NAMESPACE}/other\""))))
            .then_some(())
        }
    })
    .await?;
    Ok(())
}
