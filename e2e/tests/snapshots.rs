//! Snapshots on real nodes: `kubectl vc snapshot create` reads a native tenant's etcd and PKI into a
//! folder, a tampered copy is refused before anything is created, and `kubectl vc snapshot restore`
//! brings up a new VirtualCluster with the same objects, certificate authorities and service-account key,
//! so that a token issued by the original tenant authenticates against the restored apiserver.

use std::{path::Path, time::Duration};

use anyhow::Context;
use clap::Parser;
use crds::VirtualCluster;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use local_cluster::{
    realnodes,
    sandbox::{NodeKind, Sandbox, SandboxOptions},
    wait,
};

use crate::native_tenants::{NEEDS, kubectl, tenant_client, token_kubeconfig, viewer_kubeconfig};

/// What one `kubectl vc` run printed (progress included, as on a terminal).
struct Ran {
    out: String,
    err: String,
    result: Result<(), kubectl_vc::Error>,
}

async fn kubectl_vc(client: &kube::Client, line: &[&str]) -> anyhow::Result<Ran> {
    let args = kubectl_vc::Args::try_parse_from(std::iter::once(&"kubectl-vc").chain(line))?;
    let (mut out, mut err) = (Vec::new(), Vec::new());
    let streams = kubectl_vc::Streams::new(&mut out, &mut err, true);
    // Boxed: the command futures are large, and the test thread's stack is not.
    let result = Box::pin(kubectl_vc::run_with(
        &args,
        client.clone(),
        streams,
        std::future::pending(),
    ))
    .await;
    let ran = Ran {
        out: String::from_utf8_lossy(&out).into_owned(),
        err: String::from_utf8_lossy(&err).into_owned(),
        result,
    };
    println!(
        "$ kubectl vc {}\n{}{}{}",
        line.join(" "),
        ran.err,
        ran.out,
        ran.result
            .as_ref()
            .err()
            .map(|e| format!("error: {}\n", e.one_line()))
            .unwrap_or_default()
    );
    Ok(ran)
}

fn secret_data(secret: &Secret, key: &str) -> Vec<u8> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|v| v.0.clone())
        .unwrap_or_default()
}

/// Copies the snapshot folder `from` to `to` (files only, as a snapshot has).
fn copy_snapshot(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        std::fs::copy(entry.path(), to.join(entry.file_name()))?;
    }
    Ok(())
}

#[tokio::test]
async fn a_restored_snapshot_brings_back_objects_certificates_and_tokens_on_real_nodes() -> anyhow::Result<()>
{
    const TEST: &str = "a_restored_snapshot_brings_back_objects_certificates_and_tokens_on_real_nodes";
    if !local_cluster::require(TEST, NEEDS) || !realnodes::require(TEST) {
        return Ok(());
    }
    let started = tokio::time::Instant::now();
    let mut sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        native_tenants: vec!["origin".to_owned()],
        node_kind: NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;
    println!("sandbox with native tenant up after {:?}", started.elapsed());
    let super_client = sandbox.super_client();
    let kubeconfig = sandbox.tenant_kubeconfigs()["origin"].clone();
    let client = tenant_client(&kubeconfig).await?;

    // Objects and a service-account token of the original tenant.
    kubectl(&kubeconfig, &["create", "namespace", "shop"]).await?;
    kubectl(
        &kubeconfig,
        &[
            "-n",
            "shop",
            "create",
            "configmap",
            "keep",
            "--from-literal=answer=42",
        ],
    )
    .await?;
    kubectl(
        &kubeconfig,
        &[
            "-n",
            "shop",
            "create",
            "secret",
            "generic",
            "vault",
            "--from-literal=pin=1234",
        ],
    )
    .await?;
    let origin_token_config = viewer_kubeconfig(&kubeconfig, &client).await?;
    let token = std::fs::read_to_string(&origin_token_config)?
        .lines()
        .find_map(|l| l.trim().strip_prefix("token: ").map(str::to_owned))
        .context("the token in the robot kubeconfig")?;

    let backups = tempfile::tempdir()?;
    let to = backups.path().to_string_lossy().into_owned();
    let snapshot_started = tokio::time::Instant::now();
    let created = kubectl_vc(
        &super_client,
        &["-n", "default", "snapshot", "create", "origin", "--to", &to],
    )
    .await?;
    created.result?;
    println!("snapshot create took {:?}", snapshot_started.elapsed());
    assert!(created.err.contains("etcd revision"), "progress: {}", created.err);
    let first_dir = created
        .out
        .split_whitespace()
        .nth(1)
        .context("the snapshot path")?
        .to_owned();
    let listed = kubectl_vc(&super_client, &["snapshot", "list", &to]).await?;
    listed.result?;
    assert!(listed.out.contains("origin-"), "{}", listed.out);

    // A second snapshot (folder names have one-second resolution), then retention keeps the newest.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let second = kubectl_vc(
        &super_client,
        &["-n", "default", "snapshot", "create", "origin", "--to", &to],
    )
    .await?;
    second.result?;
    let checksum = second
        .out
        .split_whitespace()
        .find(|w| w.starts_with("sha256:"))
        .context("the checksum")?
        .to_owned();
    let snapshot_dir = second
        .out
        .split_whitespace()
        .nth(1)
        .context("the snapshot path")?
        .to_owned();
    let pruned = kubectl_vc(&super_client, &["snapshot", "prune", &to, "--keep", "1"]).await?;
    pruned.result?;
    assert_eq!(pruned.out.trim(), format!("removed {first_dir}"));
    assert!(!Path::new(&first_dir).exists() && Path::new(&snapshot_dir).exists());

    // A tampered copy is refused before anything is created.
    let tampered = backups.path().join("tampered");
    copy_snapshot(Path::new(&snapshot_dir), &tampered)?;
    let keys_file = tampered.join(kubectl_vc::snapshot::format::ETCD_KEYS);
    let mut bytes = std::fs::read(&keys_file)?;
    let last = bytes.len() - 3;
    bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
    std::fs::write(&keys_file, bytes)?;
    let refused = kubectl_vc(
        &super_client,
        &[
            "-n",
            "default",
            "snapshot",
            "restore",
            "forged",
            "--from",
            &tampered.to_string_lossy(),
        ],
    )
    .await?;
    let error = refused
        .result
        .expect_err("a tampered snapshot is refused")
        .one_line();
    assert!(
        error.contains("checksum mismatch: etcd-keys.jsonl hashes to"),
        "{error}"
    );
    let vcs: Api<VirtualCluster> = Api::namespaced(super_client.clone(), "default");
    assert!(vcs.get_opt("forged").await?.is_none(), "nothing was created");

    // The restore, pinned to the printed checksum.
    let restore_started = tokio::time::Instant::now();
    let restored = kubectl_vc(
        &super_client,
        &[
            "-n",
            "default",
            "snapshot",
            "restore",
            "restored",
            "--from",
            &snapshot_dir,
            "--checksum",
            &checksum,
            "--wait",
            "--timeout",
            "6m",
        ],
    )
    .await?;
    restored.result?;
    println!("snapshot restore --wait took {:?}", restore_started.elapsed());

    // Same certificate authorities and service-account key in both root namespaces.
    let root_of = |vc: VirtualCluster| crds::naming::cluster_key_of(&vc).context("cluster key");
    let origin_root = root_of(vcs.get("origin").await?)?;
    let restored_root = root_of(vcs.get("restored").await?)?;
    assert_ne!(origin_root, restored_root);
    for name in ["root-ca", "etcd-ca", "serviceaccount-rsa"] {
        let of = |root: String| {
            let client = super_client.clone();
            async move { Api::<Secret>::namespaced(client, &root).get(name).await }
        };
        let (a, b) = (of(origin_root.clone()).await?, of(restored_root.clone()).await?);
        assert_eq!(secret_data(&a, "tls.key"), secret_data(&b, "tls.key"), "{name}");
    }

    // The objects are back, and the original tenant's token authenticates against the restored apiserver.
    let restored_admin = sandbox.refresh_native_kubeconfig("restored").await?;
    let answer = wait::until(Duration::from_secs(60), "the restored tenant's ConfigMap", || {
        let kubeconfig = restored_admin.clone();
        async move {
            kubectl(
                &kubeconfig,
                &[
                    "-n",
                    "shop",
                    "get",
                    "configmap",
                    "keep",
                    "-o",
                    "jsonpath={.data.answer}",
                ],
            )
            .await
            .ok()
        }
    })
    .await?;
    assert_eq!(answer, "42");
    let pin = kubectl(
        &restored_admin,
        &[
            "-n",
            "shop",
            "get",
            "secret",
            "vault",
            "-o",
            "jsonpath={.data.pin}",
        ],
    )
    .await?;
    assert_eq!(pin, "MTIzNA==");
    let restored_token_config = token_kubeconfig(&restored_admin, &token).await?;
    let seen = kubectl(
        &restored_token_config,
        &["-n", "shop", "get", "configmaps", "-o", "name"],
    )
    .await?;
    assert!(
        seen.contains("configmap/keep"),
        "the original tenant's token works on the restored tenant: {seen}"
    );
    println!("whole test took {:?}", started.elapsed());

    sandbox.shutdown().await;
    Ok(())
}
