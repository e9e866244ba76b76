//! Snapshots on real nodes: `kubectl vc snapshot create` reads a native tenant's etcd and PKI into a
//! folder, a tampered copy is refused before anything is created, and `kubectl vc snapshot restore`
//! brings up a new VirtualCluster with the same objects, certificate authorities and service-account key,
//! so that a token issued by the original tenant authenticates against the restored apiserver, and its
//! bare pod runs again.

use std::{path::Path, time::Duration};

use anyhow::Context;
use clap::Parser;
use crds::{SnapshotStatus, VirtualCluster};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::{
    Api,
    api::{Patch, PatchParams},
};
use local_cluster::{
    realnodes,
    sandbox::{NodeKind, Sandbox, SandboxOptions},
    wait,
};

use crate::native_tenants::{
    NEEDS, kubectl, run_busybox, tenant_client, token_kubeconfig, viewer_kubeconfig, wait_running,
};

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
    // A bare pod: no controller would replace it, so the restored tenant must run this very pod again.
    let keeper = run_busybox(&kubeconfig, &client, "keeper", "exec sleep 3600").await?;
    let keeper_uid = keeper.metadata.uid.clone().context("the pod's uid")?;
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
    // The bare pod was scheduled in the snapshot but never had a super copy for the restored tenant: it
    // is recreated on the first attachment, not deleted as lost.
    // (Its status in the snapshot already says Running, so the super copy is what shows it.)
    let super_pods: Api<Pod> = Api::namespaced(
        super_client.clone(),
        &crds::naming::super_namespace(&restored_root, "default"),
    );
    wait::until(
        Duration::from_secs(180),
        "the restored bare pod's super copy running",
        || {
            let super_pods = super_pods.clone();
            async move {
                let pod = super_pods.get_opt("keeper").await.ok()??;
                (pod.status?.phase.as_deref() == Some("Running")).then_some(())
            }
        },
    )
    .await?;
    let restored_client = tenant_client(&restored_admin).await?;
    let running = wait_running(&restored_client, "default", "keeper").await?;
    assert_eq!(
        running.metadata.uid.as_deref(),
        Some(keeper_uid.as_str()),
        "the same pod runs again"
    );
    println!("whole test took {:?}", started.elapsed());

    sandbox.shutdown().await;
    Ok(())
}

/// The snapshot status of `name` once `done` holds of it, within `timeout`.
async fn snapshot_status(
    vcs: &Api<VirtualCluster>,
    name: &str,
    timeout: Duration,
    what: &str,
    done: impl Fn(&SnapshotStatus) -> bool,
) -> anyhow::Result<SnapshotStatus> {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let status = vcs.get(name).await?.status.and_then(|s| s.snapshots);
        if let Some(status) = status.as_ref().filter(|s| done(s)) {
            return Ok(status.clone());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!("no {what} within {timeout:?}; last status.snapshots: {status:?}");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The snapshot folders in `dir`, by name.
fn folders(dir: &Path) -> anyhow::Result<Vec<String>> {
    let mut names: Vec<String> = match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(error.into()),
    };
    names.sort();
    Ok(names)
}

#[tokio::test]
async fn scheduled_snapshots_are_taken_on_time_pruned_and_asked_for_on_real_nodes() -> anyhow::Result<()> {
    const TEST: &str = "scheduled_snapshots_are_taken_on_time_pruned_and_asked_for_on_real_nodes";
    if !local_cluster::require(TEST, NEEDS) || !realnodes::require(TEST) {
        return Ok(());
    }
    let sandbox = Sandbox::start(SandboxOptions {
        tenants: Vec::new(),
        native_tenants: vec!["sched".to_owned()],
        node_kind: NodeKind::Real,
        ..SandboxOptions::default()
    })
    .await?;
    let super_client = sandbox.super_client();
    let vcs: Api<VirtualCluster> = Api::namespaced(super_client.clone(), "default");
    let store = tempfile::tempdir()?;
    let dir = store.path().to_string_lossy().into_owned();
    let tenant_dir = store.path().join("default");

    // The scheduler as the chart runs it, with limits a test can wait for: one snapshot a minute at most,
    // requests at any time, two kept whatever a tenant asks.
    let line = [
        "snapshot",
        "schedule",
        "--to",
        &dir,
        "--store-name",
        "pvc/vc-snapshots",
        "--min-interval",
        "1m",
        "--min-request-gap",
        "0s",
        "--max-retain",
        "2",
        "--poll",
        "1s",
    ];
    let args = kubectl_vc::Args::try_parse_from(std::iter::once(&"kubectl-vc").chain(&line))?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let scheduler_client = super_client.clone();
    let scheduler = tokio::spawn(async move {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let streams = kubectl_vc::Streams::new(&mut out, &mut err, false);
        let result = Box::pin(kubectl_vc::run_with(&args, scheduler_client, streams, async {
            let _ = stopped.await;
        }))
        .await;
        (
            result,
            String::from_utf8_lossy(&out).into_owned(),
            String::from_utf8_lossy(&err).into_owned(),
        )
    });

    // Without spec.snapshots, nothing is taken.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(folders(&tenant_dir)?, Vec::<String>::new());

    // Asked for every minute, keeping five: the first snapshot comes at once.
    vcs.patch(
        "sched",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"spec": {"snapshots": {"intervalMinutes": 1, "retain": 5}}})),
    )
    .await?;
    let first = snapshot_status(
        &vcs,
        "sched",
        Duration::from_secs(90),
        "the first scheduled snapshot",
        |s| s.last_snapshot.is_some(),
    )
    .await?;
    println!("first: {first:?}");
    assert_eq!(first.store.as_deref(), Some("pvc/vc-snapshots"));
    assert_eq!(first.retained, Some(1));
    let first_folder = first
        .last_snapshot
        .as_deref()
        .and_then(|p| p.strip_prefix("default/"))
        .context("the snapshot is under the tenant's namespace")?
        .to_owned();
    assert_eq!(folders(&tenant_dir)?, vec![first_folder.clone()]);
    let listed = kubectl_vc(
        &super_client,
        &["snapshot", "list", &tenant_dir.to_string_lossy(), "-o", "json"],
    )
    .await?;
    listed.result?;
    let listed: serde_json::Value = serde_json::from_str(&listed.out)?;
    assert_eq!(
        listed[0]["checksum"].as_str(),
        first.last_checksum.as_deref(),
        "the status names the store's snapshot"
    );

    // `snapshot create --to pvc/<claim>` asks the scheduler and prints what it took.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let asked = kubectl_vc(
        &super_client,
        &[
            "-n",
            "default",
            "snapshot",
            "create",
            "sched",
            "--to",
            "pvc/vc-snapshots",
        ],
    )
    .await?;
    asked.result?;
    let second = vcs
        .get("sched")
        .await?
        .status
        .and_then(|s| s.snapshots)
        .context("status")?;
    assert_ne!(second.last_snapshot, first.last_snapshot);
    assert!(
        asked.out.contains(&format!(
            "checksum {}",
            second.last_checksum.as_deref().unwrap_or("?")
        )),
        "{}",
        asked.out
    );
    assert_eq!(second.retained, Some(2));

    // A third: the platform's cap of two removes the first, whatever the tenant's five.
    tokio::time::sleep(Duration::from_secs(2)).await;
    kubectl_vc(
        &super_client,
        &[
            "-n",
            "default",
            "snapshot",
            "create",
            "sched",
            "--to",
            "pvc/vc-snapshots",
        ],
    )
    .await?
    .result?;
    let third = vcs
        .get("sched")
        .await?
        .status
        .and_then(|s| s.snapshots)
        .context("status")?;
    assert_eq!(third.retained, Some(2));
    let kept = folders(&tenant_dir)?;
    assert_eq!(kept.len(), 2, "{kept:?}");
    assert!(!kept.contains(&first_folder), "{kept:?}");

    // A request from the future is not honoured: no snapshot but the scheduled one.
    vcs.patch(
        "sched",
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"metadata": {"annotations": {
            crds::wellknown::ANNOTATION_SNAPSHOT_REQUESTED: "pvc/vc-snapshots 2099-01-01T00:00:00Z"
        }}})),
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(4)).await;
    let unchanged = vcs
        .get("sched")
        .await?
        .status
        .and_then(|s| s.snapshots)
        .context("status")?;
    assert_eq!(unchanged.last_snapshot, third.last_snapshot);

    // Unasked, the next comes a minute after the last.
    let third_time = third.last_snapshot_time.clone().context("time")?.0;
    let scheduled = snapshot_status(
        &vcs,
        "sched",
        Duration::from_secs(120),
        "the next scheduled snapshot",
        |s| s.last_snapshot_time.as_ref().is_some_and(|t| t.0 > third_time),
    )
    .await?;
    let waited = scheduled
        .last_snapshot_time
        .context("time")?
        .0
        .duration_since(third_time);
    println!("the scheduled snapshot came {waited:?} after the last");
    assert!(waited.as_secs() >= 60, "{waited:?}");
    assert_eq!(folders(&tenant_dir)?.len(), 2);

    // Each snapshot is an Event on the VirtualCluster.
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(super_client.clone(), "default");
    let taken: Vec<_> = events
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("SnapshotTaken"))
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("sched"))
        .collect();
    assert!(!taken.is_empty(), "no SnapshotTaken event");

    let _ = stop.send(());
    let (result, out, err) = scheduler.await?;
    println!("scheduler log:\n{out}{err}");
    result?;
    assert_eq!(out.matches("snapshot default/sched-").count(), 4, "{out}");
    assert!(out.contains("(retention)"), "{out}");
    drop(sandbox);
    Ok(())
}
