//! Sharded syncer benchmark: N replicas (`--shards`) syncing N × T tenants, for each N in `--replicas`,
//! each run on a fresh super cluster with simulated nodes. Prints per run: tenants per replica, all pods in
//! the super cluster and Running, tenant create → super pod and create → tenant Running latencies, and each
//! replica's CPU seconds and RSS. "N replicas sync N× the tenants at the same latency" is the comparison of
//! the rows.
//!
//! The syncers run as their own processes (the release binary next to this one). Build both first:
//! `cargo build --release -p syncer -p e2e`, then `target/release/bench_shards --replicas 1,2`.

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod, ServiceAccount};
use kube::{
    Api, Client, ResourceExt,
    api::PostParams,
    runtime::{WatchStreamExt, watcher},
};
use local_cluster::bench::percentile;
use local_cluster::{
    Binary, ManagedProcess, WorkDir, free_port,
    tenancy::{Tenancy, TenancyOptions},
    wait,
};

#[derive(Parser, Debug)]
#[command(about = "Benchmark sharded syncer replicas: N replicas with N times the tenants")]
struct Args {
    /// Replica counts to run, one run each (comma-separated).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 2])]
    replicas: Vec<usize>,
    /// Tenants per replica (T): a run with N replicas has N × T tenants.
    #[arg(long, default_value_t = 3)]
    tenants_per_replica: usize,
    /// Pods per tenant.
    #[arg(long, default_value_t = 100)]
    pods: usize,
    /// Simulated super nodes.
    #[arg(long, default_value_t = 6)]
    nodes: usize,
    /// Pods each tenant's creator has in flight at once.
    #[arg(long, default_value_t = 4)]
    concurrency: usize,
    /// Downward workers per replica (small values make one replica the bottleneck, as a replica that
    /// is out of CPU would be).
    #[arg(long, default_value_t = 32)]
    downward_workers: usize,
    /// The syncer binary (default: `syncer` next to this binary).
    #[arg(long)]
    syncer: Option<PathBuf>,
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    }))
    .expect("pod")
}

/// First sightings by key: created, and Running.
#[derive(Default)]
struct Seen {
    created: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
}

fn observe(
    client: Client,
    key: impl Fn(&Pod) -> Option<String> + Send + 'static,
) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let task = tokio::spawn({
        let seen = seen.clone();
        async move {
            let stream = watcher(
                Api::<Pod>::all(client),
                watcher::Config::default().labels("app=bench"),
            )
            .default_backoff()
            .applied_objects();
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let Ok(pod) = event else { continue };
                let Some(key) = key(&pod) else { continue };
                let now = Instant::now();
                let mut seen = seen.lock().expect("lock");
                seen.created.entry(key.clone()).or_insert(now);
                if pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running") {
                    seen.running.entry(key).or_insert(now);
                }
            }
        }
    });
    (seen, task)
}

async fn http_get(port: u16, path: &str) -> Option<String> {
    local_cluster::bench::admin_get(port, path, Duration::from_secs(10)).await
}

/// The value of an unlabelled metric on a syncer's admin endpoint.
async fn metric(port: u16, name: &str) -> Option<f64> {
    let body = http_get(port, "/metrics").await?;
    body.lines()
        .find(|l| l.split_whitespace().next() == Some(name))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU seconds a process has used (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

struct Replica {
    process: ManagedProcess,
    admin_port: u16,
}

async fn start_replica(
    binary: &Path,
    kubeconfig: &Path,
    dir: &WorkDir,
    name: &str,
    downward_workers: usize,
) -> anyhow::Result<Replica> {
    let admin_port = free_port()?;
    let args = vec![
        "--shards=true".to_owned(),
        format!("--replica-id={name}"),
        "--shard-namespace=default".to_owned(),
        format!("--admin-address=127.0.0.1:{admin_port}"),
        "--patrol-interval-seconds=60".to_owned(),
        format!("--downward-workers={downward_workers}"),
    ];
    let wrapper = dir.write(
        &format!("{name}.sh"),
        format!(
            "#!/bin/sh\nexport KUBECONFIG={}\nexport RUST_LOG=warn,syncer::tenancy::shards=info\nexec {} \"$@\"\n",
            kubeconfig.display(),
            binary.display()
        ),
    )?;
    std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
    let mut process = ManagedProcess::start(name, &wrapper, args, dir.join(&format!("{name}.log")))?;
    process
        .wait_ready(Duration::from_secs(120), || async move {
            http_get(admin_port, "/readyz")
                .await
                .is_some_and(|b| b.contains("ok"))
        })
        .await?;
    Ok(Replica { process, admin_port })
}

async fn create_pods(
    client: Client,
    tenant: String,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<Vec<(String, Instant)>> {
    let api: Api<Pod> = Api::namespaced(client, "bench");
    futures::stream::iter(0..count)
        .map(|i| {
            let (api, key) = (api.clone(), format!("{tenant}/pod-{i}"));
            async move {
                let at = Instant::now();
                let mut tries = 0;
                loop {
                    match api
                        .create(&PostParams::default(), &pod(&format!("pod-{i}")))
                        .await
                    {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 => break,
                        Err(_) if tries < 20 => {
                            tries += 1;
                            tokio::time::sleep(Duration::from_millis(200)).await;
                        }
                        Err(e) => return Err(anyhow::Error::from(e).context(format!("creating {key}"))),
                    }
                }
                anyhow::Ok((key, at))
            }
        })
        .buffer_unordered(concurrency)
        .try_collect()
        .await
}

async fn wait_all(seen: &Arc<Mutex<Seen>>, keys: &[String], running: bool, what: &str) -> anyhow::Result<()> {
    wait::until_true(Duration::from_secs(1800), what, || {
        let seen = seen.lock().expect("lock");
        let map = if running { &seen.running } else { &seen.created };
        let all = keys.iter().all(|k| map.contains_key(k));
        async move { all }
    })
    .await?;
    Ok(())
}

fn latencies(started: &HashMap<String, Instant>, done: &HashMap<String, Instant>) -> Vec<f64> {
    started
        .iter()
        .filter_map(|(k, at)| done.get(k).map(|d| d.duration_since(*at).as_secs_f64()))
        .collect()
}

async fn run(args: &Args, binary: &Path, replicas: usize) -> anyhow::Result<String> {
    let tenants = replicas * args.tenants_per_replica;
    let total = tenants * args.pods;
    let tenancy = Tenancy::start(TenancyOptions {
        tenants,
        nodes: args.nodes,
        tenant_controllers: Some("serviceaccount,serviceaccount-token,namespace,garbagecollector".into()),
        apiserver_args: vec![
            "--max-requests-inflight=2000".into(),
            "--max-mutating-requests-inflight=1000".into(),
        ],
        ..TenancyOptions::default()
    })
    .await?;
    let dir = WorkDir::new(&format!("bench-shards-{replicas}"))?;
    let kubeconfig = tenancy.super_cluster.apiserver().kubeconfig_path().to_owned();
    let mut running = Vec::new();
    for i in 0..replicas {
        running.push(
            start_replica(
                binary,
                &kubeconfig,
                &dir,
                &format!("syncer-{i}"),
                args.downward_workers,
            )
            .await?,
        );
    }
    // Every replica sees every other, and every tenant is held by one replica: the same shares twice in a
    // row, a renew period apart (the first replica up takes every tenant until the others join).
    let ports: Vec<u16> = running.iter().map(|r| r.admin_port).collect();
    let settle = Instant::now();
    let last: Arc<Mutex<Option<Vec<usize>>>> = Arc::default();
    let shares = wait::until(Duration::from_secs(180), "every tenant held by a replica", || {
        let ports = ports.clone();
        let last = last.clone();
        let read = async move {
            let mut shares = Vec::new();
            for port in &ports {
                if metric(*port, "syncer_shard_members").await? as usize != ports.len() {
                    return None;
                }
                shares.push(metric(*port, "syncer_shard_owned_tenants").await? as usize);
            }
            (shares.iter().sum::<usize>() == tenants).then_some(shares)
        };
        async move {
            let shares = read.await;
            let previous = std::mem::replace(&mut *last.lock().expect("lock"), shares.clone());
            let stable = shares.is_some() && shares == previous;
            if !stable {
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            shares.filter(|_| stable)
        }
    })
    .await?;
    let settled = settle.elapsed().as_secs_f64();
    for tenant in &tenancy.tenants {
        let client = tenant.client();
        let namespace: Namespace =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "bench"}}))?;
        match Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let accounts: Api<ServiceAccount> = Api::namespaced(client, "bench");
        wait::until_true(Duration::from_secs(120), "default ServiceAccount", || {
            let accounts = accounts.clone();
            async move { matches!(accounts.get_opt("default").await, Ok(Some(_))) }
        })
        .await?;
    }
    // Let attach-time work settle before measuring.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let (super_seen, super_task) = observe(tenancy.super_client(), |p| {
        let annotations = p.metadata.annotations.as_ref()?;
        Some(format!(
            "{}/{}",
            annotations.get(crds::wellknown::ANNOTATION_VC_NAME)?,
            p.name_any()
        ))
    });
    let mut tenant_seens = Vec::new();
    let mut tasks = vec![super_task];
    for tenant in &tenancy.tenants {
        let name = tenant.name.clone();
        let (seen, task) = observe(tenant.client(), move |p| Some(format!("{name}/{}", p.name_any())));
        tenant_seens.push(seen);
        tasks.push(task);
    }
    let pids: Vec<u32> = running.iter().filter_map(|r| r.process.pid()).collect();
    let cpu_before: Vec<f64> = pids.iter().map(|p| cpu_seconds(*p)).collect();
    let started_at = Instant::now();
    let creators = tenancy
        .tenants
        .iter()
        .map(|t| create_pods(t.client(), t.name.clone(), args.pods, args.concurrency));
    let started: HashMap<String, Instant> = futures::future::try_join_all(creators)
        .await?
        .into_iter()
        .flatten()
        .collect();
    let keys: Vec<String> = started.keys().cloned().collect();
    wait_all(&super_seen, &keys, false, "every pod in the super cluster").await?;
    let all_super = started_at.elapsed().as_secs_f64();
    let tenant_running = Arc::new(Mutex::new(Seen::default()));
    wait::until_true(Duration::from_secs(1800), "every tenant pod Running", || {
        let mut merged = tenant_running.lock().expect("lock");
        for seen in &tenant_seens {
            let seen = seen.lock().expect("lock");
            merged
                .running
                .extend(seen.running.iter().map(|(k, v)| (k.clone(), *v)));
        }
        let all = keys.iter().all(|k| merged.running.contains_key(k));
        async move { all }
    })
    .await?;
    let all_running = started_at.elapsed().as_secs_f64();
    let cpu: Vec<f64> = pids
        .iter()
        .zip(&cpu_before)
        .map(|(p, b)| cpu_seconds(*p) - b)
        .collect();
    let rss: Vec<u64> = pids.iter().map(|p| rss_kib(*p) / 1024).collect();
    let mut to_super = latencies(&started, &super_seen.lock().expect("lock").created);
    let mut to_running = latencies(&started, &tenant_running.lock().expect("lock").running);
    for task in tasks {
        task.abort();
    }
    if to_super.len() != total {
        bail!("{} of {total} pods seen in the super cluster", to_super.len());
    }
    Ok(format!(
        "| {replicas} | {tenants} | {total} | {shares:?} ({settled:.1} s) | {all_super:.1} s | {all_running:.1} s ({:.0} pods/s) | {:.2} / {:.2} s | {:.1} / {:.1} s | {} | {} |",
        total as f64 / all_running,
        percentile(&mut to_super, 0.5),
        percentile(&mut to_super, 0.99),
        percentile(&mut to_running, 0.5),
        percentile(&mut to_running, 0.99),
        cpu.iter()
            .map(|c| format!("{c:.1}"))
            .collect::<Vec<_>>()
            .join(" + "),
        rss.iter().map(|r| format!("{r}")).collect::<Vec<_>>().join(" + "),
    ))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !local_cluster::require(
        "bench_shards",
        &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager],
    ) {
        return Ok(());
    }
    let binary = match &args.syncer {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("syncer"),
    };
    if !binary.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p syncer`",
            binary.display()
        );
    }
    println!(
        "sharded syncer benchmark: {} tenants per replica x {} pods, {} simulated nodes, {} pods in flight per tenant, {} downward workers per replica",
        args.tenants_per_replica, args.pods, args.nodes, args.concurrency, args.downward_workers
    );
    let mut rows = Vec::new();
    for replicas in &args.replicas {
        let row = run(&args, &binary, *replicas)
            .await
            .with_context(|| format!("the run with {replicas} replicas"))?;
        println!("{row}");
        rows.push(row);
    }
    println!();
    println!(
        "| replicas | tenants | pods | tenants per replica (settled in) | all in super | all Running (throughput) | create → super pod p50 / p99 | create → tenant Running p50 / p99 | replica CPU s | replica RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for row in rows {
        println!("{row}");
    }
    Ok(())
}
