//! The harness itself: shared etcd, the controller-manager, simulated nodes and kubelets, and cleanup.

use std::{sync::Arc, time::Duration};

use anyhow::Context;
use k8s_openapi::api::{
    apps::v1::Deployment,
    core::v1::{ConfigMap, Namespace, Node, Pod},
};
use kube::{
    Api, ResourceExt,
    api::{DeleteParams, ListParams, LogParams, PostParams},
};
use local_cluster::{
    Binary, ControlPlane, ControlPlaneOptions, Etcd, NodeSimulator, NodeSimulatorOptions,
    nodes::{expected_log_lines, wait_pods_running},
    wait,
};

#[tokio::test]
async fn apiservers_sharing_an_etcd_stay_apart() -> anyhow::Result<()> {
    if !local_cluster::require(
        "apiservers_sharing_an_etcd_stay_apart",
        &[Binary::Etcd, Binary::KubeApiserver],
    ) {
        return Ok(());
    }
    let etcd = Arc::new(Etcd::start().await?);
    let (a, b) = tokio::try_join!(
        ControlPlane::start_on(etcd.clone(), ControlPlaneOptions::bare("tenant-a")),
        ControlPlane::start_on(etcd.clone(), ControlPlaneOptions::bare("tenant-b")),
    )?;
    let config_map = |name: &str| ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(a.client(), "default")
        .create(&PostParams::default(), &config_map("only-in-a"))
        .await?;
    Api::<ConfigMap>::namespaced(b.client(), "default")
        .create(&PostParams::default(), &config_map("only-in-b"))
        .await?;
    let names = |client: kube::Client| async move {
        let list = Api::<ConfigMap>::namespaced(client, "default")
            .list(&ListParams::default())
            .await?;
        anyhow::Ok(
            list.items
                .iter()
                .map(|c| c.name_any())
                .filter(|n| n.starts_with("only-"))
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(names(a.client()).await?, ["only-in-a"]);
    assert_eq!(names(b.client()).await?, ["only-in-b"]);
    // Each has its own CA: a's admin credentials are not accepted by b.
    assert_ne!(a.apiserver().ca().cert_pem(), b.apiserver().ca().cert_pem());

    // Stopping one leaves the other serving; restarting brings it back with its data.
    let mut a = a;
    a.apiserver_mut().stop();
    assert_eq!(names(b.client()).await?, ["only-in-b"]);
    a.apiserver_mut().restart().await?;
    assert_eq!(names(a.client()).await?, ["only-in-a"]);
    Ok(())
}

#[tokio::test]
async fn simulated_nodes_run_pods_and_serve_the_kubelet_api() -> anyhow::Result<()> {
    if !local_cluster::require(
        "simulated_nodes_run_pods_and_serve_the_kubelet_api",
        &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager],
    ) {
        return Ok(());
    }
    let cluster = ControlPlane::start(ControlPlaneOptions::super_cluster()).await?;
    let client = cluster.client();
    let simulator = NodeSimulator::start(
        &cluster,
        NodeSimulatorOptions {
            node_count: 3,
            ..Default::default()
        },
    )
    .await?;
    simulator.wait_ready(&client).await?;

    // Nodes are Ready with addresses, capacity and the kubelet port.
    let node = Api::<Node>::all(client.clone())
        .get(&simulator.nodes()[0])
        .await?;
    let status = node.status.context("node status")?;
    assert_eq!(status.addresses.context("addresses")?[0].address, "127.0.0.1");
    assert_eq!(status.capacity.context("capacity")?["cpu"].0, "64");
    let kubelet_port = status
        .daemon_endpoints
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port);
    assert_eq!(kubelet_port, simulator.kubelet().map(|k| i32::from(k.port())));

    // The controller-manager turns a Deployment into pods; the simulator binds and runs them.
    let namespace = "sim";
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?,
        )
        .await?;
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "replicas": 5,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "initContainers": [{"name": "init", "image": "busybox"}],
                    "containers": [{"name": "web", "image": "nginx"}, {"name": "sidecar", "image": "envoy"}]
                }
            }
        }
    }))?;
    Api::<Deployment>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &deployment)
        .await?;
    wait_pods_running(&client, namespace, 5, Duration::from_secs(60)).await?;
    let pods = Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    for pod in &pods.items {
        let status = pod.status.clone().context("pod status")?;
        assert!(
            status.pod_ip.as_deref().is_some_and(|ip| ip.starts_with("10.")),
            "pod IP of {}",
            pod.name_any()
        );
        assert_eq!(status.container_statuses.context("container statuses")?.len(), 2);
        assert!(
            simulator.nodes().contains(
                pod.spec
                    .as_ref()
                    .and_then(|s| s.node_name.as_ref())
                    .context("bound")?
            )
        );
    }
    // Pods spread over the nodes.
    let used: std::collections::HashSet<_> = pods
        .items
        .iter()
        .filter_map(|p| p.spec.as_ref()?.node_name.clone())
        .collect();
    assert!(used.len() > 1, "pods all landed on {used:?}");

    // `kubectl logs` goes apiserver -> simulated kubelet over TLS with the apiserver's kubelet client cert.
    let pod_name = pods.items[0].name_any();
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let logs = pods_api
        .logs(
            &pod_name,
            &LogParams {
                container: Some("web".into()),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(
        logs.lines().collect::<Vec<_>>(),
        expected_log_lines(namespace, &pod_name, "web")
    );
    let tail = pods_api
        .logs(
            &pod_name,
            &LogParams {
                container: Some("sidecar".into()),
                tail_lines: Some(2),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(tail.lines().count(), 2);
    assert!(
        pods_api
            .logs(
                &pod_name,
                &LogParams {
                    container: Some("missing".into()),
                    ..Default::default()
                }
            )
            .await
            .is_err()
    );

    // The kubelet API answers /pods and /stats/summary to a client with a certificate from a trusted CA.
    let kubelet = simulator.kubelet().context("kubelet API")?;
    let identity =
        cluster
            .apiserver()
            .ca()
            .issue("test-client", &[], &[], local_cluster::pki::Usage::Client)?;
    let https =
        local_cluster::http_client::HttpsClient::new(cluster.apiserver().ca().cert_pem(), Some(&identity))?;
    let (code, body) = https.get(&format!("{}/pods", kubelet.url())).await?;
    assert_eq!(code, 200);
    let listed: serde_json::Value = serde_json::from_str(&body)?;
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(5));
    let (code, body) = https.get(&format!("{}/stats/summary", kubelet.url())).await?;
    assert_eq!(code, 200);
    let summary: serde_json::Value = serde_json::from_str(&body)?;
    let uid = pods.items[0].uid().context("uid")?;
    let stats = summary["pods"]
        .as_array()
        .context("pods")?
        .iter()
        .find(|p| p["podRef"]["uid"] == uid)
        .context("pod stats")?;
    assert_eq!(
        stats["cpu"]["usageNanoCores"].as_u64(),
        Some(local_cluster::nodes::pod_usage(&uid).0)
    );
    // A client without a certificate is turned away at the handshake.
    let anonymous = local_cluster::http_client::HttpsClient::new(cluster.apiserver().ca().cert_pem(), None)?;
    assert!(anonymous.get(&format!("{}/pods", kubelet.url())).await.is_err());

    // Deleting pods completes as a kubelet would, and the Deployment replaces them.
    pods_api.delete(&pod_name, &DeleteParams::default()).await?;
    wait::until_true(Duration::from_secs(30), "deleted pod gone", || {
        let api = pods_api.clone();
        let name = pod_name.clone();
        async move { api.get_opt(&name).await.ok().flatten().is_none() }
    })
    .await?;
    wait_pods_running(&client, namespace, 5, Duration::from_secs(60)).await?;
    Ok(())
}

#[test]
fn no_process_or_folder_survives_a_panicking_test() {
    if !local_cluster::require(
        "no_process_or_folder_survives_a_panicking_test",
        &[Binary::Etcd, Binary::KubeApiserver],
    ) {
        return;
    }
    let (report_tx, report_rx) = std::sync::mpsc::channel();
    let outcome = std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().expect("runtime");
        runtime.block_on(async {
            let cluster = ControlPlane::start(ControlPlaneOptions::bare("doomed"))
                .await
                .expect("start");
            let pid = cluster.apiserver().process().pid().expect("apiserver pid");
            let etcd_pid = cluster.etcd().process().pid().expect("etcd pid");
            report_tx
                .send((pid, etcd_pid, cluster.apiserver().dir().to_owned()))
                .expect("report");
            panic!("a test failing with a control plane running");
        });
    })
    .join();
    assert!(outcome.is_err(), "the thread panicked");
    let (apiserver_pid, etcd_pid, dir) = report_rx.recv().expect("the control plane had started");
    for pid in [apiserver_pid, etcd_pid] {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        // Gone, or at most a zombie awaiting reaping.
        assert!(
            status.is_empty() || status.contains("State:\tZ"),
            "process {pid} still runs"
        );
    }
    assert!(!dir.exists(), "{} was left behind", dir.display());
}
