//! Attach benchmark: how long until many idle tenants are attached, and what each idle tenant costs the
//! syncer (memory, threads, connections, watches, CPU and requests while idle).
//!
//! Real: the super cluster (apiserver, controller-manager, one simulated node), the syncer (its own release
//! process, so its memory is its own), every VirtualCluster with its own kubeconfig Secret, and every
//! tenant's client, connections, watches, caches and health checks in the syncer. Shared: a few real tenant
//! control planes (apiserver and controller-manager, `--apiservers`) serve all the VirtualClusters, round
//! robin; 1,000 apiservers do not fit on the machines this runs on. A tenant sharing an apiserver sees what
//! a fresh tenant has (its default namespaces, service accounts, ConfigMaps, the `kubernetes` Service), and
//! the syncer copies that into the tenant's own super namespaces, as it would for separate apiservers.
//!
//! What sharing changes: each tenant's `default/kubernetes` Service is one object for all the tenants of
//! its apiserver, and each writes the cluster IP of its own super copy onto it (annotation
//! `tenancy.x-k8s.io/super-cluster-ip`): they overwrite each other without end. That churn shows in the
//! idle tenant requests (`APPLY services`) and the idle CPU; with one apiserver per tenant
//! (`--apiservers` equal to the tenants) there is none. Connections, watches and memory per tenant are
//! what separate apiservers would cost.
//!
//! Build both first: `cargo build --release -p syncer -p e2e`, then
//! `target/release/bench_attach --steps 10,100,1000`.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, Endpoints, Namespace, Secret, Service, ServiceAccount};
use kube::{Api, Client, ResourceExt, api::ListParams};
use local_cluster::bench::{OpenFiles, open_files, percentile, port_of};
use local_cluster::{
    Binary, ControlPlane, ControlPlaneOptions, ManagedProcess, WorkDir, free_port,
    tenancy::{Tenancy, TenancyOptions, VC_NAMESPACE},
    wait,
};

#[derive(Parser, Debug)]
#[command(about = "Attach many idle tenants to one syncer and measure what each costs")]
struct Args {
    /// Tenants attached in total after each step (ascending).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    steps: Vec<usize>,
    /// Real tenant apiservers the VirtualClusters lead to, round robin.
    #[arg(long, default_value_t = 4)]
    apiservers: usize,
    /// Seconds of the idle window after each step (CPU, requests); at least two health-check periods.
    #[arg(long, default_value_t = 90)]
    idle_seconds: u64,
    /// VirtualClusters created at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Seconds a step may take to attach and settle.
    #[arg(long, default_value_t = 1200)]
    timeout_seconds: u64,
    /// The syncer binary (default: `syncer` next to this binary).
    #[arg(long)]
    syncer: Option<PathBuf>,
    /// More syncer flags, e.g. `--syncer-arg=--tenant-http2=false` (repeat for each).
    #[arg(long = "syncer-arg", allow_hyphen_values = true)]
    syncer_args: Vec<String>,
}

/// CPU seconds a process has used so far (user + system).
fn cpu_seconds(pid: u32) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // The command name is in parentheses and may hold spaces: count fields after it.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

fn cpu_of(pids: &[u32]) -> f64 {
    pids.iter().map(|p| cpu_seconds(*p)).sum()
}

/// A field of `/proc/<pid>/status` (`VmRSS:`, `Threads:`), as a number.
fn status_field(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find(|l| l.starts_with(field))?
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        })
        .unwrap_or(0)
}

/// Lines of an apiserver's `/metrics`.
async fn metrics_of(client: &Client) -> String {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a static request is valid");
    client.request_text(request).await.unwrap_or_default()
}

/// The value of `label` in a Prometheus label set `a="x",b="y"`.
fn label<'a>(labels: &'a str, name: &str) -> &'a str {
    labels
        .split("\",")
        .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
        .map(|v| v.trim_end_matches('"'))
        .unwrap_or_default()
}

/// Watches open on apiservers (`apiserver_longrunning_requests{verb="WATCH"}`), summed.
async fn watches(clients: &[Client]) -> f64 {
    let mut total = 0.0;
    for client in clients {
        for line in metrics_of(client).await.lines() {
            let Some((labels, value)) = line
                .strip_prefix("apiserver_longrunning_requests{")
                .and_then(|rest| rest.rsplit_once("} "))
            else {
                continue;
            };
            if label(labels, "verb") == "WATCH" {
                total += value.parse::<f64>().unwrap_or(0.0);
            }
        }
    }
    total
}

/// `apiserver_request_total` of some apiservers by verb and resource (`/version` and other paths without a
/// resource count under their verb alone).
async fn request_counts(clients: &[Client]) -> BTreeMap<String, f64> {
    let mut counts = BTreeMap::new();
    for client in clients {
        for line in metrics_of(client).await.lines() {
            let Some((labels, value)) = line
                .strip_prefix("apiserver_request_total{")
                .and_then(|rest| rest.rsplit_once("} "))
            else {
                continue;
            };
            let mut key = format!("{} {}", label(labels, "verb"), label(labels, "resource"));
            let subresource = label(labels, "subresource");
            if !subresource.is_empty() {
                key.push('/');
                key.push_str(subresource);
            }
            *counts.entry(key.trim().to_owned()).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    counts
}

/// Requests between two snapshots, per tenant and minute, largest first.
fn requests_per_tenant_minute(
    before: &BTreeMap<String, f64>,
    after: &BTreeMap<String, f64>,
    tenants: usize,
    seconds: f64,
) -> String {
    let scale = 60.0 / seconds / tenants.max(1) as f64;
    let mut deltas: Vec<(&String, f64)> = after
        .iter()
        .map(|(k, v)| (k, v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d >= 1.0)
        .collect();
    deltas.sort_by(|a, b| b.1.total_cmp(&a.1));
    let total: f64 = deltas.iter().map(|(_, d)| d).sum();
    let top: Vec<String> = deltas
        .iter()
        .take(6)
        .map(|(k, d)| format!("{k} {:.2}", d * scale))
        .collect();
    format!("{:.2} ({})", total * scale, top.join(", "))
}

/// A syncer process and its admin endpoint.
struct SyncerProcess {
    process: ManagedProcess,
    admin_port: u16,
}

impl SyncerProcess {
    async fn start(
        binary: &Path,
        kubeconfig: &Path,
        dir: &WorkDir,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let admin_port = free_port()?;
        let mut args = vec![
            "--leader-elect=false".to_owned(),
            format!("--admin-address=127.0.0.1:{admin_port}"),
        ];
        args.extend(extra.iter().cloned());
        // The syncer reads KUBECONFIG; a small wrapper passes it on.
        let wrapper = dir.write(
            "syncer.sh",
            format!(
                "#!/bin/sh\nexport KUBECONFIG={}\nexport RUST_LOG=warn\nexec {} \"$@\"\n",
                kubeconfig.display(),
                binary.display()
            ),
        )?;
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let mut process = ManagedProcess::start("syncer", &wrapper, args, dir.join("syncer.log"))?;
        process
            .wait_ready(Duration::from_secs(120), || async move {
                http_get(admin_port, "/readyz")
                    .await
                    .is_some_and(|b| b.contains("ok"))
            })
            .await?;
        Ok(Self { process, admin_port })
    }

    fn pid(&self) -> u32 {
        self.process.pid().unwrap_or(0)
    }

    /// Sum of a syncer series (all label sets), NaN if the endpoint does not answer.
    async fn metric_sum(&self, name: &str) -> f64 {
        let Some(body) = http_get(self.admin_port, "/metrics").await else {
            return f64::NAN;
        };
        body.lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| l.strip_prefix(name).is_some_and(|r| r.starts_with(['{', ' '])))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

async fn http_get(port: u16, path: &str) -> Option<String> {
    local_cluster::bench::admin_get(port, path, Duration::from_secs(30)).await
}

fn syncer_binary(args: &Args) -> anyhow::Result<PathBuf> {
    let path = match &args.syncer {
        Some(path) => path.clone(),
        None => std::env::current_exe()?.with_file_name("syncer"),
    };
    if !path.exists() {
        bail!(
            "{} not found: build it with `cargo build --release -p syncer`",
            path.display()
        );
    }
    Ok(path)
}

/// Objects and their JSON bytes, by kind, that one tenant apiserver shows (what each tenant leading to it
/// has for the syncer to cache).
async fn tenant_contents(client: &Client) -> anyhow::Result<(usize, usize, String)> {
    async fn kind<K>(client: &Client, name: &str, out: &mut Vec<(String, usize, usize)>) -> anyhow::Result<()>
    where
        K: kube::Resource<DynamicType = (), Scope = k8s_openapi::NamespaceResourceScope>
            + Clone
            + serde::de::DeserializeOwned
            + serde::Serialize
            + std::fmt::Debug,
    {
        let list = Api::<K>::all(client.clone()).list(&ListParams::default()).await?;
        let bytes = list
            .items
            .iter()
            .map(|o| serde_json::to_vec(o).map(|v| v.len()).unwrap_or(0))
            .sum();
        out.push((name.to_owned(), list.items.len(), bytes));
        Ok(())
    }
    let mut out = Vec::new();
    let namespaces = Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await?;
    out.push((
        "namespaces".to_owned(),
        namespaces.items.len(),
        namespaces
            .items
            .iter()
            .map(|o| serde_json::to_vec(o).map(|v| v.len()).unwrap_or(0))
            .sum(),
    ));
    kind::<ServiceAccount>(client, "serviceaccounts", &mut out).await?;
    kind::<ConfigMap>(client, "configmaps", &mut out).await?;
    kind::<Secret>(client, "secrets", &mut out).await?;
    kind::<Service>(client, "services", &mut out).await?;
    kind::<Endpoints>(client, "endpoints", &mut out).await?;
    let objects = out.iter().map(|(_, n, _)| n).sum();
    let bytes = out.iter().map(|(_, _, b)| b).sum();
    let detail = out
        .iter()
        .map(|(k, n, b)| format!("{n} {k} ({:.1} KiB)", *b as f64 / 1024.0))
        .collect::<Vec<_>>()
        .join(", ");
    Ok((objects, bytes, detail))
}

/// VirtualClusters whose `TenantSynced` is `True`, by name.
async fn attached_names(api: &Api<crds::VirtualCluster>) -> HashSet<String> {
    let Ok(list) = api.list(&ListParams::default()).await else {
        return HashSet::new();
    };
    list.items
        .into_iter()
        .filter(|vc| {
            vc.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == crds::wellknown::CONDITION_TENANT_SYNCED && c.status == "True")
            })
        })
        .map(|vc| vc.name_any())
        .collect()
}

/// What one sample of the syncer at rest shows.
struct Sample {
    tenants: usize,
    rss_kib: u64,
    threads: u64,
    open: OpenFiles,
    tenant_watches: f64,
    super_watches: f64,
    cpu_per_minute: f64,
    super_cpu_per_minute: f64,
    tenant_cpu_per_minute: f64,
    super_requests: String,
    tenant_requests: String,
}

struct Setup {
    tenancy: Tenancy,
    masters: Vec<ControlPlane>,
    syncer: SyncerProcess,
    tenant_watches_before: f64,
    super_watches_before: f64,
}

impl Setup {
    fn tenant_clients(&self) -> Vec<Client> {
        self.masters.iter().map(ControlPlane::client).collect()
    }

    fn tenant_ports(&self) -> HashSet<u16> {
        self.masters
            .iter()
            .map(|m| port_of(m.apiserver().url()))
            .collect()
    }

    /// Waits `seconds` with nothing happening and samples the syncer.
    async fn idle_sample(&self, tenants: usize, seconds: u64) -> Sample {
        let super_client = self.tenancy.super_client();
        let tenant_clients = self.tenant_clients();
        let syncer_pid = self.syncer.pid();
        let super_pid = self
            .tenancy
            .super_cluster
            .apiserver()
            .process()
            .pid()
            .unwrap_or(0);
        let tenant_pids: Vec<u32> = self
            .masters
            .iter()
            .filter_map(|m| m.apiserver().process().pid())
            .collect();
        let super_before = request_counts(std::slice::from_ref(&super_client)).await;
        let tenant_before = request_counts(&tenant_clients).await;
        let cpu_before = (
            cpu_seconds(syncer_pid),
            cpu_seconds(super_pid),
            cpu_of(&tenant_pids),
        );
        let started = Instant::now();
        tokio::time::sleep(Duration::from_secs(seconds)).await;
        let wall = started.elapsed().as_secs_f64();
        let per_minute = 60.0 / wall;
        let cpu_after = (
            cpu_seconds(syncer_pid),
            cpu_seconds(super_pid),
            cpu_of(&tenant_pids),
        );
        let super_after = request_counts(std::slice::from_ref(&super_client)).await;
        let tenant_after = request_counts(&tenant_clients).await;
        Sample {
            tenants,
            rss_kib: status_field(syncer_pid, "VmRSS:"),
            threads: status_field(syncer_pid, "Threads:"),
            open: open_files(syncer_pid),
            tenant_watches: watches(&tenant_clients).await - self.tenant_watches_before,
            super_watches: watches(std::slice::from_ref(&super_client)).await - self.super_watches_before,
            cpu_per_minute: (cpu_after.0 - cpu_before.0) * per_minute,
            super_cpu_per_minute: (cpu_after.1 - cpu_before.1) * per_minute,
            tenant_cpu_per_minute: (cpu_after.2 - cpu_before.2) * per_minute,
            super_requests: requests_per_tenant_minute(&super_before, &super_after, tenants, wall),
            tenant_requests: requests_per_tenant_minute(&tenant_before, &tenant_after, tenants, wall),
        }
    }

    fn print_sample(&self, sample: &Sample, idle: Option<&Sample>) {
        let super_port = port_of(self.tenancy.super_cluster.apiserver().url());
        let tenant_ports = self.tenant_ports();
        let tcp = &sample.open.tcp_by_port;
        let to_super = tcp.get(&super_port).copied().unwrap_or(0);
        let to_tenants: usize = tcp
            .iter()
            .filter(|(p, _)| tenant_ports.contains(p))
            .map(|(_, n)| n)
            .sum();
        println!(
            "  syncer: RSS {} KiB, threads {}, fds {}, sockets {}, TCP to super {to_super}, TCP to tenant apiservers {to_tenants}",
            sample.rss_kib, sample.threads, sample.open.fds, sample.open.sockets
        );
        println!(
            "  watches the syncer holds: tenant apiservers {:.0}, super {:.0}",
            sample.tenant_watches, sample.super_watches
        );
        println!(
            "  idle CPU, seconds per minute: syncer {:.2}, super apiserver {:.2}, tenant apiservers {:.2}",
            sample.cpu_per_minute, sample.super_cpu_per_minute, sample.tenant_cpu_per_minute
        );
        if sample.tenants == 0 {
            return;
        }
        let n = sample.tenants as f64;
        println!(
            "  idle requests per tenant per minute: super {}; tenant {}",
            sample.super_requests, sample.tenant_requests
        );
        if let Some(idle) = idle {
            let idle_tcp: usize = idle.open.tcp_by_port.values().sum();
            let tcp_total: usize = tcp.values().sum();
            println!(
                "  per tenant: {:.1} KiB RSS, {:.3} threads, {:.2} fds, {:.2} TCP connections ({:.2} to its apiserver), {:.2} watches, {:.2} ms CPU per minute",
                (sample.rss_kib as f64 - idle.rss_kib as f64) / n,
                (sample.threads as f64 - idle.threads as f64) / n,
                (sample.open.fds as f64 - idle.open.fds as f64) / n,
                (tcp_total as f64 - idle_tcp as f64) / n,
                to_tenants as f64 / n,
                sample.tenant_watches / n,
                (sample.cpu_per_minute - idle.cpu_per_minute) * 1000.0 / n,
            );
        }
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !local_cluster::require(
        "bench_attach",
        &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager],
    ) {
        return Ok(());
    }
    let syncer_binary = syncer_binary(&args)?;
    let mut steps = args.steps.clone();
    steps.sort_unstable();
    steps.dedup();
    let apiserver_args = vec![
        "--max-requests-inflight=2000".to_owned(),
        "--max-mutating-requests-inflight=1000".to_owned(),
    ];
    println!(
        "attach benchmark: steps {steps:?} tenants, {} real tenant apiservers shared round robin, idle window {}s, syncer flags {:?}",
        args.apiservers, args.idle_seconds, args.syncer_args
    );

    let setup_started = Instant::now();
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: 0,
        nodes: 1,
        apiserver_args: apiserver_args.clone(),
        ..TenancyOptions::default()
    })
    .await?;
    let mut masters = Vec::new();
    for i in 0..args.apiservers.max(1) {
        let mut options = ControlPlaneOptions::tenant(&format!("shared-{i}"));
        options
            .apiserver
            .extra_args
            .extend(apiserver_args.iter().cloned());
        masters.push(ControlPlane::start_on(tenancy.etcd.clone(), options).await?);
    }
    // A fresh tenant's contents: its controller-manager gives every namespace its service account and
    // root CA ConfigMap.
    for master in &masters {
        let client = master.client();
        wait::until_true(Duration::from_secs(120), "a tenant's default objects", || {
            let client = client.clone();
            async move {
                let accounts = Api::<ServiceAccount>::namespaced(client.clone(), "kube-public");
                let roots = Api::<ConfigMap>::namespaced(client, "kube-node-lease");
                matches!(accounts.get_opt("default").await, Ok(Some(_)))
                    && matches!(roots.get_opt("kube-root-ca.crt").await, Ok(Some(_)))
            }
        })
        .await?;
    }
    // Controller-managers settle (their service-account tokens, leases) before the baseline.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (objects, bytes, detail) = tenant_contents(&masters[0].client()).await?;
    println!(
        "setup: {:.1}s; each tenant sees {objects} objects, {:.1} KiB as JSON: {detail}",
        setup_started.elapsed().as_secs_f64(),
        bytes as f64 / 1024.0
    );

    let super_client = tenancy.super_client();
    let tenant_clients: Vec<Client> = masters.iter().map(ControlPlane::client).collect();
    let tenant_watches_before = watches(&tenant_clients).await;
    let super_watches_before = watches(std::slice::from_ref(&super_client)).await;
    let dir = WorkDir::new("bench-attach")?;
    let kubeconfig = tenancy.super_cluster.apiserver().kubeconfig_path().to_owned();
    let syncer = SyncerProcess::start(&syncer_binary, &kubeconfig, &dir, &args.syncer_args).await?;
    let setup = Setup {
        tenancy,
        masters,
        syncer,
        tenant_watches_before,
        super_watches_before,
    };
    // The syncer's own start (super caches listing) is not idle yet.
    tokio::time::sleep(Duration::from_secs(10)).await;
    println!("0 tenants (the syncer alone, its super caches listed):");
    let idle = setup.idle_sample(0, args.idle_seconds).await;
    setup.print_sample(&idle, None);

    let vcs: Api<crds::VirtualCluster> = Api::namespaced(super_client.clone(), VC_NAMESPACE);
    let kubeconfigs: Vec<String> = setup
        .masters
        .iter()
        .map(|m| m.apiserver().admin_kubeconfig())
        .collect();
    let mut samples = Vec::new();
    let mut created = 0;
    for &target in &steps {
        if target <= created {
            continue;
        }
        let names: Vec<String> = (created..target).map(|i| format!("attach-{i:04}")).collect();
        let writes_before = setup.syncer.metric_sum("syncer_super_writes_total").await;
        let started = Instant::now();
        // Each VirtualCluster with its own Secret, as a platform would register them.
        let created_at: HashMap<String, Instant> = futures::stream::iter(names.iter().enumerate())
            .map(|(i, name)| {
                let kubeconfig = &kubeconfigs[(created + i) % kubeconfigs.len()];
                let tenancy = &setup.tenancy;
                async move {
                    tenancy
                        .register(name, kubeconfig, crds::VirtualClusterSpec::default())
                        .await
                        .with_context(|| format!("registering {name}"))?;
                    anyhow::Ok((name.clone(), Instant::now()))
                }
            })
            .buffer_unordered(args.concurrency)
            .try_collect()
            .await?;
        let all_created = started.elapsed().as_secs_f64();
        let mut attached_at: HashMap<String, Instant> = HashMap::new();
        let deadline = started + Duration::from_secs(args.timeout_seconds);
        while attached_at.len() < names.len() {
            if Instant::now() > deadline {
                bail!(
                    "{} of {} tenants attached after {}s; see {}",
                    attached_at.len(),
                    names.len(),
                    args.timeout_seconds,
                    dir.join("syncer.log").display()
                );
            }
            let now = Instant::now();
            for name in attached_names(&vcs).await {
                if created_at.contains_key(&name) {
                    attached_at.entry(name).or_insert(now);
                }
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let all_attached = attached_at
            .values()
            .max()
            .map_or(0.0, |t| t.duration_since(started).as_secs_f64());
        let mut latencies: Vec<f64> = attached_at
            .iter()
            .map(|(name, at)| at.duration_since(created_at[name]).as_secs_f64())
            .collect();
        println!(
            "{target} tenants (+{}): created in {all_created:.1}s; all TenantSynced=True {all_attached:.1}s after the first create (create -> attached p50 {:.2}s, p99 {:.2}s)",
            names.len(),
            percentile(&mut latencies, 0.5),
            percentile(&mut latencies, 0.99),
        );
        // Settled: no super write for 10 s (the tenants' objects are all copied). Tenants sharing an
        // apiserver keep writing their own super cluster IP onto its `default/kubernetes` Service (see
        // the module's note), so the queues need not run empty.
        let mut last_writes = f64::NAN;
        let mut quiet_since = Instant::now();
        loop {
            let writes = setup.syncer.metric_sum("syncer_super_writes_total").await;
            if writes != last_writes {
                last_writes = writes;
                quiet_since = Instant::now();
            } else if quiet_since.elapsed() >= Duration::from_secs(10) {
                break;
            }
            if Instant::now() > deadline {
                // Sampled anyway: the figures then include the copying still under way.
                println!(
                    "  not settled within {}s of the first create; sampling while it still writes",
                    args.timeout_seconds
                );
                quiet_since = Instant::now();
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let settled = quiet_since.duration_since(started).as_secs_f64();
        let new = names.len();
        let writes = last_writes - writes_before;
        created = target;
        let super_namespaces = Api::<Namespace>::all(super_client.clone())
            .list_metadata(&ListParams::default())
            .await?
            .items
            .len();
        println!(
            "  settled {settled:.1}s after the first create: {writes:.0} super writes ({:.1} per new tenant), {super_namespaces} super namespaces",
            writes / new as f64,
        );
        let sample = setup.idle_sample(target, args.idle_seconds).await;
        setup.print_sample(&sample, Some(&idle));
        samples.push((sample, all_attached, settled));
    }

    println!();
    println!(
        "| tenants | all attached | settled | RSS KiB | KiB/tenant | threads | fds | TCP to tenants | watches/tenant | syncer CPU s/min idle |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let tenant_ports = setup.tenant_ports();
    println!(
        "| 0 | | | {} | | {} | {} | 0 | | {:.2} |",
        idle.rss_kib, idle.threads, idle.open.fds, idle.cpu_per_minute
    );
    for (sample, attached, settled) in &samples {
        let to_tenants: usize = sample
            .open
            .tcp_by_port
            .iter()
            .filter(|(p, _)| tenant_ports.contains(p))
            .map(|(_, n)| n)
            .sum();
        println!(
            "| {} | {attached:.1}s | {settled:.1}s | {} | {:.1} | {} | {} | {to_tenants} | {:.1} | {:.2} |",
            sample.tenants,
            sample.rss_kib,
            (sample.rss_kib as f64 - idle.rss_kib as f64) / sample.tenants as f64,
            sample.threads,
            sample.open.fds,
            sample.tenant_watches / sample.tenants as f64,
            sample.cpu_per_minute,
        );
    }
    Ok(())
}
