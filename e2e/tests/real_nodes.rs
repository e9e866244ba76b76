//! Real nodes of the harness: kubelets with containerd run pods that talk to each other across nodes,
//! through ClusterIP and NodePort Services and by cluster DNS names; `busybox` pulls as users type it; and
//! nothing is left on the host afterwards.

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::{
    Api,
    api::{AttachParams, LogParams, PostParams},
};
use local_cluster::{Binary, ControlPlane, ControlPlaneOptions, RealNodeOptions, RealNodes, realnodes, wait};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TEST: &str = "real_nodes_run_pods_across_nodes_services_and_dns";

fn pod(name: &str, node: &str, image: &str, script: &str, labels: &[(&str, &str)]) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<std::collections::BTreeMap<_, _>>() },
        "spec": {
            "nodeSelector": { "kubernetes.io/hostname": node },
            "terminationGracePeriodSeconds": 1,
            "containers": [{ "name": "main", "image": image, "command": ["sh", "-c", script] }],
        },
    }))?)
}

async fn running(api: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    let found = wait::until(Duration::from_secs(120), &format!("pod {name} Running"), || {
        let api = api.clone();
        async move {
            let pod = api.get(name).await.ok()?;
            (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
        }
    })
    .await;
    match found {
        Ok(pod) => Ok(pod),
        Err(error) => {
            let pod = api.get(name).await.ok();
            Err(anyhow::anyhow!(
                "{error}; status: {:?}",
                pod.and_then(|p| p.status)
            ))
        }
    }
}

async fn exec(api: &Api<Pod>, name: &str, command: &[&str]) -> anyhow::Result<String> {
    let mut attached = api
        .exec(name, command.to_vec(), &AttachParams::default().stderr(false))
        .await
        .with_context(|| format!("exec {command:?} in {name}"))?;
    let mut output = String::new();
    if let Some(mut stdout) = attached.stdout() {
        stdout.read_to_string(&mut output).await?;
    }
    attached.join().await?;
    Ok(output)
}

/// An HTTP GET from this machine, as a client outside the cluster would send it.
async fn http_get(address: &str) -> anyhow::Result<String> {
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(address)).await??;
    stream.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n").await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response)).await??;
    Ok(response)
}

#[tokio::test]
async fn real_nodes_run_pods_across_nodes_services_and_dns() -> anyhow::Result<()> {
    if !local_cluster::require(
        TEST,
        &[
            Binary::Etcd,
            Binary::KubeApiserver,
            Binary::KubeControllerManager,
            Binary::KubeScheduler,
        ],
    ) || !realnodes::require(TEST)
    {
        return Ok(());
    }
    let cluster = ControlPlane::start(ControlPlaneOptions::super_cluster().with_real_nodes()).await?;
    let nodes = RealNodes::start(&cluster, RealNodeOptions::default()).await?;
    let names = nodes.names();
    let client = cluster.client();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");

    // `kubectl run web --image=busybox`: no pull policy, so Always, pulled through the nodes' mirror.
    let server_script = "mkdir -p /www && echo hello-from-$(hostname) > /www/index.html && \
                         echo serving && exec httpd -f -p 8080 -h /www";
    pods.create(
        &PostParams::default(),
        &pod("server", &names[0], "busybox", server_script, &[("app", "web")])?,
    )
    .await?;
    pods.create(
        &PostParams::default(),
        &pod("client", &names[1], "busybox:latest", "exec sleep 3600", &[])?,
    )
    .await?;
    let server = running(&pods, "server").await?;
    running(&pods, "client").await?;
    let server_ip = server
        .status
        .and_then(|s| s.pod_ip)
        .context("the server pod has an IP")?;
    assert!(
        server_ip.starts_with("10.244.0."),
        "pod IP {server_ip} from node 0's range"
    );

    // Logs and exec go through the super apiserver to the real kubelet.
    let logs = wait::until(Duration::from_secs(30), "the server's log", || {
        let pods = pods.clone();
        async move {
            let logs = pods.logs("server", &LogParams::default()).await.ok()?;
            logs.contains("serving").then_some(logs)
        }
    })
    .await?;
    assert!(logs.contains("serving"));

    // Pod to pod across nodes.
    let page = exec(
        &pods,
        "client",
        &["wget", "-qO-", &format!("http://{server_ip}:8080/")],
    )
    .await?;
    assert_eq!(page.trim(), "hello-from-server");

    // A ClusterIP and NodePort Service through kube-proxy, by IP and by cluster DNS name.
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": "web" },
        "spec": { "type": "NodePort", "selector": { "app": "web" }, "ports": [{ "port": 80, "targetPort": 8080 }] },
    }))?;
    let service = Api::<Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &service)
        .await?;
    let spec = service.spec.context("service spec")?;
    let cluster_ip = spec.cluster_ip.context("cluster IP")?;
    let node_port = spec.ports.context("ports")?[0].node_port.context("node port")?;
    for target in [
        cluster_ip.clone(),
        "web".to_owned(),
        "web.default.svc.cluster.local".to_owned(),
    ] {
        let page = wait::until(
            Duration::from_secs(30),
            &format!("http://{target} from the client pod"),
            || {
                let pods = pods.clone();
                let target = target.clone();
                async move {
                    // (busybox 1.35's wget crashes on -T: the time limit comes from `timeout`.)
                    exec(
                        &pods,
                        "client",
                        &["timeout", "5", "wget", "-qO-", &format!("http://{target}/")],
                    )
                    .await
                    .ok()
                    .filter(|p| p.contains("hello"))
                }
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", nodes.log_tails(40)))?;
        assert_eq!(page.trim(), "hello-from-server", "through {target}");
    }
    // The host reaches the Service too: at its cluster IP, and at the NodePort of either node.
    let from_host = wait::until(
        Duration::from_secs(30),
        "the cluster IP from this machine",
        || {
            let address = format!("{cluster_ip}:80");
            async move { http_get(&address).await.ok().filter(|r| r.contains("hello")) }
        },
    )
    .await?;
    assert!(from_host.contains("hello-from-server"));
    for node in nodes.nodes() {
        let response = http_get(&format!("{}:{node_port}", node.ip())).await?;
        assert!(
            response.contains("hello-from-server"),
            "NodePort on {}",
            node.name()
        );
    }

    // Names outside the cluster's records do not exist.
    let missing = exec(
        &pods,
        "client",
        &["sh", "-c", "nslookup no-such-service.default.svc.cluster.local >/dev/null 2>&1 && echo found || echo missing"],
    )
    .await?;
    assert_eq!(missing.trim(), "missing");

    // Teardown leaves nothing on the host.
    let folders: Vec<_> = nodes.nodes().iter().map(|n| n.dir().to_path_buf()).collect();
    drop(nodes);
    drop(cluster);
    let leftovers = realnodes::host::leftovers(&folders);
    assert!(leftovers.is_empty(), "left on the host: {leftovers:#?}");
    Ok(())
}
