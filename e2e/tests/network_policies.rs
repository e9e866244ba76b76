//! NetworkPolicies enforced on real nodes ([`local_cluster::realnodes::policy`]): default deny, an allow
//! by namespace, a port rule by name, an egress `ipBlock` with `except` that keeps pods from the super
//! cluster's DNS on the host (the shape of the platform's own isolation policies), and traffic restored
//! when the policies go. Every change is awaited by polling what pods can reach, never by sleeping.

use std::{future::Future, time::Duration};

use anyhow::Context;
use k8s_openapi::api::{
    core::v1::{Namespace, Pod, Service},
    networking::v1::NetworkPolicy,
};
use kube::{
    Api, Client,
    api::{AttachParams, DeleteParams, Patch, PatchParams, PostParams},
};
use local_cluster::{
    Binary, ControlPlane, ControlPlaneOptions, RealNodeOptions, RealNodes,
    realnodes::{self, host::HOST_DNS_IP},
    wait,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TEST: &str = "network_policies_are_enforced_on_real_nodes";
const SERVER_NS: &str = "np-server";
const CLIENT_NS: &str = "np-client";
const OTHER_NS: &str = "np-other";
/// How long a policy change may take to show in traffic (the enforcer needs well under two seconds).
const CHANGE: Duration = Duration::from_secs(30);

fn pod(name: &str, node: &str, script: &str, extra: serde_json::Value) -> anyhow::Result<Pod> {
    let mut container =
        serde_json::json!({ "name": "main", "image": "busybox", "command": ["sh", "-c", script] });
    if let (Some(container), Some(extra)) = (container.as_object_mut(), extra.as_object()) {
        container.extend(extra.clone());
    }
    Ok(serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "labels": { "app": name } },
        "spec": {
            "nodeSelector": { "kubernetes.io/hostname": node },
            "terminationGracePeriodSeconds": 1,
            "containers": [container],
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
    found.map_err(|e| anyhow::anyhow!("{e}"))
}

/// Runs `script` in a pod's container and returns what it printed.
async fn exec(client: &Client, namespace: &str, pod: &str, script: &str) -> anyhow::Result<String> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let mut attached = api
        .exec(pod, ["sh", "-c", script], &AttachParams::default().stderr(false))
        .await
        .with_context(|| format!("exec in {namespace}/{pod}"))?;
    let mut output = String::new();
    if let Some(mut stdout) = attached.stdout() {
        stdout.read_to_string(&mut output).await?;
    }
    attached.join().await?;
    Ok(output)
}

/// Whether the pod gets the server's page at `url`; an error when the answer is neither the page nor a
/// failure to connect (the exec itself failed).
async fn reaches(client: &Client, namespace: &str, pod: &str, url: &str) -> anyhow::Result<bool> {
    // (busybox's wget crashes on -T: the time limit comes from `timeout`.)
    let output = exec(
        client,
        namespace,
        pod,
        &format!("timeout 3 wget -qO- {url} 2>/dev/null || echo BLOCKED"),
    )
    .await?;
    match (output.contains("hello"), output.contains("BLOCKED")) {
        (true, _) => Ok(true),
        (false, true) => Ok(false),
        (false, false) => anyhow::bail!("{namespace}/{pod} got {output:?} from {url}"),
    }
}

/// Whether the super cluster's DNS on the host answers the pod.
async fn resolves(client: &Client, namespace: &str, pod: &str) -> anyhow::Result<bool> {
    let output = exec(
        client,
        namespace,
        pod,
        &format!(
            "timeout 3 nslookup kubernetes.default.svc.cluster.local {HOST_DNS_IP} >/dev/null 2>&1 \
             && echo RESOLVED || echo UNANSWERED"
        ),
    )
    .await?;
    match (output.contains("RESOLVED"), output.contains("UNANSWERED")) {
        (true, _) => Ok(true),
        (false, true) => Ok(false),
        _ => anyhow::bail!("{namespace}/{pod}: nslookup printed {output:?}"),
    }
}

/// Whether this machine (the host, `10.243.0.1` to the nodes: neither a pod nor the pod's node) gets the
/// page at `address`.
async fn host_reaches(address: &str) -> anyhow::Result<bool> {
    let connect = tokio::time::timeout(Duration::from_secs(3), tokio::net::TcpStream::connect(address)).await;
    let Ok(Ok(mut stream)) = connect else {
        return Ok(false);
    };
    stream.write_all(b"GET / HTTP/1.0\r\nHost: test\r\n\r\n").await?;
    let mut response = String::new();
    tokio::time::timeout(Duration::from_secs(3), stream.read_to_string(&mut response)).await??;
    Ok(response.contains("hello"))
}

async fn client_to(client: &Client, url: &str) -> anyhow::Result<bool> {
    reaches(client, CLIENT_NS, "client", url).await
}

async fn neighbour_to(client: &Client, url: &str) -> anyhow::Result<bool> {
    reaches(client, OTHER_NS, "neighbour", url).await
}

fn word(allowed: bool) -> &'static str {
    if allowed { "allowed" } else { "blocked" }
}

/// Polls `check` until it says `want`, and prints how long that took.
async fn becomes<F, Fut>(what: &str, want: bool, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<bool>>,
{
    let started = std::time::Instant::now();
    wait::until(CHANGE, &format!("{what} {}", word(want)), || {
        let check = check();
        async move { (check.await.ok()? == want).then_some(()) }
    })
    .await?;
    eprintln!(
        "{what}: {} after {:.1} s",
        word(want),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Checks once that `check` says `want` (after a change was seen to take effect elsewhere).
async fn is(what: &str, want: bool, check: impl Future<Output = anyhow::Result<bool>>) -> anyhow::Result<()> {
    let got = check.await?;
    anyhow::ensure!(got == want, "{what}: {} but should be {}", word(got), word(want));
    Ok(())
}

async fn apply_policy(client: &Client, namespace: &str, policy: serde_json::Value) -> anyhow::Result<()> {
    let policy: NetworkPolicy = serde_json::from_value(policy)?;
    let name = policy.metadata.name.clone().context("policy name")?;
    Api::<NetworkPolicy>::namespaced(client.clone(), namespace)
        .patch(&name, &PatchParams::apply("e2e").force(), &Patch::Apply(&policy))
        .await
        .with_context(|| format!("applying NetworkPolicy {namespace}/{name}"))?;
    Ok(())
}

/// The server's Ready condition: its status and when it last changed.
async fn readiness(pods: &Api<Pod>) -> anyhow::Result<(String, String)> {
    let pod = pods.get("server").await?;
    let ready = pod
        .status
        .and_then(|s| s.conditions)
        .into_iter()
        .flatten()
        .find(|c| c.type_ == "Ready")
        .context("a Ready condition")?;
    Ok((
        ready.status,
        ready
            .last_transition_time
            .map(|t| t.0.to_string())
            .unwrap_or_default(),
    ))
}

#[tokio::test]
async fn network_policies_are_enforced_on_real_nodes() -> anyhow::Result<()> {
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
    let nodes = RealNodes::start(
        &cluster,
        RealNodeOptions {
            network_policies: true,
            ..Default::default()
        },
    )
    .await?;
    let names = nodes.names();
    let client = cluster.client();
    let result = scenario(&client, &names).await;
    if result.is_err() {
        eprintln!("{}", nodes.log_tails(20));
    }
    result?;

    let folders: Vec<_> = nodes.nodes().iter().map(|n| n.dir().to_path_buf()).collect();
    drop(nodes);
    drop(cluster);
    let leftovers = realnodes::host::leftovers(&folders);
    assert!(leftovers.is_empty(), "left on the host: {leftovers:#?}");
    Ok(())
}

async fn scenario(client: &Client, names: &[String]) -> anyhow::Result<()> {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    for (name, team) in [(SERVER_NS, "server"), (CLIENT_NS, "client"), (OTHER_NS, "other")] {
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": name, "labels": { "team": team } },
        }))?;
        namespaces.create(&PostParams::default(), &namespace).await?;
    }
    // The server on node 0 with two ports; the kubelet probes one of them every second.
    let server_script = "mkdir -p /www && echo hello > /www/index.html && httpd -p 8080 -h /www && \
                         exec httpd -f -p 8081 -h /www";
    let server = pod(
        "server",
        &names[0],
        server_script,
        serde_json::json!({
            "ports": [{ "name": "http", "containerPort": 8080 }, { "name": "alt", "containerPort": 8081 }],
            "readinessProbe": {
                "httpGet": { "port": "http", "path": "/" },
                "periodSeconds": 1,
                "failureThreshold": 1,
            },
        }),
    )?;
    let server_pods: Api<Pod> = Api::namespaced(client.clone(), SERVER_NS);
    server_pods.create(&PostParams::default(), &server).await?;
    // A client in another namespace on the other node, and a neighbour in a third namespace on the
    // server's node (pod to pod over one bridge).
    Api::<Pod>::namespaced(client.clone(), CLIENT_NS)
        .create(
            &PostParams::default(),
            &pod("client", &names[1], "exec sleep 3600", serde_json::json!({}))?,
        )
        .await?;
    Api::<Pod>::namespaced(client.clone(), OTHER_NS)
        .create(
            &PostParams::default(),
            &pod("neighbour", &names[0], "exec sleep 3600", serde_json::json!({}))?,
        )
        .await?;
    let server_ip = running(&server_pods, "server")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("the server's address")?;
    running(&Api::namespaced(client.clone(), CLIENT_NS), "client").await?;
    running(&Api::namespaced(client.clone(), OTHER_NS), "neighbour").await?;
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "web" },
        "spec": { "selector": { "app": "server" }, "ports": [{ "port": 80, "targetPort": "http" }] },
    }))?;
    let service = Api::<Service>::namespaced(client.clone(), SERVER_NS)
        .create(&PostParams::default(), &service)
        .await?;
    let cluster_ip = service
        .spec
        .and_then(|s| s.cluster_ip)
        .context("the Service's cluster IP")?;

    let http = format!("http://{server_ip}:8080/");
    let alt = format!("http://{server_ip}:8081/");
    let via_service = format!("http://{cluster_ip}/");
    let host_address = format!("{server_ip}:8080");

    // Without policies everything reaches everything.
    becomes("client → server:8080", true, || client_to(client, &http)).await?;
    becomes("client → Service → server", true, || {
        client_to(client, &via_service)
    })
    .await?;
    is("client → server:8081", true, client_to(client, &alt)).await?;
    is("neighbour → server:8080", true, neighbour_to(client, &http)).await?;
    is("host → server:8080", true, host_reaches(&host_address)).await?;
    is("client → super DNS", true, resolves(client, CLIENT_NS, "client")).await?;
    let ready_before = wait::until(Duration::from_secs(60), "the server Ready", || async {
        readiness(&server_pods).await.ok().filter(|r| r.0 == "True")
    })
    .await?;

    // Default deny for ingress in the server's namespace.
    apply_policy(
        client,
        SERVER_NS,
        serde_json::json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": { "name": "default-deny-ingress" },
            "spec": { "podSelector": {}, "policyTypes": ["Ingress"] },
        }),
    )
    .await?;
    becomes(
        "default deny: client (other namespace, other node) → server:8080",
        false,
        || client_to(client, &http),
    )
    .await?;
    is(
        "default deny: client → Service → server",
        false,
        client_to(client, &via_service),
    )
    .await?;
    is(
        "default deny: neighbour (same node) → server:8080",
        false,
        neighbour_to(client, &http),
    )
    .await?;
    is(
        "default deny: host → server:8080",
        false,
        host_reaches(&host_address),
    )
    .await?;
    is(
        "default deny: the client's own egress",
        true,
        resolves(client, CLIENT_NS, "client"),
    )
    .await?;

    // An allow by namespace opens it for the client's namespace alone, on every port.
    let allow_clients = |ports: serde_json::Value| {
        let mut rule =
            serde_json::json!({ "from": [{ "namespaceSelector": { "matchLabels": { "team": "client" } } }] });
        if !ports.is_null() {
            rule["ports"] = ports;
        }
        serde_json::json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": { "name": "allow-clients" },
            "spec": {
                "podSelector": { "matchLabels": { "app": "server" } },
                "policyTypes": ["Ingress"],
                "ingress": [rule],
            },
        })
    };
    apply_policy(client, SERVER_NS, allow_clients(serde_json::Value::Null)).await?;
    becomes("namespaceSelector allow: client → server:8080", true, || {
        client_to(client, &http)
    })
    .await?;
    is(
        "namespaceSelector allow: client → server:8081",
        true,
        client_to(client, &alt),
    )
    .await?;
    is(
        "namespaceSelector allow: client → Service → server",
        true,
        client_to(client, &via_service),
    )
    .await?;
    is(
        "namespaceSelector allow: neighbour → server:8080",
        false,
        neighbour_to(client, &http),
    )
    .await?;

    // A port rule (the server's port named `http`) opens that port only.
    apply_policy(
        client,
        SERVER_NS,
        allow_clients(serde_json::json!([{ "port": "http" }])),
    )
    .await?;
    becomes("port rule: client → server:8081", false, || {
        client_to(client, &alt)
    })
    .await?;
    is("port rule: client → server:8080", true, client_to(client, &http)).await?;

    // Egress anywhere but the host: the client's queries to the super cluster's DNS get no answer, its
    // other traffic goes on; a pod the policy does not select still resolves.
    apply_policy(
        client,
        CLIENT_NS,
        serde_json::json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": { "name": "no-super-dns" },
            "spec": {
                "podSelector": {},
                "policyTypes": ["Egress"],
                "egress": [{ "to": [{ "ipBlock": { "cidr": "0.0.0.0/0", "except": [format!("{HOST_DNS_IP}/32")] } }] }],
            },
        }),
    )
    .await?;
    becomes("egress except the super DNS: client → super DNS", false, || {
        resolves(client, CLIENT_NS, "client")
    })
    .await?;
    is(
        "egress except the host: client → server:8080",
        true,
        client_to(client, &http),
    )
    .await?;
    is(
        "egress except the host: client → Service → server",
        true,
        client_to(client, &via_service),
    )
    .await?;
    is(
        "egress except the host: neighbour → super DNS",
        true,
        resolves(client, OTHER_NS, "neighbour"),
    )
    .await?;

    // The kubelet's probes come from the server's own node, which policies never block.
    let ready_after = readiness(&server_pods).await?;
    anyhow::ensure!(
        ready_after == ready_before,
        "the server stayed Ready throughout (kubelet probes pass): before {ready_before:?}, after {ready_after:?}"
    );

    // Without the policies, traffic is as before.
    for (namespace, name) in [
        (SERVER_NS, "default-deny-ingress"),
        (SERVER_NS, "allow-clients"),
        (CLIENT_NS, "no-super-dns"),
    ] {
        Api::<NetworkPolicy>::namespaced(client.clone(), namespace)
            .delete(name, &DeleteParams::default())
            .await?;
    }
    becomes("policies removed: client → server:8081", true, || {
        client_to(client, &alt)
    })
    .await?;
    becomes("policies removed: client → super DNS", true, || {
        resolves(client, CLIENT_NS, "client")
    })
    .await?;
    becomes("policies removed: neighbour → server:8080", true, || {
        neighbour_to(client, &http)
    })
    .await?;
    becomes("policies removed: host → server:8080", true, || {
        host_reaches(&host_address)
    })
    .await?;
    is(
        "policies removed: client → Service → server",
        true,
        client_to(client, &via_service),
    )
    .await?;
    Ok(())
}
