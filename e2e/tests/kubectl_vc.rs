//! `kubectl vc` against the local sandbox: create --wait, list, describe, kubeconfig (admin and per user,
//! governed by the tenant's RBAC), connect (a context merged into a kubeconfig that plain kubectl then
//! uses, directly and, on real nodes, through a port-forward to the tenant apiserver pod) and delete
//! --wait, as a platform team would run them. The plugin's library entry point runs in process with the
//! same arguments the binary parses.

use std::{path::Path, time::Duration};

use crate::kubectl_support::Kubectl;
use anyhow::Context as _;
use clap::Parser;
use crds::VirtualCluster;
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kubectl_vc::{self as cli, Args};
use local_cluster::{
    Binary,
    sandbox::{NEEDS, Sandbox, SandboxOptions},
    wait,
};

/// What one `kubectl vc` run printed, and its error as the binary would print it.
struct Ran {
    out: String,
    err: String,
    error: Option<String>,
}

impl Ran {
    fn ok(self) -> anyhow::Result<Self> {
        match &self.error {
            None => Ok(self),
            Some(error) => anyhow::bail!(
                "kubectl vc failed: {error}\nstdout: {}\nstderr: {}",
                self.out,
                self.err
            ),
        }
    }
}

/// `kubectl vc --kubeconfig <super> <args>`.
async fn kubectl_vc(super_kubeconfig: &Path, args: &[&str]) -> anyhow::Result<Ran> {
    let kubeconfig = super_kubeconfig.display().to_string();
    let argv = ["kubectl-vc", "--kubeconfig", &kubeconfig]
        .into_iter()
        .chain(args.iter().copied());
    let args = Args::try_parse_from(argv)?;
    let client = cli::client(&args.global)
        .await
        .map_err(|e| anyhow::anyhow!(e.one_line()))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let result = tokio::time::timeout(
        Duration::from_secs(180),
        cli::run(&args, client, &mut out, &mut err),
    )
    .await
    .context("kubectl vc did not finish in 180 s")?;
    Ok(Ran {
        out: String::from_utf8(out)?,
        err: String::from_utf8(err)?,
        error: result.err().map(|e| e.one_line()),
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_vc_manages_tenants_in_the_sandbox() -> anyhow::Result<()> {
    let needs: Vec<Binary> = NEEDS.iter().copied().chain([Binary::Kubectl]).collect();
    if !local_cluster::require("kubectl_vc_manages_tenants_in_the_sandbox", &needs) {
        return Ok(());
    }
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: vec!["alpha".into()],
        nodes: 2,
        ..SandboxOptions::default()
    })
    .await?;
    let super_kubeconfig = sandbox.super_kubeconfig().to_owned();
    let vc = |args: &'static [&'static str]| kubectl_vc(&super_kubeconfig, args);

    // create --wait: a ClusterVersion and a native VirtualCluster from one file, shown phase by phase until
    // Running (the control-plane pods run on the simulated nodes).
    let manifests = [
        std::fs::read_to_string("../examples/clusterversion-nodeport.yaml")?,
        std::fs::read_to_string("../examples/virtualcluster-native.yaml")?,
    ]
    .join("\n---\n");
    let file = sandbox.dir().join("team-a.yaml");
    std::fs::write(&file, manifests)?;
    let file = file.display().to_string();
    let created = kubectl_vc(
        &super_kubeconfig,
        &["create", "-f", &file, "--wait", "--timeout", "3m"],
    )
    .await?
    .ok()?;
    let shown = format!("{}{}", created.out, created.err);
    assert!(shown.contains("Running"), "{shown}");
    let vcs: Api<VirtualCluster> = Api::namespaced(sandbox.super_client(), "default");
    let team_a = vcs.get("team-a").await?;
    assert_eq!(team_a.phase(), Some(crds::ClusterPhase::Running));
    let root = team_a
        .status
        .as_ref()
        .and_then(|s| s.cluster_namespace.clone())
        .context("root namespace")?;

    // list: both tenants with phase, version and age; -o json the objects.
    let listed = vc(&["list"]).await?.ok()?;
    let lines: Vec<&str> = listed.out.lines().collect();
    assert!(
        lines[0].contains("NAME") && lines[0].contains("PHASE"),
        "{}",
        listed.out
    );
    let alpha = lines
        .iter()
        .find(|l| l.starts_with("alpha "))
        .context("alpha listed")?;
    assert!(alpha.contains("Running") && alpha.contains("adopted"), "{alpha}");
    let team = lines
        .iter()
        .find(|l| l.starts_with("team-a "))
        .context("team-a listed")?;
    assert!(
        team.contains("Running") && team.contains("cv-v1-33-nodeport"),
        "{team}"
    );
    let json = vc(&["list", "-o", "json"]).await?.ok()?;
    let parsed: serde_json::Value = serde_json::from_str(&json.out)?;
    assert_eq!(parsed["items"].as_array().map(Vec::len), Some(2), "{}", json.out);

    // describe: conditions, the root namespace and the quota of the native tenant.
    let described = vc(&["describe", "team-a"]).await?.ok()?;
    for expected in ["Running", "Ready", "PKIReady", &root, "requests.cpu"] {
        assert!(
            described.out.contains(expected),
            "{expected} missing:\n{}",
            described.out
        );
    }

    // kubeconfig: the adopted tenant's admin kubeconfig works as printed, with its CA kept.
    let admin = vc(&["kubeconfig", "alpha"]).await?.ok()?;
    assert!(!admin.out.contains("insecure-skip-tls-verify"), "{}", admin.out);
    assert!(admin.out.contains("certificate-authority-data"), "{}", admin.out);
    let admin_path = sandbox.dir().join("alpha-admin.kubeconfig");
    std::fs::write(&admin_path, &admin.out)?;
    let admin_kubectl = Kubectl::new(&admin_path)?;
    admin_kubectl.run(&["get", "namespaces"], None).await?.ok()?;

    // connect: the adopted tenant's context merged into a copy of the super kubeconfig (its --kubeconfig,
    // so also the file written); plain kubectl uses it, and the super cluster's context still works.
    let merged = sandbox.dir().join("merged.kubeconfig");
    std::fs::copy(&super_kubeconfig, &merged)?;
    let connected = kubectl_vc(&merged, &["connect", "alpha", "-o", "json"])
        .await?
        .ok()?;
    let written: serde_json::Value = serde_json::from_str(&connected.out)?;
    assert_eq!(written["context"]["name"], "default-alpha", "{}", connected.out);
    assert_eq!(
        written["portForward"],
        serde_json::Value::Null,
        "{}",
        connected.out
    );
    assert!(
        written["serverVersion"]
            .as_str()
            .is_some_and(|v| v.starts_with('v')),
        "{}",
        connected.out
    );
    let merged_kubectl = Kubectl::new(&merged)?;
    let namespaces = merged_kubectl
        .run(&["--context", "default-alpha", "get", "namespaces"], None)
        .await?
        .ok()?;
    assert!(namespaces.stdout.contains("kube-system"), "{namespaces:?}");
    merged_kubectl
        .run(&["get", "virtualclusters", "-n", "default"], None)
        .await?
        .ok()?;
    let mode = std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&merged)?.permissions());
    assert_eq!(mode & 0o777, 0o600);
    // Again: nothing to change; the text says so.
    let again = kubectl_vc(&merged, &["connect", "alpha"]).await?.ok()?;
    assert!(
        again.out.contains("cluster \"default-alpha\" unchanged"),
        "{}",
        again.out
    );

    // kubeconfig --user: authenticated as bob, refused by the tenant's RBAC until a RoleBinding grants it.
    let bob = vc(&[
        "kubeconfig",
        "alpha",
        "--user",
        "bob",
        "--group",
        "developers",
        "--ttl",
        "1h",
    ])
    .await?
    .ok()?;
    let bob_path = sandbox.dir().join("alpha-bob.kubeconfig");
    std::fs::write(&bob_path, &bob.out)?;
    let bob_kubectl = Kubectl::new(&bob_path)?;
    let refused = bob_kubectl.run(&["get", "pods", "-n", "default"], None).await?;
    assert_ne!(refused.code, Some(0), "{refused:?}");
    assert!(
        refused.stderr.contains("User \"bob\"") && refused.stderr.contains("forbidden"),
        "{refused:?}"
    );
    admin_kubectl
        .run(
            &[
                "create",
                "rolebinding",
                "bob-view",
                "-n",
                "default",
                "--clusterrole=view",
                "--user=bob",
            ],
            None,
        )
        .await?
        .ok()?;
    wait::until_true(Duration::from_secs(30), "bob may list pods", || {
        let bob_kubectl = bob_kubectl.clone();
        async move {
            bob_kubectl
                .run(&["get", "pods", "-n", "default"], None)
                .await
                .is_ok_and(|out| out.code == Some(0))
        }
    })
    .await?;
    let still_refused = bob_kubectl
        .run(&["get", "pods", "-n", "kube-system"], None)
        .await?;
    assert_ne!(still_refused.code, Some(0), "{still_refused:?}");
    // The native tenant's per-user kubeconfig is minted from its own CA (no apiserver answers it here).
    let native_user = vc(&["kubeconfig", "team-a", "--user", "carol"]).await?.ok()?;
    assert!(
        native_user.out.contains("client-certificate-data"),
        "{}",
        native_user.out
    );

    // Failures: one clear line each.
    let missing = vc(&["describe", "nobody"]).await?;
    let line = missing
        .error
        .context("describe of a missing VirtualCluster must fail")?;
    assert!(line.contains("nobody") && line.contains("not found"), "{line}");

    // delete --wait: gone, with its root namespace.
    vc(&["delete", "team-a", "--wait", "--timeout", "3m"])
        .await?
        .ok()?;
    assert!(vcs.get_opt("team-a").await?.is_none());
    let namespaces: Api<Namespace> = Api::all(sandbox.super_client());
    wait::until_true(Duration::from_secs(60), "team-a's root namespace gone", || {
        let namespaces = namespaces.clone();
        let root = root.clone();
        async move { matches!(namespaces.get_opt(&root).await, Ok(None)) }
    })
    .await?;

    sandbox.shutdown().await;
    Ok(())
}

/// A writer a test reads while the command that writes to it still runs.
#[derive(Clone, Default)]
struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Shared {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .map_err(|_| std::io::Error::other("poisoned"))?
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Shared {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().map(|b| b.clone()).unwrap_or_default()).into_owned()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn kubectl_vc_connect_port_forwards_to_a_native_tenant_on_real_nodes() -> anyhow::Result<()> {
    const TEST: &str = "kubectl_vc_connect_port_forwards_to_a_native_tenant_on_real_nodes";
    let needs: Vec<Binary> = NEEDS.iter().copied().chain([Binary::Kubectl]).collect();
    if !local_cluster::require(TEST, &needs) || !local_cluster::realnodes::require(TEST) {
        return Ok(());
    }
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        native_tenants: vec!["native-a".to_owned()],
        node_kind: local_cluster::sandbox::NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;
    // The tenant apiserver's Service is a ClusterIP one: its in-cluster name does not resolve here, so
    // connect (auto) must port-forward to the apiserver pod through the super cluster and the real kubelet.
    let file = sandbox.dir().join("connect.kubeconfig");
    let argv = [
        "kubectl-vc",
        "--kubeconfig",
        &sandbox.super_kubeconfig().display().to_string(),
        "connect",
        "native-a",
        "--write-kubeconfig",
        &file.display().to_string(),
    ]
    .map(str::to_owned);
    let args = Args::try_parse_from(argv)?;
    let client = cli::client(&args.global)
        .await
        .map_err(|e| anyhow::anyhow!(e.one_line()))?;
    let (out, err) = (Shared::default(), Shared::default());
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = {
        let (mut out, mut err) = (out.clone(), err.clone());
        tokio::spawn(async move {
            let streams = cli::Streams::new(&mut out, &mut err, true);
            cli::run_with(&args, client, streams, async {
                let _ = stopped.await;
            })
            .await
            .map_err(|e| e.one_line())
        })
    };
    wait::until_true(Duration::from_secs(90), "connect forwarding", || {
        let out = out.clone();
        async move { out.text().contains("Press Ctrl-C to stop") }
    })
    .await
    .with_context(|| format!("stdout: {}\nstderr: {}", out.text(), err.text()))?;
    let printed = out.text();
    // Shown with --nocapture: what a user sees.
    eprintln!("kubectl vc connect native-a printed:\n{printed}{}", err.text());
    assert!(printed.contains("does not answer from here"), "{printed}");
    assert!(printed.contains("Forwarding 127.0.0.1:"), "{printed}");
    assert!(
        err.text().contains("Checking whether https://apiserver-svc."),
        "{}",
        err.text()
    );

    // The context points at the local end, verified against a name in the apiserver's certificate.
    let config = kube::config::Kubeconfig::read_from(&file)?;
    let cluster = config
        .clusters
        .iter()
        .find(|c| c.name == "default-native-a")
        .and_then(|c| c.cluster.clone())
        .context("cluster written")?;
    assert!(
        cluster
            .server
            .as_deref()
            .is_some_and(|s| s.starts_with("https://127.0.0.1:")),
        "{cluster:?}"
    );
    assert!(
        cluster
            .tls_server_name
            .as_deref()
            .is_some_and(|n| n.starts_with("apiserver-svc.") && n.ends_with(".svc")),
        "{cluster:?}"
    );
    assert_eq!(cluster.insecure_skip_tls_verify, None);

    // Plain kubectl through it, twice (every connection is its own port-forward).
    let kubectl = Kubectl::new(&file)?;
    for _ in 0..2 {
        let namespaces = kubectl
            .run(&["--context", "default-native-a", "get", "namespaces"], None)
            .await?
            .ok()?;
        assert!(namespaces.stdout.contains("kube-system"), "{namespaces:?}");
    }

    // Ctrl-C ends it cleanly.
    let _ = stop.send(());
    let result = tokio::time::timeout(Duration::from_secs(30), running)
        .await
        .context("connect did not stop within 30 s")??;
    assert_eq!(result, Ok(()));
    assert!(err.text().contains("Stopped forwarding"), "{}", err.text());

    sandbox.shutdown().await;
    Ok(())
}
