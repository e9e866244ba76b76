//! `kubectl vc` against the local sandbox: create --wait, list, describe, kubeconfig (admin and per user,
//! governed by the tenant's RBAC) and delete --wait, as a platform team would run them. The plugin's
//! library entry point runs in process with the same arguments the binary parses.

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
