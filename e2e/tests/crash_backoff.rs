//! A tenant that makes the syncer process die (issue 32, item 5). The syncer runs as processes of its own
//! (its own `main`, `syncer-process`), whose data segment (`RLIMIT_DATA`, set with `prlimit` once they
//! run) stands for a container's memory limit. A VirtualCluster editor adopts an "apiserver" of their own
//! making that answers the ConfigMap list with a huge but legal body: within the platform's generous
//! response limits, past the process's memory. The process aborts ("memory allocation failed"), as an
//! out-of-memory kill would end it:
//!
//! - `a_tenant_that_killed_the_syncer_is_held_back_after_the_restart`: one replica. The second start finds
//!   the tenant in the journal its predecessor left, records the stop on the VirtualCluster
//!   (`status.attachBackoff`, `TenantSynced=False TenantHeldBack`, an event) and holds it back for
//!   `--crash-backoff-seconds` while the other tenant syncs; attached again after the wait, it kills the
//!   process again, and the third start holds it back twice as long.
//! - `the_next_shard_owner_holds_back_a_tenant_that_killed_its_predecessor`: two sharded replicas. The
//!   poisoned tenant's owner dies; the other replica takes its tenants over, finds the tenant in the dead
//!   replica's journal, holds it back and syncs the rest; the dead replica, restarted, holds it back too and
//!   counts the stop no second time.
//!
//! - `without_the_journal_every_restart_dies_again`: the control. With `--attach-journal=false` (the
//!   syncer before item 5) every restart attaches the tenant at once and dies again within seconds.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::Arc,
    time::{Duration, Instant},
};

use crate::hostile_limits::{Hostility, Streamed, hostile_apiserver};
use crate::vc_manager_support::{condition, wait_vc};
use anyhow::Context as _;
use crds::{
    VirtualCluster, VirtualClusterSpec,
    wellknown::{CONDITION_TENANT_SYNCED, LABEL_SYNCER_JOURNAL},
};
use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{ConfigMap, Namespace},
    events::v1::Event,
};
use kube::{Api, Client, api::PostParams};
use local_cluster::{
    Binary,
    tenancy::{Tenancy, TenancyOptions, TenantMaster, VC_NAMESPACE},
    wait,
};
use serde_json::json;

const NEEDS: &[Binary] = &[Binary::Etcd, Binary::KubeApiserver];
const PATIENCE: Duration = Duration::from_secs(90);
/// The hostile list's size: legal under the flags below, past the process's memory limit.
const HUGE: u64 = 256 * 1024 * 1024;
/// What the process may grow by past what it holds once it runs: far more than a syncer of two small
/// tenants needs, far less than the hostile list.
const HEADROOM: u64 = 160 * 1024 * 1024;
const BACKOFF_SECONDS: u64 = 20;

/// The `prlimit` program sets the limit; where it is missing the tests skip, saying so.
fn prlimit() -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join("prlimit"))
            .find(|p| p.is_file())
    })
}

/// A syncer process, its output appended to `log`.
struct SyncerProcess {
    child: tokio::process::Child,
    started: Instant,
}

impl SyncerProcess {
    async fn start(kubeconfig: &Path, flags: &[String], log: &Path) -> anyhow::Result<Self> {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(log)?;
        let child = tokio::process::Command::new(env!("CARGO_BIN_EXE_syncer-process"))
            .args(flags)
            .env("KUBECONFIG", kubeconfig)
            .env("POD_NAMESPACE", VC_NAMESPACE)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .context("starting the syncer process")?;
        Ok(Self {
            child,
            started: Instant::now(),
        })
    }

    fn pid(&self) -> anyhow::Result<u32> {
        self.child.id().context("the syncer process has ended")
    }

    /// Limits its data segment to what it holds now plus [`HEADROOM`]; returns what it held (bytes).
    async fn limit_memory(&self, prlimit: &Path) -> anyhow::Result<u64> {
        let pid = self.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
        let held = status
            .lines()
            .find_map(|l| l.strip_prefix("VmData:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .context("VmData")?
            * 1024;
        let limit = held + HEADROOM;
        let out = tokio::process::Command::new(prlimit)
            .args(["--pid", &pid.to_string(), &format!("--data={limit}:{limit}")])
            .output()
            .await?;
        anyhow::ensure!(
            out.status.success(),
            "prlimit: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(held)
    }

    /// Waits for it to end: how it ended.
    async fn ended(&mut self, timeout: Duration) -> anyhow::Result<std::process::ExitStatus> {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .context("the syncer process did not end")?
            .context("waiting for the syncer process")
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

fn flags(admin_port: u16, extra: &[&str]) -> Vec<String> {
    [
        format!("--admin-address=127.0.0.1:{admin_port}"),
        "--patrol-interval-seconds=3600".into(),
        "--tenant-health-period-seconds=2".into(),
        "--downward-workers=4".into(),
        "--upward-workers=4".into(),
        "--usage-interval-seconds=0".into(),
        // The platform's generous limits: the hostile list is legal.
        format!("--tenant-response-max-bytes={}", 4 * HUGE),
        format!("--tenant-cache-max-bytes={}", 8 * HUGE),
        "--tenant-cache-max-objects=10000000".into(),
        "--attach-probation-seconds=3".into(),
        format!("--crash-backoff-seconds={BACKOFF_SECONDS}"),
        "--crash-backoff-max-seconds=600".into(),
    ]
    .into_iter()
    // A flag in `extra` replaces the default's (clap refuses one given twice).
    .filter(|flag| {
        let name = flag.split('=').next().unwrap_or_default();
        !extra.iter().any(|f| f.split('=').next() == Some(name))
    })
    .chain(extra.iter().map(|f| (*f).to_owned()))
    .collect()
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

async fn synced(vcs: &Api<VirtualCluster>, name: &str) -> anyhow::Result<()> {
    wait_vc(vcs, name, PATIENCE, "TenantSynced=True", |vc| {
        condition(vc, CONDITION_TENANT_SYNCED).is_some_and(|c| c.status == "True")
    })
    .await?;
    Ok(())
}

/// The tenants a journal names now.
async fn journal_names(client: &Client, name: &str) -> anyhow::Result<Vec<String>> {
    let config_map = Api::<ConfigMap>::namespaced(client.clone(), VC_NAMESPACE)
        .get_opt(name)
        .await?;
    let Some(text) = config_map
        .as_ref()
        .and_then(|cm| cm.data.as_ref()?.get("journal").cloned())
    else {
        return Ok(Vec::new());
    };
    let record: serde_json::Value = serde_json::from_str(&text)?;
    Ok(record["attaching"]
        .as_object()
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default())
}

/// Waits until no journal names a tenant: every attach passed its probation.
async fn journals_settled(client: &Client) -> anyhow::Result<()> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), VC_NAMESPACE);
    wait::until_true(PATIENCE, "every attach past its probation", || {
        let api = api.clone();
        async move {
            let Ok(list) = api
                .list(&kube::api::ListParams::default().labels(LABEL_SYNCER_JOURNAL))
                .await
            else {
                return false;
            };
            !list.items.is_empty()
                && list.items.iter().all(|cm| {
                    cm.data
                        .as_ref()
                        .and_then(|d| d.get("journal"))
                        .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok())
                        .is_some_and(|r| r["attaching"].as_object().is_none_or(|m| m.is_empty()))
                })
        }
    })
    .await?;
    Ok(())
}

/// A tenant ConfigMap reaches the super cluster within `within`: the tenant is synced.
async fn syncs(
    tenancy: &Tenancy,
    tenant: &TenantMaster,
    name: &str,
    within: Duration,
) -> anyhow::Result<Duration> {
    let namespaces: Api<Namespace> = Api::all(tenant.client());
    if namespaces.get_opt("shop").await?.is_none() {
        namespaces
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": "shop"}}))?,
            )
            .await?;
    }
    let started = Instant::now();
    Api::<ConfigMap>::namespaced(tenant.client(), "shop")
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": "v"}}))?,
        )
        .await?;
    let copies: Api<ConfigMap> = Api::namespaced(tenancy.super_client(), &tenant.super_namespace("shop"));
    wait::until(
        within,
        &format!("{} ConfigMap {name} synced", tenant.name),
        || {
            let copies = copies.clone();
            async move { copies.get_opt(name).await.ok().flatten() }
        },
    )
    .await?;
    Ok(started.elapsed())
}

fn backoff_of(vc: &VirtualCluster) -> Option<&crds::AttachBackoff> {
    vc.status.as_ref()?.attach_backoff.as_ref()
}

async fn events_about(client: &Client, name: &str, reason: &str) -> anyhow::Result<Vec<String>> {
    Ok(Api::<Event>::namespaced(client.clone(), VC_NAMESPACE)
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.reason.as_deref() == Some(reason)
        })
        .map(|e| e.note.unwrap_or_default())
        .collect())
}

fn log_file(name: &str) -> anyhow::Result<(local_cluster::WorkDir, PathBuf)> {
    let dir = local_cluster::WorkDir::new(name)?;
    let path = dir.path().join("syncer.log");
    Ok((dir, path))
}

fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_tenant_that_killed_the_syncer_is_held_back_after_the_restart() -> anyhow::Result<()> {
    const TEST: &str = "a_tenant_that_killed_the_syncer_is_held_back_after_the_restart";
    if !local_cluster::require(TEST, NEEDS) {
        return Ok(());
    }
    let Some(prlimit) = prlimit() else {
        eprintln!("SKIPPED {TEST}: no prlimit program (util-linux) to limit the syncer process's memory");
        return Ok(());
    };
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        nodes: 1,
        tenant_controller_managers: false,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let client = tenancy.super_client();
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let kubeconfig = tenancy.super_cluster.apiserver().kubeconfig_path().to_owned();
    let (_dir, log) = log_file("crash-backoff")?;
    let flags = flags(free_port()?, &[]);
    let good = tenancy.tenant("tenant-0");

    let mut first = SyncerProcess::start(&kubeconfig, &flags, &log).await?;
    synced(&vcs, "tenant-0").await?;
    journals_settled(&client).await?;
    let held = first.limit_memory(&prlimit).await?;

    // The editor adopts their "apiserver": a 256 MiB ConfigMap list, legal under the platform's limits.
    let streamed = Arc::new(Streamed::default());
    let (hostile, _) = hostile_apiserver(Hostility::HugeList(HUGE), streamed.clone()).await?;
    let poisoned = tenancy
        .register("poisoned", &hostile, VirtualClusterSpec::default())
        .await?;
    let key = crds::naming::cluster_key_of(&poisoned).context("cluster key")?;
    let died = first
        .ended(PATIENCE)
        .await
        .map_err(|e| anyhow::anyhow!("{e}: {}", tail(&log)))?;
    anyhow::ensure!(!died.success(), "the first process ended cleanly: {died}");
    let first_life = first.started.elapsed();
    assert_eq!(
        journal_names(&client, "vc-syncer-journal").await?,
        vec![key.clone()],
        "the journal names the tenant it was attaching, alone"
    );
    println!(
        "the first process held {:.0} MiB of data, was limited to {:.0} MiB more, and ended ({died}) after the hostile list sent {:.0} MiB",
        held as f64 / 1048576.0,
        HEADROOM as f64 / 1048576.0,
        streamed.most.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1048576.0
    );

    // The restart: the stop is counted against the tenant, which is held back while the other syncs.
    let mut second = SyncerProcess::start(&kubeconfig, &flags, &log).await?;
    let restarted = Instant::now();
    let vc = wait_vc(&vcs, "poisoned", PATIENCE, "held back", |vc| {
        condition(vc, CONDITION_TENANT_SYNCED).is_some_and(|c| c.reason == "TenantHeldBack")
    })
    .await?;
    let held_back_after = restarted.elapsed();
    let record = backoff_of(&vc).context("status.attachBackoff")?.clone();
    assert_eq!((record.stops, record.attached_with), (1, 1), "{record:?}");
    let not_before = record.not_before.clone().context("notBefore")?.0;
    let message = condition(&vc, CONDITION_TENANT_SYNCED)
        .map(|c| c.message.clone())
        .unwrap_or_default();
    assert!(message.contains("--crash-backoff-max-seconds"), "{message}");
    assert!(
        !events_about(&client, "poisoned", "SyncerStoppedWhileAttaching")
            .await?
            .is_empty(),
        "an event says why"
    );
    synced(&vcs, "tenant-0").await?;
    let took = syncs(&tenancy, good, "after-the-restart", Duration::from_secs(10)).await?;
    second.limit_memory(&prlimit).await?;
    assert!(second.running(), "the second process died: {}", tail(&log));

    // Attached again (alone) once the wait is over: it kills the process again.
    let died = second
        .ended(Duration::from_secs(BACKOFF_SECONDS) + PATIENCE)
        .await
        .map_err(|e| anyhow::anyhow!("{e}: {}", tail(&log)))?;
    let second_life = second.started.elapsed();
    let waited = k8s_openapi::jiff::Timestamp::now().duration_since(not_before);
    assert!(
        waited.as_secs_f64() > -1.0,
        "the tenant was attached again {:.1} s before its notBefore",
        -waited.as_secs_f64()
    );
    anyhow::ensure!(!died.success(), "the second process ended cleanly: {died}");

    // The third start holds it back twice as long.
    let mut third = SyncerProcess::start(&kubeconfig, &flags, &log).await?;
    let counted = Instant::now();
    let vc = wait_vc(&vcs, "poisoned", PATIENCE, "held back twice", |vc| {
        backoff_of(vc).is_some_and(|b| b.stops == 2)
    })
    .await?;
    let record = backoff_of(&vc).context("status.attachBackoff")?.clone();
    let wait = record
        .not_before
        .clone()
        .context("notBefore")?
        .0
        .duration_since(k8s_openapi::jiff::Timestamp::now())
        .as_secs_f64();
    assert!(
        wait > (2 * BACKOFF_SECONDS) as f64 - 10.0 && wait <= (2 * BACKOFF_SECONDS) as f64,
        "the second wait is {wait:.1} s"
    );
    synced(&vcs, "tenant-0").await?;
    syncs(
        &tenancy,
        good,
        "after-the-second-restart",
        Duration::from_secs(10),
    )
    .await?;
    assert!(third.running(), "the third process died: {}", tail(&log));
    println!(
        "first process lived {:.1} s; the restart held the tenant back (stop 1 counted {:.1} s after it started, the other tenant synced in {:.2} s) and attached it again after {BACKOFF_SECONDS} s: the second process lived {:.1} s; the third counted stop 2 after {:.1} s and holds it back {wait:.0} s",
        first_life.as_secs_f64(),
        held_back_after.as_secs_f64(),
        took.as_secs_f64(),
        second_life.as_secs_f64(),
        counted.elapsed().as_secs_f64(),
    );
    Ok(())
}

/// The replica holding tenant `key`'s Lease, by its replica id.
async fn owner(client: &Client, key: &str) -> Option<String> {
    let lease = Api::<Lease>::namespaced(client.clone(), VC_NAMESPACE)
        .get_opt(&format!("vc-syncer-tenant-{key}"))
        .await
        .ok()??;
    let holder = lease.spec?.holder_identity?;
    Some(holder.split('/').next()?.to_owned())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_next_shard_owner_holds_back_a_tenant_that_killed_its_predecessor() -> anyhow::Result<()> {
    const TEST: &str = "the_next_shard_owner_holds_back_a_tenant_that_killed_its_predecessor";
    if !local_cluster::require(TEST, NEEDS) {
        return Ok(());
    }
    let Some(prlimit) = prlimit() else {
        eprintln!("SKIPPED {TEST}: no prlimit program (util-linux) to limit the syncer process's memory");
        return Ok(());
    };
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 2,
        nodes: 1,
        tenant_controller_managers: false,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let client = tenancy.super_client();
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let kubeconfig = tenancy.super_cluster.apiserver().kubeconfig_path().to_owned();
    let (_dir, log) = log_file("crash-backoff-shards")?;
    // A long wait: the test ends before either replica attaches the tenant again.
    let replica_flags = |id: &str| -> anyhow::Result<Vec<String>> {
        Ok(flags(
            free_port()?,
            &[
                "--shards=true",
                &format!("--replica-id={id}"),
                "--shard-lease-duration-seconds=6",
                "--crash-backoff-seconds=300",
            ],
        ))
    };
    let mut replicas = vec![
        (
            "syncer-a",
            SyncerProcess::start(&kubeconfig, &replica_flags("syncer-a")?, &log).await?,
        ),
        (
            "syncer-b",
            SyncerProcess::start(&kubeconfig, &replica_flags("syncer-b")?, &log).await?,
        ),
    ];
    for name in ["tenant-0", "tenant-1"] {
        synced(&vcs, name)
            .await
            .map_err(|e| anyhow::anyhow!("{e}: {}", tail(&log)))?;
    }
    journals_settled(&client).await?;
    for (_, replica) in &replicas {
        replica.limit_memory(&prlimit).await?;
    }

    let streamed = Arc::new(Streamed::default());
    let (hostile, _) = hostile_apiserver(Hostility::HugeList(HUGE), streamed.clone()).await?;
    let poisoned = tenancy
        .register("poisoned", &hostile, VirtualClusterSpec::default())
        .await?;
    let key = crds::naming::cluster_key_of(&poisoned).context("cluster key")?;
    let first_owner = wait::until(PATIENCE, "the poisoned tenant's owner", || {
        let client = client.clone();
        let key = key.clone();
        async move { owner(&client, &key).await }
    })
    .await?;
    let victim = replicas
        .iter()
        .position(|(id, _)| *id == first_owner)
        .context("the owner is one of the replicas")?;
    let died = replicas[victim]
        .1
        .ended(PATIENCE)
        .await
        .map_err(|e| anyhow::anyhow!("{e}: {}", tail(&log)))?;
    anyhow::ensure!(!died.success(), "the owner ended cleanly: {died}");
    let death = Instant::now();
    let survivor = 1 - victim;
    let (survivor_id, _) = replicas[survivor];

    // The survivor takes the dead replica's tenants over once its membership lapses, and holds the
    // poisoned one back instead of attaching it.
    let vc = wait_vc(&vcs, "poisoned", PATIENCE, "held back by the survivor", |vc| {
        condition(vc, CONDITION_TENANT_SYNCED).is_some_and(|c| c.reason == "TenantHeldBack")
    })
    .await?;
    let held_back_after = death.elapsed();
    let record = backoff_of(&vc).context("status.attachBackoff")?.clone();
    assert_eq!((record.stops, record.attached_with), (1, 1), "{record:?}");
    assert!(
        record
            .instance
            .as_deref()
            .is_some_and(|i| i.starts_with(&format!("{first_owner}/"))),
        "{record:?}"
    );
    assert_eq!(owner(&client, &key).await.as_deref(), Some(survivor_id));
    for (name, tenant) in [("tenant-0", "t0"), ("tenant-1", "t1")] {
        synced(&vcs, name).await?;
        let synced_after = syncs(
            &tenancy,
            tenancy.tenant(name),
            &format!("{tenant}-after-the-takeover"),
            Duration::from_secs(15),
        )
        .await;
        if let Err(e) = synced_after {
            let running = replicas[survivor].1.running();
            let data = replicas[survivor]
                .1
                .pid()
                .ok()
                .and_then(|pid| std::fs::read_to_string(format!("/proc/{pid}/status")).ok())
                .and_then(|s| s.lines().find(|l| l.starts_with("VmData")).map(str::to_owned));
            anyhow::bail!(
                "{e} ({:.1} s after the death; survivor running: {running}, {data:?}): {}",
                death.elapsed().as_secs_f64(),
                tail(&log)
            );
        }
    }
    assert!(
        replicas[survivor].1.running(),
        "the survivor died: {}",
        tail(&log)
    );

    // The dead replica comes back (its pod restarted): it counts the stop no second time, and whichever
    // replica holds the tenant holds it back.
    let restarted = SyncerProcess::start(&kubeconfig, &replica_flags(first_owner.as_str())?, &log).await?;
    replicas[victim].1 = restarted;
    tokio::time::sleep(Duration::from_secs(15)).await;
    replicas[victim].1.limit_memory(&prlimit).await?;
    let vc = vcs.get("poisoned").await?;
    assert_eq!(backoff_of(&vc).map(|b| b.stops), Some(1), "counted once");
    assert_eq!(
        condition(&vc, CONDITION_TENANT_SYNCED).map(|c| c.reason.as_str()),
        Some("TenantHeldBack")
    );
    for (id, replica) in &mut replicas {
        assert!(replica.running(), "{id} died: {}", tail(&log));
    }
    println!(
        "the poisoned tenant's owner {first_owner} died; {survivor_id} held the tenant back {:.1} s after the death (Lease duration 6 s) and synced the others; {first_owner}, restarted, held it back too",
        held_back_after.as_secs_f64()
    );
    Ok(())
}

/// The control: what the journal prevents. With `--attach-journal=false` (the syncer before item 5), the
/// restarted process attaches the poisoned tenant at once and dies again within seconds, at every restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_the_journal_every_restart_dies_again() -> anyhow::Result<()> {
    const TEST: &str = "without_the_journal_every_restart_dies_again";
    if !local_cluster::require(TEST, NEEDS) {
        return Ok(());
    }
    let Some(prlimit) = prlimit() else {
        eprintln!("SKIPPED {TEST}: no prlimit program (util-linux) to limit the syncer process's memory");
        return Ok(());
    };
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 1,
        nodes: 1,
        tenant_controller_managers: false,
        super_controller_manager: false,
        ..Default::default()
    })
    .await?;
    let client = tenancy.super_client();
    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), VC_NAMESPACE);
    let kubeconfig = tenancy.super_cluster.apiserver().kubeconfig_path().to_owned();
    let (_dir, log) = log_file("crash-no-journal")?;
    let flags = flags(free_port()?, &["--attach-journal=false"]);

    let first = SyncerProcess::start(&kubeconfig, &flags, &log).await?;
    synced(&vcs, "tenant-0").await?;
    first.limit_memory(&prlimit).await?;
    let streamed = Arc::new(Streamed::default());
    let (hostile, _) = hostile_apiserver(Hostility::HugeList(HUGE), streamed.clone()).await?;
    tenancy
        .register("poisoned", &hostile, VirtualClusterSpec::default())
        .await?;
    let mut process = first;
    let mut lives = Vec::new();
    for restart in 0..3 {
        let died = process
            .ended(PATIENCE)
            .await
            .map_err(|e| anyhow::anyhow!("restart {restart}: {e}: {}", tail(&log)))?;
        anyhow::ensure!(!died.success(), "process {restart} ended cleanly: {died}");
        lives.push(process.started.elapsed().as_secs_f64());
        process = SyncerProcess::start(&kubeconfig, &flags, &log).await?;
        // Limited as soon as it runs, before it has listed the hostile tenant.
        tokio::time::sleep(Duration::from_millis(300)).await;
        process.limit_memory(&prlimit).await?;
    }
    let died = process
        .ended(PATIENCE)
        .await
        .map_err(|e| anyhow::anyhow!("the last restart: {e}: {}", tail(&log)))?;
    anyhow::ensure!(!died.success(), "the last process ended cleanly: {died}");
    lives.push(process.started.elapsed().as_secs_f64());
    let vc = vcs.get("poisoned").await?;
    assert!(
        backoff_of(&vc).is_none(),
        "no journal, no record: {:?}",
        backoff_of(&vc)
    );
    println!(
        "without the journal: 4 processes in a row died, living {} s",
        lives
            .iter()
            .map(|l| format!("{l:.1}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(())
}
