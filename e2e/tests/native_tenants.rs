//! Native tenants on real nodes: vc-manager provisions the `examples/` ClusterVersion, its etcd, apiserver
//! and controller-manager containers boot from the generated Secrets, the syncer attaches, and a tenant's
//! `kubectl run` starts a real container whose logs, exec, attach and port-forward go through vn-agent to
//! the real kubelet, and whose service-account token talks to the tenant apiserver.

use std::{path::Path, process::Stdio, time::Duration};

use anyhow::Context;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use local_cluster::{
    Binary, realnodes,
    sandbox::{NodeKind, Sandbox, SandboxOptions},
    wait,
};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};

pub(crate) const NEEDS: &[Binary] = &[
    Binary::Etcd,
    Binary::KubeApiserver,
    Binary::KubeControllerManager,
    Binary::KubeScheduler,
    Binary::Kubectl,
];

/// A kubectl command for `kubeconfig`, with its discovery cache beside the kubeconfig: the default one
/// under `~/.kube/cache` is keyed by host and port, and native tenants of earlier runs had the same
/// cluster IPs.
pub(crate) fn kubectl_command(kubeconfig: &Path) -> anyhow::Result<tokio::process::Command> {
    let mut command = tokio::process::Command::new(local_cluster::locate(Binary::Kubectl)?);
    command
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!(
            "--cache-dir={}",
            kubeconfig.with_extension("kubectl-cache").display()
        ));
    Ok(command)
}

/// kubectl with a kubeconfig; fails with its stderr.
pub(crate) async fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = kubectl_command(kubeconfig)?
        .args(args)
        .stdin(Stdio::null())
        .output()
        .await?;
    anyhow::ensure!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Service account `default/robot` with the `view` cluster role, and a kubeconfig beside `admin` (same
/// server and CA) that authenticates with a one-hour token of it: a client like the tenant's own programs.
pub(crate) async fn viewer_kubeconfig(
    admin: &Path,
    client: &kube::Client,
) -> anyhow::Result<std::path::PathBuf> {
    kubectl(admin, &["create", "serviceaccount", "robot"]).await?;
    kubectl(
        admin,
        &[
            "create",
            "clusterrolebinding",
            "robot-view",
            "--clusterrole=view",
            "--serviceaccount=default:robot",
        ],
    )
    .await?;
    token_kubeconfig(admin, &robot_token(client).await?).await
}

/// `kubectl run <name> --image=busybox -- sh -c <script>` as the tenant, once the pod runs.
pub(crate) async fn run_busybox(
    kubeconfig: &Path,
    client: &kube::Client,
    name: &str,
    script: &str,
) -> anyhow::Result<Pod> {
    kubectl(
        kubeconfig,
        &["run", name, "--image=busybox", "--", "sh", "-c", script],
    )
    .await?;
    wait_running(client, "default", name).await
}

/// A one-hour token of service account `default/robot`.
async fn robot_token(client: &kube::Client) -> anyhow::Result<String> {
    use k8s_openapi::api::{
        authentication::v1::{TokenRequest, TokenRequestSpec},
        core::v1::ServiceAccount,
    };
    Ok(Api::<ServiceAccount>::namespaced(client.clone(), "default")
        .create_token_request(
            "robot",
            &Default::default(),
            &TokenRequest {
                spec: TokenRequestSpec {
                    audiences: Vec::new(),
                    expiration_seconds: Some(3600),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?
        .status
        .context("token")?
        .token)
}

/// A kubeconfig beside `admin` with the same server and CA, authenticating with `token`.
pub(crate) async fn token_kubeconfig(admin: &Path, token: &str) -> anyhow::Result<std::path::PathBuf> {
    let field = |path: &'static str| {
        let admin = admin.to_owned();
        async move {
            kubectl(
                &admin,
                &[
                    "config",
                    "view",
                    "--minify",
                    "--raw",
                    "-o",
                    &format!("jsonpath={path}"),
                ],
            )
            .await
        }
    };
    let server = field("{.clusters[0].cluster.server}").await?;
    let ca = field("{.clusters[0].cluster.certificate-authority-data}").await?;
    let path = admin.with_file_name("robot.kubeconfig");
    std::fs::write(
        &path,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: robot\n  user:\n    token: {token}\ncontexts:\n- name: t\n  context:\n    cluster: t\n    user: robot\ncurrent-context: t\n"
        ),
    )?;
    Ok(path)
}

/// A kubectl call that goes through the tenant apiserver to a kubelet, made after the apiserver's kubelet
/// client certificate was renewed. kube-apiserver (client-go) notices a renewed client certificate file
/// when it next opens a connection and then closes all its connections, the one being opened included
/// (kubernetes/kubernetes#112404 describes the same race for exec plugins), so the first such call after a
/// renewal may fail with exactly that error; any other failure, or a second one, fails the test.
async fn kubelet_call_after_rotation(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    match kubectl(kubeconfig, args).await {
        Ok(output) => Ok(output),
        Err(first) => {
            anyhow::ensure!(
                first.to_string().contains("use of closed network connection"),
                "{first}"
            );
            kubectl(kubeconfig, args).await
        }
    }
}

pub(crate) async fn tenant_client(kubeconfig: &Path) -> anyhow::Result<kube::Client> {
    Ok(local_cluster::client_from_kubeconfig_file(kubeconfig).await?)
}

pub(crate) async fn wait_running(client: &kube::Client, namespace: &str, name: &str) -> anyhow::Result<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let found = wait::until(
        Duration::from_secs(120),
        &format!("tenant pod {name} Running"),
        || {
            let api = api.clone();
            async move {
                let pod = api.get(name).await.ok()?;
                (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
            }
        },
    )
    .await;
    match found {
        Ok(pod) => Ok(pod),
        Err(error) => Err(anyhow::anyhow!(
            "{error}; last status: {:?}",
            api.get(name).await.ok().and_then(|p| p.status)
        )),
    }
}

#[tokio::test]
async fn a_native_tenant_boots_on_real_nodes_and_runs_real_containers() -> anyhow::Result<()> {
    const TEST: &str = "a_native_tenant_boots_on_real_nodes_and_runs_real_containers";
    if !local_cluster::require(TEST, NEEDS) || !realnodes::require(TEST) {
        return Ok(());
    }
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        native_tenants: vec!["native-a".to_owned()],
        node_kind: NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;
    let kubeconfig = sandbox.tenant_kubeconfigs()["native-a"].clone();
    let client = tenant_client(&kubeconfig).await?;

    // The tenant's controller-manager runs: the default namespace gets its service account.
    wait::until_true(Duration::from_secs(60), "the default service account", || {
        let client = client.clone();
        async move {
            Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(client, "default")
                .get_opt("default")
                .await
                .ok()
                .flatten()
                .is_some()
        }
    })
    .await?;

    // `kubectl run` as a tenant: a real container on a real node.
    let pod = run_busybox(
        &kubeconfig,
        &client,
        "web",
        "echo hello from a real container; exec httpd -f -p 8080 -h /etc",
    )
    .await?;
    let node = pod.spec.and_then(|s| s.node_name).context("bound to a vNode")?;
    assert!(
        sandbox.tenancy().nodes.names().contains(&node),
        "vNode {node} is a real node"
    );

    // Logs and exec through vn-agent to the real kubelet.
    let logs = wait::until(Duration::from_secs(30), "the tenant pod's log", || {
        let kubeconfig = kubeconfig.clone();
        async move {
            kubectl(&kubeconfig, &["logs", "web"])
                .await
                .ok()
                .filter(|l| l.contains("hello from a real container"))
        }
    })
    .await?;
    assert!(logs.contains("hello from a real container"));
    let hostname = kubectl(&kubeconfig, &["exec", "web", "--", "cat", "/etc/hostname"]).await?;
    assert_eq!(hostname.trim(), "web", "the container's own hostname");

    // attach: a pod reading stdin echoes what the tenant types.
    let echo: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "echo" },
        "spec": { "containers": [{
            "name": "echo", "image": "busybox", "stdin": true,
            "command": ["sh", "-c", "while read line; do echo got:$line; done"],
        }] },
    }))?;
    Api::<Pod>::namespaced(client.clone(), "default")
        .create(&Default::default(), &echo)
        .await?;
    wait_running(&client, "default", "echo").await?;
    let mut attach = kubectl_command(&kubeconfig)?
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

    // port-forward to the container's httpd.
    let port = local_cluster::free_port()?;
    let mut forward = kubectl_command(&kubeconfig)?
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
    drop(forward);

    // Inside a container, the mounted service-account token talks to the tenant apiserver.
    kubectl(
        &kubeconfig,
        &[
            "create",
            "clusterrolebinding",
            "default-view",
            "--clusterrole=view",
            "--serviceaccount=default:default",
        ],
    )
    .await?;
    let kubectl_image = realnodes::RealNodes::control_plane_images()?
        .kubectl
        .context("a kubectl image")?;
    kubectl(
        &kubeconfig,
        &[
            "run",
            "in-cluster",
            &format!("--image={kubectl_image}"),
            "--command",
            "--",
            "sh",
            "-c",
            "kubectl get pods -o name; exec sleep 3600",
        ],
    )
    .await?;
    let listed = wait::until(Duration::from_secs(90), "kubectl inside the tenant pod", || {
        let kubeconfig = kubeconfig.clone();
        async move {
            let logs = kubectl(&kubeconfig, &["logs", "in-cluster"]).await.ok()?;
            logs.contains("pod/web").then_some(logs)
        }
    })
    .await;
    let listed = match listed {
        Ok(listed) => listed,
        Err(error) => {
            let logs = kubectl(&kubeconfig, &["logs", "in-cluster"]).await;
            let pod = kubectl(
                &kubeconfig,
                &[
                    "get",
                    "pod",
                    "in-cluster",
                    "-o",
                    "jsonpath={.status.containerStatuses}",
                ],
            )
            .await;
            anyhow::bail!("{error}; its logs: {logs:?}; the pod: {pod:?}");
        }
    };
    assert!(listed.contains("pod/echo"), "{listed}");

    sandbox.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn two_native_tenants_share_real_nodes_apart_and_leave_nothing_when_deleted() -> anyhow::Result<()> {
    const TEST: &str = "two_native_tenants_share_real_nodes_apart_and_leave_nothing_when_deleted";
    if !local_cluster::require(TEST, NEEDS) || !realnodes::require(TEST) {
        return Ok(());
    }
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        native_tenants: vec!["left".to_owned(), "right".to_owned()],
        node_kind: NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;
    let kubeconfigs = sandbox.tenant_kubeconfigs().clone();

    // The same pod name in both tenants, each answering with its own tenant's name.
    for (name, kubeconfig) in &kubeconfigs {
        let script = format!("mkdir /www && echo {name} > /www/index.html && exec httpd -f -p 8080 -h /www");
        kubectl(
            kubeconfig,
            &["run", "web", "--image=busybox", "--", "sh", "-c", &script],
        )
        .await?;
    }
    let mut ips = Vec::new();
    for (name, kubeconfig) in &kubeconfigs {
        let client = tenant_client(kubeconfig).await?;
        let pod = wait_running(&client, "default", "web").await?;
        let ip = pod.status.and_then(|s| s.pod_ip).context("pod IP")?;
        let page = kubectl(
            kubeconfig,
            &["exec", "web", "--", "wget", "-qO-", &format!("http://{ip}:8080/")],
        )
        .await?;
        assert_eq!(page.trim(), name, "tenant {name}'s own pod answers");
        ips.push(ip);
    }
    assert_ne!(ips[0], ips[1], "two pods, two addresses");

    // Each tenant sees only its own pods and namespaces; `kubectl exec` reaches only its own container.
    for (name, kubeconfig) in &kubeconfigs {
        let pods = kubectl(kubeconfig, &["get", "pods", "-A", "-o", "name"]).await?;
        assert_eq!(pods.trim(), "pod/web", "tenant {name} sees {pods}");
        let served = kubectl(kubeconfig, &["exec", "web", "--", "cat", "/www/index.html"]).await?;
        assert_eq!(served.trim(), name);
    }

    // Deleting a tenant removes its pods, containers and namespaces from the super cluster; the other
    // tenant keeps running.
    let super_client = sandbox.super_client();
    let vcs: Api<crds::VirtualCluster> = Api::namespaced(super_client.clone(), "default");
    let left = vcs.get("left").await?;
    let left_key = crds::naming::cluster_key_of(&left).context("cluster key")?;
    vcs.delete("left", &Default::default()).await?;
    wait::until_true(
        Duration::from_secs(180),
        "tenant left and its namespaces gone",
        || {
            let vcs = vcs.clone();
            let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(super_client.clone());
            let key = left_key.clone();
            async move {
                let vc_gone = matches!(vcs.get_opt("left").await, Ok(None));
                let namespaces_gone = namespaces.list(&Default::default()).await.is_ok_and(|l| {
                    !l.items
                        .iter()
                        .any(|n| n.metadata.name.as_deref().is_some_and(|n| n.starts_with(&key)))
                });
                vc_gone && namespaces_gone
            }
        },
    )
    .await?;
    let pods: Api<Pod> = Api::all(super_client.clone());
    let left_pods: Vec<String> = pods
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter_map(|p| p.metadata.namespace)
        .filter(|ns| ns.starts_with(&left_key))
        .collect();
    assert!(left_pods.is_empty(), "pods of the deleted tenant: {left_pods:?}");
    // No container of the deleted tenant runs on any node: every running container belongs to a pod of
    // the super cluster that still exists.
    let running = realnodes::running_pod_namespaces(sandbox.tenancy().nodes.real().context("real nodes")?)?;
    assert!(
        !running.iter().any(|ns| ns.starts_with(&left_key)),
        "containers of the deleted tenant still run: {running:?}"
    );
    let page = kubectl(
        &kubeconfigs["right"],
        &["exec", "web", "--", "cat", "/www/index.html"],
    )
    .await?;
    assert_eq!(page.trim(), "right", "the other tenant is untouched");

    sandbox.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn upgrading_a_native_tenant_on_real_nodes_keeps_its_data_tokens_and_kubeconfigs() -> anyhow::Result<()>
{
    const TEST: &str = "upgrading_a_native_tenant_on_real_nodes_keeps_its_data_tokens_and_kubeconfigs";
    if !local_cluster::require(TEST, NEEDS) || !realnodes::require(TEST) {
        return Ok(());
    }
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        native_tenants: vec!["up".to_owned()],
        node_kind: NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;
    let kubeconfig = sandbox.tenant_kubeconfigs()["up"].clone();
    let client = tenant_client(&kubeconfig).await?;

    // Data, a service-account token and a running pod from before the upgrade.
    kubectl(
        &kubeconfig,
        &["create", "configmap", "keep", "--from-literal=answer=42"],
    )
    .await?;
    let token_config = viewer_kubeconfig(&kubeconfig, &client).await?;
    run_busybox(&kubeconfig, &client, "web", "echo before; exec sleep 3600").await?;

    // The platform team moves the ClusterVersion to another apiserver image.
    let images = realnodes::RealNodes::control_plane_images()?;
    let (from, to) = (
        images.kube_apiserver.context("apiserver image")?,
        images.kube_apiserver_rebuild.context("rebuilt apiserver image")?,
    );
    let upgraded = local_cluster::sandbox::cluster_version_yaml()?
        .replace(&format!("image: {from}"), &format!("image: {to}"));
    assert!(upgraded.contains(&to));
    let object: kube::api::DynamicObject = serde_saphyr::from_str(&upgraded)?;
    local_cluster::apply::apply_object(&sandbox.super_client(), object, "default").await?;

    // vc-manager rolls the apiserver: Updating, then Running with the new image.
    let vcs: Api<crds::VirtualCluster> = Api::namespaced(sandbox.super_client(), "default");
    let root = crds::naming::cluster_key_of(&vcs.get("up").await?).context("cluster key")?;
    let super_pods: Api<Pod> = Api::namespaced(sandbox.super_client(), &root);
    let mut phases = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(240);
    loop {
        let phase = vcs
            .get("up")
            .await?
            .phase()
            .map(|p| p.to_string())
            .unwrap_or_default();
        if phases.last() != Some(&phase) {
            phases.push(phase.clone());
        }
        let rolled = super_pods
            .get_opt("apiserver-0")
            .await?
            .and_then(|p| p.status)
            .and_then(|s| s.container_statuses)
            .is_some_and(|c| c.iter().any(|c| c.image == to && c.ready));
        if rolled && phase == "Running" && phases.iter().any(|p| p == "Updating") {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no rollout within 240 s; phases {phases:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The admin kubeconfig, the old token, the data and the pod all carry on.
    let after = wait::until(
        Duration::from_secs(60),
        "the tenant answers after the upgrade",
        || {
            let kubeconfig = kubeconfig.clone();
            async move {
                kubectl(
                    &kubeconfig,
                    &["get", "configmap", "keep", "-o", "jsonpath={.data.answer}"],
                )
                .await
                .ok()
            }
        },
    )
    .await?;
    assert_eq!(after, "42");
    let pods = kubectl(&token_config, &["get", "pods", "-o", "name"]).await?;
    assert!(
        pods.contains("pod/web"),
        "the token from before the upgrade still works: {pods}"
    );
    let logs = kubectl(&kubeconfig, &["logs", "web"]).await?;
    assert!(logs.contains("before"));

    sandbox.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn certificates_renew_on_real_nodes_without_clients_noticing() -> anyhow::Result<()> {
    use k8s_openapi::api::core::v1::Secret;
    use std::sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    };
    const TEST: &str = "certificates_renew_on_real_nodes_without_clients_noticing";
    // Renewal starts when a fifth remains (36 s): the e2e kubelets sync pod volumes every 10 s.
    const LIFETIME: Duration = Duration::from_secs(180);
    if !local_cluster::require(TEST, NEEDS) || !realnodes::require(TEST) {
        return Ok(());
    }
    let mut sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        native_tenants: vec!["renew".to_owned()],
        node_kind: NodeKind::Real,
        max_certificate_lifetime: Some(LIFETIME),
        ..SandboxOptions::default()
    })
    .await?;
    let kubeconfig = sandbox.tenant_kubeconfigs()["renew"].clone();
    let client = tenant_client(&kubeconfig).await?;

    // A workload, and a service-account client like the tenant's own programs.
    run_busybox(&kubeconfig, &client, "web", "echo before; exec sleep 3600").await?;
    let token_config = viewer_kubeconfig(&kubeconfig, &client).await?;

    let vcs: Api<crds::VirtualCluster> = Api::namespaced(sandbox.super_client(), "default");
    let root = crds::naming::cluster_key_of(&vcs.get("renew").await?).context("cluster key")?;
    let secrets: Api<Secret> = Api::namespaced(sandbox.super_client(), &root);
    let certificate = |name: &'static str| {
        let secrets = secrets.clone();
        async move {
            let secret = secrets.get(name).await?;
            let pem = secret
                .data
                .as_ref()
                .and_then(|d| d.get("tls.crt"))
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
                .with_context(|| format!("{name} has tls.crt"))?;
            tenant_pki::pki::inspect(&pem).map_err(|e| anyhow::anyhow!("{name}: {e}"))
        }
    };
    const LEAVES: [&str; 4] = ["apiserver-ca", "etcd-server", "etcd-client", "kubelet-client"];
    let mut before = Vec::new();
    for name in LEAVES {
        let info = certificate(name).await?;
        assert!(
            info.lifetime() <= LIFETIME.as_secs() as i64 + 600,
            "{name} lives {} s, capped at {} s",
            info.lifetime(),
            LIFETIME.as_secs()
        );
        before.push(info.not_after);
    }
    let super_pods: Api<Pod> = Api::namespaced(sandbox.super_client(), &root);
    let incarnation = |pod: Pod| {
        let restarts: i32 = pod
            .status
            .and_then(|s| s.container_statuses)
            .unwrap_or_default()
            .iter()
            .map(|c| c.restart_count)
            .sum();
        (pod.metadata.uid, restarts)
    };
    let apiserver_before = incarnation(super_pods.get("apiserver-0").await?);
    let etcd_before = incarnation(super_pods.get("etcd-0").await?);

    // A client that keeps calling through the renewal, with a new TLS handshake every time (a kubectl
    // process per call), so an expired serving certificate would show.
    let stop = Arc::new(AtomicBool::new(false));
    let poller = tokio::spawn({
        let stop = stop.clone();
        let token_config = token_config.clone();
        async move {
            let (mut calls, mut failures) = (0_u32, Vec::new());
            while !stop.load(Ordering::Relaxed) {
                calls += 1;
                if let Err(error) = kubectl(&token_config, &["get", "pods", "-o", "name"]).await {
                    failures.push(error.to_string());
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            (calls, failures)
        }
    });

    // vc-manager renews every leaf before it expires...
    for (name, old) in LEAVES.iter().zip(&before) {
        wait::until_true(LIFETIME, &format!("{name} renewed"), || {
            let certificate = certificate(name);
            async move { certificate.await.is_ok_and(|info| info.not_after > *old) }
        })
        .await?;
    }
    // ...and the old certificates expire: from then on only the renewed files can work.
    let expired = before.iter().max().copied().unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs() as i64;
    tokio::time::sleep(Duration::from_secs(
        u64::try_from(expired - now).unwrap_or(0) + 20,
    ))
    .await;
    stop.store(true, Ordering::Relaxed);
    let (calls, failures) = poller.await?;
    assert!(calls > 100, "the client kept calling ({calls} calls)");
    assert!(
        failures.is_empty(),
        "{} of {calls} calls failed across the renewal: {failures:?}",
        failures.len()
    );

    // The apiserver's kubelet client certificate (logs, exec through vn-agent) and its etcd client
    // certificate (new writes) were reloaded too. The old admin kubeconfig has expired; a fresh one works.
    let kubeconfig = sandbox.refresh_native_kubeconfig("renew").await?;
    let logs = kubelet_call_after_rotation(&kubeconfig, &["logs", "web"]).await?;
    assert!(logs.contains("before"), "logs after the renewal: {logs}");
    let echoed =
        kubelet_call_after_rotation(&kubeconfig, &["exec", "web", "--", "echo", "still here"]).await?;
    assert_eq!(echoed.trim(), "still here");
    kubectl(
        &kubeconfig,
        &["create", "configmap", "after", "--from-literal=renewed=yes"],
    )
    .await?;
    let stored = kubectl(
        &kubeconfig,
        &["get", "configmap", "after", "-o", "jsonpath={.data.renewed}"],
    )
    .await?;
    assert_eq!(stored, "yes");

    // Nobody restarted the apiserver or etcd to get there.
    assert_eq!(
        incarnation(super_pods.get("apiserver-0").await?),
        apiserver_before
    );
    assert_eq!(incarnation(super_pods.get("etcd-0").await?), etcd_before);
    assert_eq!(
        vcs.get("renew").await?.phase().map(|p| p.to_string()).as_deref(),
        Some("Running")
    );

    sandbox.shutdown().await;
    Ok(())
}

#[tokio::test]
async fn the_original_projects_sample_cluster_version_provisions_a_working_tenant() -> anyhow::Result<()> {
    const TEST: &str = "the_original_projects_sample_cluster_version_provisions_a_working_tenant";
    if !local_cluster::require(TEST, NEEDS) || !realnodes::require(TEST) {
        return Ok(());
    }
    let mut sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        node_kind: NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;

    // The original project's sample, unchanged but for its images (the fixture's header says which).
    let fixture = include_str!("../fixtures/original-clusterversion-v1-nodeport.yaml");
    let object: kube::api::DynamicObject =
        serde_saphyr::from_str(&local_cluster::sandbox::with_local_images(fixture)?)?;
    local_cluster::apply::apply_object(&sandbox.super_client(), object, "default").await?;

    // vc-manager says what it adapts.
    let versions: Api<crds::ClusterVersion> = Api::all(sandbox.super_client());
    let adapted = wait::until(Duration::from_secs(30), "the TemplatesAdapted condition", || {
        let versions = versions.clone();
        async move {
            let cv = versions.get("cv-sample-np").await.ok()?;
            cv.status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == "TemplatesAdapted")
        }
    })
    .await?;
    assert_eq!(adapted.status, "True", "{adapted:?}");
    for change in [
        "--kubelet-https",
        "etcd-client",
        "port 10257",
        "publishNotReadyAddresses",
    ] {
        assert!(
            adapted.message.contains(change),
            "{change} in {}",
            adapted.message
        );
    }

    // A tenant from it boots (Running only once its apiserver answers) and runs real containers.
    let kubeconfig = sandbox.add_native_tenant_from("original", "cv-sample-np").await?;
    let client = tenant_client(&kubeconfig).await?;
    run_busybox(
        &kubeconfig,
        &client,
        "web",
        "echo from the original sample; exec sleep 3600",
    )
    .await?;
    let logs = kubectl(&kubeconfig, &["logs", "web"]).await?;
    assert!(logs.contains("from the original sample"), "{logs}");
    let echoed = kubectl(&kubeconfig, &["exec", "web", "--", "echo", "exec works"]).await?;
    assert_eq!(echoed.trim(), "exec works");
    // Its service-account tokens are signed and verified (the controller-manager's token controller and
    // the apiserver's adapted key flags).
    let token_config = viewer_kubeconfig(&kubeconfig, &client).await?;
    let pods = kubectl(&token_config, &["get", "pods", "-o", "name"]).await?;
    assert!(pods.contains("pod/web"), "{pods}");

    sandbox.shutdown().await;
    Ok(())
}
