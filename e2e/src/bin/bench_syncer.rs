//! Syncer benchmark on real apiservers with simulated nodes. Prints, in one run:
//!
//! - a direct baseline (the same pods created straight into the super cluster by a plain client) against
//!   the same pods created in T tenants and synced, for throughput and latency;
//! - the syncer's peak RSS and bytes per synced pod;
//! - a restart with everything synced (writes issued, seconds until ready);
//! - a fairness run: greedy tenants burst while regular tenants create pods one at a time;
//! - where the cost went: requests per pod by apiserver, verb and resource, and CPU seconds per pod of
//!   every process.
//!
//! `--topology` places the processes: `shared` (everything on every core, tenants on the super cluster's
//! etcd), `split` (closer to production, where tenant control planes run on other machines: the super
//! cluster's etcd, apiserver, controller-manager and simulated nodes on CPU 0; the tenants' own etcd and
//! control planes, the syncer and the bench's clients on CPU 1), or `both` (default), one after the other.
//! Pinning is read back from every thread's `Cpus_allowed_list` and printed.
//!
//! The syncer runs as its own process (the release binary next to this one), so that its memory is its
//! own. Build both first: `cargo build --release -p syncer -p e2e`, then
//! `target/release/bench_syncer --tenants 10 --pods 500`.

use std::{
    collections::{BTreeMap, HashMap},
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{Context, bail};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{DeleteParams, PostParams},
    runtime::{WatchStreamExt, watcher},
};
use local_cluster::bench::{open_files, percentile, port_of};
use local_cluster::{
    Binary, ManagedProcess, WorkDir, cpus, free_port,
    tenancy::{Tenancy, TenancyOptions},
    wait,
};

#[derive(Parser, Debug)]
#[command(about = "Benchmark the syncer against a direct baseline on real apiservers")]
struct Args {
    /// Tenants (T).
    #[arg(long, default_value_t = 10)]
    tenants: usize,
    /// Pods per tenant (P).
    #[arg(long, default_value_t = 500)]
    pods: usize,
    /// Simulated super nodes.
    #[arg(long, default_value_t = 10)]
    nodes: usize,
    /// Pods each creator has in flight at once.
    #[arg(long, default_value_t = 8)]
    concurrency: usize,
    /// Greedy tenants in the fairness run (taken from the T tenants).
    #[arg(long, default_value_t = 3)]
    greedy: usize,
    /// Pods each greedy tenant bursts.
    #[arg(long, default_value_t = 900)]
    greedy_pods: usize,
    /// Regular tenants in the fairness run.
    #[arg(long, default_value_t = 3)]
    regular: usize,
    /// Pods each regular tenant creates, one at a time.
    #[arg(long, default_value_t = 10)]
    regular_pods: usize,
    /// The syncer binary (default: `syncer` next to this binary).
    #[arg(long)]
    syncer: Option<PathBuf>,
    /// The syncer's log filter (`RUST_LOG`), e.g. `info` to see why it did what it did.
    #[arg(long, default_value = "warn")]
    syncer_log: String,
    /// One more syncer flag (repeatable), e.g. `--syncer-arg=--super-write-slots=0`.
    #[arg(long, allow_hyphen_values = true)]
    syncer_arg: Vec<String>,
    /// Where processes run: `shared` (everything on every core, one etcd), `split` (super cluster and
    /// simulated nodes on CPU 0; tenants on their own etcd, syncer and clients on CPU 1), or `both`.
    #[arg(long, value_enum, default_value_t = Topology::Both)]
    topology: Topology,
    /// Write CPU profiles (Go pprof) of the super apiserver, one over the direct and one over the synced
    /// run's first `--profile-seconds`, and of the first tenant's apiserver over the synced run, into this
    /// folder (`go tool pprof -top FILE` reads them): where the CPU a synced pod costs goes. Turns on the
    /// apiservers' profiling endpoints.
    #[arg(long)]
    profile_dir: Option<PathBuf>,
    /// The syncer's niceness where processes are pinned (the others run at 5): in production the syncer's
    /// pod has a CPU request of its own, which a shared core's scheduler honours; at 5 it competes
    /// thread for thread with the tenant control planes beside it.
    #[arg(long, default_value_t = PINNED_NICENESS, allow_hyphen_values = true)]
    syncer_nice: i32,
    /// Seconds each profile covers.
    #[arg(long, default_value_t = 20)]
    profile_seconds: u32,
    /// Seconds to wait once the synced run's figures are taken, before the syncer is stopped, with its
    /// pid printed: time to look into its heap (`gdb -p PID -batch -ex 'call (void) malloc_stats()'`).
    #[arg(long, default_value_t = 0)]
    pause_synced: u64,
    /// Write one Running pod of each kind (direct, synced in the super cluster, its tenant's), as read from
    /// its apiserver, into this folder (`direct.json`, `synced-super.json`, `synced-tenant.json`): what each
    /// byte of a pod is.
    #[arg(long)]
    dump_pod: Option<PathBuf>,
}

/// Records a CPU profile of the apiserver behind `client` over `seconds`, into `path`; a failure is
/// printed, never fatal (the figures do not depend on it).
fn capture_profile(client: Client, seconds: u32, path: PathBuf) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let request = http::Request::get(format!("/debug/pprof/profile?seconds={seconds}"))
            .body(Vec::new())
            .expect("a GET request");
        let outcome = async {
            let response = client.send(request.map(kube::client::Body::from)).await?;
            let status = response.status();
            let body = http_body_util::BodyExt::collect(response.into_body())
                .await?
                .to_bytes();
            anyhow::ensure!(
                status.is_success(),
                "HTTP {status}: {}",
                String::from_utf8_lossy(&body)
            );
            std::fs::write(&path, &body)?;
            anyhow::Ok(body.len())
        };
        match outcome.await {
            Ok(bytes) => println!("profile: {} ({bytes} bytes)", path.display()),
            Err(error) => println!("profile {} not written: {error:#}", path.display()),
        }
    })
}

/// One line on stderr as each step of a run begins, with the seconds since the bench started: where a run
/// that stops moving stopped is then in its output.
fn progress(step: &str) {
    static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let started = STARTED.get_or_init(Instant::now);
    eprintln!("bench +{:.1}s: {step}", started.elapsed().as_secs_f64());
}

/// Waits for a profile, for at most its length and a minute: a stuck profiling request must not hold up
/// the figures.
async fn finish_profile(profile: tokio::task::JoinHandle<()>, seconds: u32) {
    let limit = Duration::from_secs(u64::from(seconds) + 60);
    if tokio::time::timeout(limit, profile).await.is_err() {
        println!("a profile did not finish within {}s; left out", limit.as_secs());
    }
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": "bench"}},
        "spec": {"containers": [{"name": "main", "image": "busybox", "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}]}
    }))
    .expect("pod")
}

/// How long every process's idle CPU is sampled before the runs.
const IDLE_SAMPLE: Duration = Duration::from_secs(10);

fn mean(values: &[f64]) -> f64 {
    values.iter().sum::<f64>() / values.len().max(1) as f64
}

/// When each pod (by namespace/name) was first seen, and first seen Running, by a watch.
#[derive(Default)]
struct Seen {
    created: HashMap<String, Instant>,
    running: HashMap<String, Instant>,
}

/// Watches pods of `client` and records first sightings; `key` maps a pod to the benchmark's key.
fn observe(
    client: Client,
    key: impl Fn(&Pod) -> Option<String> + Send + 'static,
) -> (Arc<Mutex<Seen>>, tokio::task::JoinHandle<()>) {
    let seen = Arc::new(Mutex::new(Seen::default()));
    let task = {
        let seen = seen.clone();
        tokio::spawn(async move {
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
        })
    };
    (seen, task)
}

/// Creates `count` pods named `<prefix>-<i>` in `namespace` with `concurrency` in flight; returns when
/// each create was sent, by key `namespace/name`.
async fn create_pods(
    client: Client,
    namespace: String,
    prefix: &str,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<HashMap<String, Instant>> {
    let api: Api<Pod> = Api::namespaced(client, &namespace);
    let started: Vec<(String, Instant)> = futures::stream::iter(0..count)
        .map(|i| {
            let api = api.clone();
            let name = format!("{prefix}-{i}");
            let key = format!("{namespace}/{name}");
            async move {
                let at = Instant::now();
                let mut tries = 0;
                loop {
                    match api.create(&PostParams::default(), &pod(&name)).await {
                        Ok(_) => break,
                        Err(kube::Error::Api(s)) if s.code == 409 => break,
                        Err(e) if tries < 20 => {
                            tries += 1;
                            tracing::debug!(%e, "retrying a create");
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
        .await?;
    Ok(started.into_iter().collect())
}

async fn ensure_namespace(client: &Client, name: &str) -> anyhow::Result<()> {
    let namespace: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

async fn wait_count(
    seen: &Arc<Mutex<Seen>>,
    keys: &[String],
    running: bool,
    timeout: Duration,
    what: &str,
) -> anyhow::Result<()> {
    wait::until_true(timeout, what, || {
        let seen = seen.clone();
        let keys = keys.to_vec();
        async move {
            let seen = seen.lock().expect("lock");
            let map = if running { &seen.running } else { &seen.created };
            keys.iter().all(|k| map.contains_key(k))
        }
    })
    .await?;
    Ok(())
}

/// Throughput and latencies of one run.
struct RunFigures {
    pods: usize,
    seconds: f64,
    latencies: Vec<f64>,
}

impl RunFigures {
    fn throughput(&self) -> f64 {
        self.pods as f64 / self.seconds
    }
}

fn figures(started: &HashMap<String, Instant>, done: &HashMap<String, Instant>) -> RunFigures {
    let first = started.values().min().copied().unwrap_or_else(Instant::now);
    let last = started
        .keys()
        .filter_map(|k| done.get(k))
        .max()
        .copied()
        .unwrap_or(first);
    let latencies = started
        .iter()
        .filter_map(|(k, at)| done.get(k).map(|d| d.duration_since(*at).as_secs_f64()))
        .collect();
    RunFigures {
        pods: started.len(),
        seconds: last.duration_since(first).as_secs_f64().max(1e-3),
        latencies,
    }
}

/// CPU seconds the whole machine has been busy.
fn machine_busy_seconds() -> f64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = stat.lines().next() else {
        return 0.0;
    };
    let values: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal
    let busy: f64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|i| values.get(*i)).sum();
    busy / 100.0
}

/// Reads how many CPU seconds one part of the setup has used so far.
type CpuReader<'a> = Box<dyn Fn() -> f64 + Send + 'a>;

/// CPU seconds of some processes (every thread).
fn processes_cpu(pids: Vec<u32>) -> CpuReader<'static> {
    Box::new(move || {
        pids.iter()
            .map(|pid| cpus::cpu_seconds(&format!("/proc/{pid}/stat")))
            .sum()
    })
}

/// CPU used by each part of the setup during one phase.
struct CpuMeter<'a> {
    parts: Vec<(String, CpuReader<'a>, f64)>,
    machine: f64,
}

impl<'a> CpuMeter<'a> {
    fn start(parts: Vec<(String, CpuReader<'a>)>) -> Self {
        let parts = parts.into_iter().map(|(name, read)| {
            let used = read();
            (name, read, used)
        });
        Self {
            parts: parts.collect(),
            machine: machine_busy_seconds(),
        }
    }

    /// CPU seconds per second of each part since the start: its idle rate, when nothing was asked of it.
    fn rates(&self, wall: f64) -> HashMap<String, f64> {
        self.parts
            .iter()
            .map(|(name, read, before)| (name.clone(), (read() - before) / wall.max(1e-3)))
            .collect()
    }

    /// CPU seconds of each part, in total and per pod, and per pod above what the part burns idle over
    /// the same wall time (`idle`, from [`rates`](Self::rates)): ten idle apiservers on one core cost
    /// more than the pods do in a short run, and in production they run elsewhere.
    fn report(&self, phase: &str, wall: f64, pods: usize, idle: &HashMap<String, f64>) -> String {
        let machine = machine_busy_seconds() - self.machine;
        let mut text = format!(
            "{phase} CPU over {wall:.1}s wall: machine {machine:.1}s (whole machine, other users included)\n"
        );
        let per_pod = |seconds: f64| seconds * 1000.0 / pods.max(1) as f64;
        for (name, read, before) in &self.parts {
            let used = read() - before;
            let above_idle = used - idle.get(name).copied().unwrap_or(0.0) * wall;
            text.push_str(&format!(
                "    {name:<38} {used:7.1}s  {:8.2} ms/pod  {:8.2} ms/pod above idle\n",
                per_pod(used),
                per_pod(above_idle),
            ));
        }
        text
    }
}

/// Where the benchmark's processes run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Topology {
    /// Everything shares every core, and tenants share the super cluster's etcd (the old benchmark).
    Shared,
    /// Production-like: the super cluster (its etcd, apiserver, controller-manager and the simulated
    /// nodes) on CPU 0; the tenants (on their own etcd), the syncer and the clients on CPU 1.
    Split,
    /// Shared, then split.
    Both,
}

/// The niceness of every pinned process (the syncer's too): a saturated core still leaves the kernel's
/// per-CPU workers (nice 0) their share, see [`cpus::lower_priority`].
const PINNED_NICENESS: i32 = 5;

/// CPU lists of the two sides of a split topology (`None`: not pinned).
#[derive(Clone, Debug)]
struct Placement {
    name: &'static str,
    super_cpus: Option<String>,
    other_cpus: Option<String>,
}

impl Placement {
    fn of(topology: Topology) -> Vec<Self> {
        let shared = Self {
            name: "shared",
            super_cpus: None,
            other_cpus: None,
        };
        let split = Self {
            name: "split",
            super_cpus: Some("0".into()),
            other_cpus: Some("1".into()),
        };
        match topology {
            Topology::Shared => vec![shared],
            Topology::Split => vec![split],
            Topology::Both => vec![shared, split],
        }
    }

    fn pin(&self, pids: &[u32], super_side: bool) -> anyhow::Result<()> {
        let cpus = match super_side {
            true => &self.super_cpus,
            false => &self.other_cpus,
        };
        if let Some(cpus) = cpus {
            for pid in pids {
                cpus::pin_process(*pid, cpus)?;
                cpus::lower_priority(*pid, PINNED_NICENESS)?;
            }
        }
        Ok(())
    }
}

/// Seconds that the threads of process `pid` have run on a CPU and waited, runnable, for one
/// (`/proc/<pid>/task/*/schedstat`): a process whose work lags while it waits for a CPU shows it here.
fn scheduled_seconds(pid: Option<u32>) -> (f64, f64) {
    let Some(pid) = pid else {
        return (f64::NAN, f64::NAN);
    };
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return (f64::NAN, f64::NAN);
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .fold((0.0, 0.0), |(on_cpu, waiting), line| {
            let mut fields = line
                .split_whitespace()
                .map(|f| f.parse::<f64>().unwrap_or(0.0) / 1e9);
            (
                on_cpu + fields.next().unwrap_or(0.0),
                waiting + fields.next().unwrap_or(0.0),
            )
        })
}

/// Thread ids of this process that are not in `except`.
fn own_threads_except(except: &[u32]) -> Vec<u32> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .flatten()
                .filter_map(|t| t.file_name().to_str()?.parse::<u32>().ok())
                .filter(|tid| !except.contains(tid))
                .collect()
        })
        .unwrap_or_default()
}

/// A syncer process and its admin endpoint.
struct SyncerProcess {
    process: ManagedProcess,
    admin_port: u16,
}

impl Drop for SyncerProcess {
    fn drop(&mut self) {
        // Not reaped until the bench exits: the kernel's teardown of a syncer after a saturated run has taken
        // minutes of the bench's own core (see `ManagedProcess::kill_unreaped`).
        self.process.kill_unreaped();
    }
}

impl SyncerProcess {
    async fn start(
        binary: &Path,
        kubeconfig: &std::path::Path,
        dir: &WorkDir,
        name: &str,
        extra_args: &[String],
        pinned: Option<(&str, i32)>,
        log_filter: &str,
    ) -> anyhow::Result<(Self, f64)> {
        let admin_port = free_port()?;
        let mut args = vec![
            "--leader-elect=false".to_owned(),
            format!("--admin-address=127.0.0.1:{admin_port}"),
            "--patrol-interval-seconds=60".to_owned(),
        ];
        args.extend(extra_args.iter().cloned());
        // The syncer reads KUBECONFIG; a small wrapper passes it on, and pins it from its first thread.
        let pinned = pinned
            .map(|(cpus, niceness)| format!("nice -n {niceness} taskset -c {cpus} "))
            .unwrap_or_default();
        let wrapper = dir.write(
            &format!("{name}.sh"),
            format!(
                "#!/bin/sh\nexport KUBECONFIG={}\nexport RUST_LOG='{log_filter}'\nexec {pinned}{} \"$@\"\n",
                kubeconfig.display(),
                binary.display()
            ),
        )?;
        std::fs::set_permissions(&wrapper, std::os::unix::fs::PermissionsExt::from_mode(0o755))?;
        let started = Instant::now();
        let mut process = ManagedProcess::start(name, &wrapper, args, dir.join(&format!("{name}.log")))?;
        process
            .wait_ready(Duration::from_secs(120), || async move {
                http_get(admin_port, "/readyz")
                    .await
                    .is_some_and(|b| b.contains("ok"))
            })
            .await?;
        let ready = started.elapsed().as_secs_f64();
        Ok((Self { process, admin_port }, ready))
    }

    /// Fails, with how it ended and its log's end, once the syncer has exited: a bench must not wait an
    /// hour for pods a dead syncer will never sync. Its whole log is copied out of the work folder first.
    fn ensure_alive(&mut self, during: &str) -> anyhow::Result<()> {
        let Some(status) = self.process.exit_status() else {
            return Ok(());
        };
        let kept = std::env::temp_dir().join(format!(
            "bench-syncer-{}-{}.log",
            self.process.name(),
            std::process::id()
        ));
        let copied = std::fs::copy(self.process.log_path(), &kept).is_ok();
        bail!(
            "{} exited ({status}) while waiting for {during}; its whole log is at {}; it ends:\n{}",
            self.process.name(),
            if copied {
                kept.display().to_string()
            } else {
                "(not copied)".to_owned()
            },
            self.process.log_tail(40)
        )
    }

    /// The syncer's established TCP connections: to the super apiserver (at `super_port`), and to others
    /// (the tenant apiservers).
    fn connections(&self, super_port: u16) -> (usize, usize) {
        let Some(pid) = self.process.pid() else {
            return (0, 0);
        };
        let tcp = open_files(pid).tcp_by_port;
        let to_super = tcp.get(&super_port).copied().unwrap_or(0);
        (to_super, tcp.values().sum::<usize>() - to_super)
    }

    fn memory_kib(&self, field: &str) -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.process.pid()?)).ok()?;
        status
            .lines()
            .find(|l| l.starts_with(field))?
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()
    }

    /// Sum and count of the syncer's histogram `name` over the series `keep` accepts (given each series'
    /// labels, `{...}`), from one scrape: a mean over a window is the difference of two readings.
    async fn histogram(&self, name: &str, keep: impl Fn(&str) -> bool) -> (f64, f64) {
        let Some(body) = http_get(self.admin_port, "/metrics").await else {
            return (f64::NAN, f64::NAN);
        };
        let total = |series: &str| -> f64 {
            body.lines()
                .filter_map(|l| l.strip_prefix(series))
                .filter(|rest| rest.starts_with('{') && keep(rest))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        (total(&format!("{name}_sum")), total(&format!("{name}_count")))
    }

    /// Sum and count of the syncer's downward pod syncs (`syncer_operation_duration_seconds`, all
    /// tenants): a pod's copy is made by one POST, so their mean over a window is about what a super
    /// write took then, the super apiserver's queue included, and the syncer's own wait for its core.
    async fn pod_sync_time(&self) -> (f64, f64) {
        self.histogram("syncer_operation_duration_seconds", |labels| {
            labels.contains("resource=\"pod\"") && labels.contains("direction=\"Down\"")
        })
        .await
    }

    /// Sums and counts, per direction (down, up), of the queue wait of all tenants and of the pod syncs:
    /// where a synced pod's time in the syncer goes.
    async fn stage_times(&self) -> [(f64, f64); 4] {
        let mut out = [(0.0, 0.0); 4];
        for (i, direction) in ["Down", "Up"].into_iter().enumerate() {
            let label = format!("direction=\"{direction}\"");
            out[i] = self
                .histogram("syncer_queue_wait_seconds", |labels| labels.contains(&label))
                .await;
            out[2 + i] = self
                .histogram("syncer_operation_duration_seconds", |labels| {
                    labels.contains("resource=\"pod\"") && labels.contains(&label)
                })
                .await;
        }
        out
    }

    /// Sum and count of the downward queue wait of `tenants` (VirtualCluster names in the harness's
    /// namespace): what the syncer's own queueing adds, apart from the apiservers' time.
    async fn queue_wait(&self, tenants: &[&local_cluster::tenancy::TenantMaster]) -> (f64, f64) {
        self.histogram("syncer_queue_wait_seconds", |labels| {
            labels.contains("direction=\"Down\"")
                && tenants.iter().any(|t| {
                    labels.contains(&format!(
                        "tenant=\"{}/{}\"",
                        local_cluster::tenancy::VC_NAMESPACE,
                        t.name
                    ))
                })
        })
        .await
    }

    /// Sum and count of the waits for a super write slot (all writes).
    async fn slot_wait(&self) -> (f64, f64) {
        self.histogram("syncer_super_write_slot_wait_seconds", |_| true)
            .await
    }

    async fn metric_sum(&self, name: &str) -> f64 {
        metric_sum_at(self.admin_port, name).await
    }
}

/// The sum of every series of metric `name` (a counter, or a histogram's `_sum` or `_count`) on the admin
/// endpoint at `port`.
async fn metric_sum_at(port: u16, name: &str) -> f64 {
    let Some(body) = http_get(port, "/metrics").await else {
        return f64::NAN;
    };
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with(['{', ' ']))
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn http_get(port: u16, path: &str) -> Option<String> {
    local_cluster::bench::admin_get(port, path, Duration::from_secs(10)).await
}

/// `apiserver_request_total` of some apiservers, summed by verb, resource and subresource (the bench's
/// own requests included): where the apiservers' time goes, per synced pod.
async fn request_counts(clients: &[Client]) -> BTreeMap<String, f64> {
    let mut counts = BTreeMap::new();
    for client in clients {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .expect("a static request is valid");
        // Bounded: an apiserver that does not answer leaves its counts out, it does not stop the bench.
        let Ok(Ok(body)) = tokio::time::timeout(Duration::from_secs(60), client.request_text(request)).await
        else {
            println!("an apiserver's /metrics did not answer within 60s; its requests are left out");
            continue;
        };
        for line in body.lines() {
            let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
                continue;
            };
            let Some((labels, value)) = rest.rsplit_once("} ") else {
                continue;
            };
            let label = |name: &str| {
                labels
                    .split("\",")
                    .find_map(|pair| pair.strip_prefix(&format!("{name}=\"")))
                    .map(|v| v.trim_end_matches('"').to_owned())
                    .unwrap_or_default()
            };
            let mut key = format!("{} {}", label("verb"), label("resource"));
            let subresource = label("subresource");
            if !subresource.is_empty() {
                key.push('/');
                key.push_str(&subresource);
            }
            *counts.entry(key).or_insert(0.0) += value.parse::<f64>().unwrap_or(0.0);
        }
    }
    counts
}

/// Every request count between two snapshots, per pod, largest first.
fn requests_per_pod(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>, pods: usize) -> String {
    let mut deltas: Vec<(String, f64)> = after
        .iter()
        .map(|(k, v)| (k.clone(), v - before.get(k).copied().unwrap_or(0.0)))
        .filter(|(_, d)| *d >= 1.0)
        .collect();
    deltas.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let total: f64 = deltas.iter().map(|(_, d)| d).sum();
    let mut text = format!("{:.2} per pod", total / pods as f64);
    for (key, delta) in &deltas {
        text.push_str(&format!(
            "\n    {key:<48} {:8.3}  ({delta:.0})",
            delta / pods as f64
        ));
    }
    text
}

/// Deletes namespaces and waits until they are gone.
/// How large the pods of a run are, as JSON: the mean of the whole object and of its `managedFields`.
#[derive(Debug, Default)]
struct PodBytes {
    pods: usize,
    bytes: f64,
    managed_fields: f64,
    /// The first pod listed, as read: what `--dump-pod` writes.
    sample: Option<Pod>,
}

impl PodBytes {
    async fn of(client: &Client, namespace: Option<&str>, labels: Option<&str>) -> anyhow::Result<Self> {
        let api: Api<Pod> = match namespace {
            Some(namespace) => Api::namespaced(client.clone(), namespace),
            None => Api::all(client.clone()),
        };
        let mut params = kube::api::ListParams::default();
        if let Some(labels) = labels {
            params = params.labels(labels);
        }
        let pods = api
            .list(&params)
            .await
            .context("listing pods to size them")?
            .items;
        let mut sizes = Self::default();
        for pod in &pods {
            sizes.pods += 1;
            sizes.bytes += serde_json::to_vec(pod)?.len() as f64;
            sizes.managed_fields += serde_json::to_vec(&pod.metadata.managed_fields)?.len() as f64;
        }
        sizes.sample = pods.into_iter().next();
        Ok(sizes)
    }

    fn add(&mut self, other: Self) {
        self.pods += other.pods;
        self.bytes += other.bytes;
        self.managed_fields += other.managed_fields;
        if self.sample.is_none() {
            self.sample = other.sample;
        }
    }

    /// Writes the sample pod, pretty-printed, to `dir/name.json`.
    fn dump(&self, dir: &std::path::Path, name: &str) -> anyhow::Result<()> {
        let Some(pod) = &self.sample else {
            println!("no {name} pod to dump");
            return Ok(());
        };
        let path = dir.join(format!("{name}.json"));
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::write(&path, serde_json::to_vec_pretty(pod)?)
            .with_context(|| format!("writing {}", path.display()))?;
        println!("{name} pod written to {}", path.display());
        Ok(())
    }

    fn report(&self) -> String {
        let n = self.pods.max(1) as f64;
        format!(
            "{:.0} bytes, of which managedFields {:.0} (mean of {} pods)",
            self.bytes / n,
            self.managed_fields / n,
            self.pods
        )
    }
}

async fn delete_namespaces(client: &Client, names: &[String]) -> anyhow::Result<()> {
    let api: Api<Namespace> = Api::all(client.clone());
    for name in names {
        let _ = api.delete(name, &DeleteParams::default()).await;
    }
    for name in names {
        wait::until_true(
            Duration::from_secs(300),
            &format!("namespace {name} deleted"),
            || {
                let api = api.clone();
                let name = name.clone();
                async move { matches!(api.get_opt(&name).await, Ok(None)) }
            },
        )
        .await?;
    }
    Ok(())
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

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if !local_cluster::require(
        "bench_syncer",
        &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager],
    ) {
        return Ok(());
    }
    let syncer_binary = syncer_binary(&args)?;
    if let Some(dir) = &args.profile_dir {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let placements = Placement::of(args.topology);
    if placements.iter().any(|p| p.super_cpus.is_some()) && std::thread::available_parallelism()?.get() < 2 {
        bail!("--topology split needs two CPUs");
    }
    for (index, placement) in placements.iter().enumerate() {
        run(&args, placement, &syncer_binary, index + 1 == placements.len()).await?;
    }
    Ok(())
}

/// One full benchmark (direct, synced, restart, fairness) in one topology; prints its figures.
async fn run(args: &Args, placement: &Placement, syncer_binary: &Path, last: bool) -> anyhow::Result<()> {
    let total = args.tenants * args.pods;
    println!();
    println!(
        "##### topology {}: {} tenants x {} pods = {total} pods, {} simulated nodes #####",
        placement.name, args.tenants, args.pods, args.nodes
    );
    // The bench (its clients, and the harness's spawner thread, whose children inherit its CPUs) goes on
    // the tenants' side; the simulated nodes get a runtime of their own on the super cluster's side.
    placement.pin(&[std::process::id()], false)?;
    let nodes_runtime = cpus::PinnedRuntime::new("sim-nodes", 2, placement.super_cpus.clone())?;

    progress("setting up the super cluster and the tenant masters");
    let setup = Instant::now();
    let tenancy = Tenancy::start(TenancyOptions {
        tenants: args.tenants,
        nodes: args.nodes,
        tenant_controller_managers: true,
        super_controller_manager: true,
        // Tenants need only what makes pods creatable: service accounts and namespace cleanup.
        tenant_controllers: Some("serviceaccount,serviceaccount-token,namespace,garbagecollector".into()),
        apiserver_args: [
            "--max-requests-inflight=2000",
            "--max-mutating-requests-inflight=1000",
        ]
        .into_iter()
        .chain(args.profile_dir.as_ref().map(|_| "--profiling=true"))
        .map(String::from)
        .collect(),
        separate_tenant_etcd: placement.super_cpus.is_some(),
        nodes_runtime: Some(nodes_runtime.handle()),
        ..TenancyOptions::default()
    })
    .await?;
    println!(
        "setup: {:.1}s (super cluster, {} tenant masters, nodes)",
        setup.elapsed().as_secs_f64(),
        args.tenants
    );
    let super_client = tenancy.super_client();
    let dir = WorkDir::new("bench-syncer")?;
    let pid_of = |p: &ManagedProcess| p.pid().into_iter().collect::<Vec<u32>>();
    let super_etcd = pid_of(tenancy.etcd.process());
    let super_apiserver = pid_of(tenancy.super_cluster.apiserver().process());
    let super_components = tenancy.super_cluster.component_pids();
    let tenant_etcd = tenancy
        .tenant_etcd
        .as_ref()
        .map(|etcd| pid_of(etcd.process()))
        .unwrap_or_default();
    let tenant_apiservers: Vec<u32> = tenancy
        .tenants
        .iter()
        .flat_map(|t| pid_of(t.control_plane.apiserver().process()))
        .collect();
    let tenant_components: Vec<u32> = tenancy
        .tenants
        .iter()
        .flat_map(|t| t.control_plane.component_pids())
        .collect();
    placement.pin(
        &[
            super_etcd.clone(),
            super_apiserver.clone(),
            super_components.clone(),
        ]
        .concat(),
        true,
    )?;
    placement.pin(
        &[
            tenant_etcd.clone(),
            tenant_apiservers.clone(),
            tenant_components.clone(),
        ]
        .concat(),
        false,
    )?;
    let etcd_name = match tenant_etcd.is_empty() {
        true => "etcd (super and tenants)",
        false => "super etcd",
    };
    let nodes = &nodes_runtime;
    let bench_cpu = move || cpus::cpu_seconds("/proc/self/stat") - nodes.cpu_seconds();
    let control_plane_parts = || {
        let mut parts: Vec<(String, CpuReader<'_>)> = vec![
            (etcd_name.to_owned(), processes_cpu(super_etcd.clone())),
            (
                "super apiserver".to_owned(),
                processes_cpu(super_apiserver.clone()),
            ),
            (
                "super controller-manager/scheduler".to_owned(),
                processes_cpu(super_components.clone()),
            ),
            (
                "simulated nodes (bench threads)".to_owned(),
                Box::new(move || nodes.cpu_seconds()) as CpuReader<'_>,
            ),
        ];
        if !tenant_etcd.is_empty() {
            parts.push(("tenant etcd".to_owned(), processes_cpu(tenant_etcd.clone())));
        }
        parts.push((
            "tenant apiservers".to_owned(),
            processes_cpu(tenant_apiservers.clone()),
        ));
        parts.push((
            "tenant controller-managers".to_owned(),
            processes_cpu(tenant_components.clone()),
        ));
        parts.push((
            "bench (clients, watches)".to_owned(),
            Box::new(bench_cpu) as CpuReader<'_>,
        ));
        parts
    };
    // What each part may run on, as the kernel reports it for every one of its threads.
    let affinity = |syncer: Option<u32>| {
        let mut lines = vec![
            (etcd_name, super_etcd.clone()),
            ("super apiserver", super_apiserver.clone()),
            ("super controller-manager/scheduler", super_components.clone()),
            ("tenant etcd", tenant_etcd.clone()),
            ("tenant apiservers", tenant_apiservers.clone()),
            ("tenant controller-managers", tenant_components.clone()),
            ("syncer", syncer.into_iter().collect()),
        ]
        .into_iter()
        .filter(|(_, pids)| !pids.is_empty())
        .map(|(name, pids)| {
            let allowed: std::collections::BTreeSet<String> =
                pids.iter().flat_map(|pid| cpus::process_affinity(*pid)).collect();
            format!(
                "    {name:<38} {} process(es), Cpus_allowed_list {:?}",
                pids.len(),
                allowed
            )
        })
        .collect::<Vec<_>>();
        let node_threads = nodes_runtime.thread_ids();
        lines.push(format!(
            "    {:<38} {} thread(s), Cpus_allowed_list {:?}",
            "simulated nodes",
            node_threads.len(),
            cpus::threads_affinity(&node_threads)
        ));
        let bench_threads = own_threads_except(&node_threads);
        lines.push(format!(
            "    {:<38} {} thread(s), Cpus_allowed_list {:?}",
            "bench",
            bench_threads.len(),
            cpus::threads_affinity(&bench_threads)
        ));
        lines.join("\n")
    };

    // 1. Direct baseline.
    progress("direct run");
    let (direct_seen, direct_watch) = observe(super_client.clone(), |p| {
        Some(format!("{}/{}", p.namespace()?, p.name_any()))
    });
    let namespaces: Vec<String> = (0..args.tenants).map(|t| format!("direct-{t}")).collect();
    for ns in &namespaces {
        ensure_namespace(&super_client, ns).await?;
    }
    wait_for_default_accounts(&super_client, &namespaces).await?;
    let direct_requests_before = request_counts(std::slice::from_ref(&super_client)).await;
    // What every part burns with nothing to do (leases, controllers, watches' bookmarks), per second.
    let idle_meter = CpuMeter::start(control_plane_parts());
    let idle_started = Instant::now();
    tokio::time::sleep(IDLE_SAMPLE).await;
    let mut idle = idle_meter.rates(idle_started.elapsed().as_secs_f64());
    drop(idle_meter);
    let direct_cpu = CpuMeter::start(control_plane_parts());
    let profile = |run: &str| {
        let dir = args.profile_dir.as_ref()?;
        let path = dir.join(format!("super-apiserver-{}-{run}.pprof", placement.name));
        Some(capture_profile(super_client.clone(), args.profile_seconds, path))
    };
    let direct_profile = profile("direct");
    let creators = namespaces.iter().map(|ns| {
        create_pods(
            super_client.clone(),
            ns.clone(),
            "pod",
            args.pods,
            args.concurrency,
        )
    });
    let started: HashMap<String, Instant> = futures::future::try_join_all(creators)
        .await?
        .into_iter()
        .flatten()
        .collect();
    let keys: Vec<String> = started.keys().cloned().collect();
    wait_count(
        &direct_seen,
        &keys,
        true,
        Duration::from_secs(1800),
        "direct pods Running",
    )
    .await?;
    let direct = figures(&started, &direct_seen.lock().expect("lock").running);
    if let Some(profile) = direct_profile {
        finish_profile(profile, args.profile_seconds).await;
    }
    let direct_cpu = direct_cpu.report("direct", direct.seconds, total, &idle);
    let direct_requests = requests_per_pod(
        &direct_requests_before,
        &request_counts(std::slice::from_ref(&super_client)).await,
        total,
    );
    direct_watch.abort();
    let mut direct_bytes = PodBytes::default();
    for namespace in &namespaces {
        direct_bytes.add(PodBytes::of(&super_client, Some(namespace), None).await?);
    }
    delete_namespaces(&super_client, &namespaces).await?;

    // 2. Through the syncer.
    progress("starting the syncer");
    let (mut syncer, first_ready) = SyncerProcess::start(
        syncer_binary,
        tenancy.super_cluster.apiserver().kubeconfig_path(),
        &dir,
        "syncer-1",
        &args.syncer_arg,
        placement
            .other_cpus
            .as_deref()
            .map(|cpus| (cpus, args.syncer_nice)),
        &args.syncer_log,
    )
    .await?;
    let affinity_report = affinity(syncer.process.pid());
    wait_attached(&tenancy).await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let baseline_rss = syncer.memory_kib("VmRSS:").unwrap_or(0);
    let baseline_anon = syncer.memory_kib("RssAnon:").unwrap_or(0);
    let super_port = port_of(tenancy.super_cluster.apiserver().url());
    let baseline_connections = syncer.connections(super_port);
    let syncer_idle = CpuMeter::start(vec![(
        "syncer".to_owned(),
        processes_cpu(pid_of(&syncer.process)),
    )]);
    let syncer_idle_started = Instant::now();
    tokio::time::sleep(IDLE_SAMPLE).await;
    idle.extend(syncer_idle.rates(syncer_idle_started.elapsed().as_secs_f64()));
    drop(syncer_idle);
    let mut super_seen_watch = Vec::new();
    let (super_seen, task) = observe(super_client.clone(), |p| {
        let synced = p.metadata.annotations.as_ref().and_then(|annotations| {
            Some(format!(
                "{}/{}/{}",
                annotations.get(crds::wellknown::ANNOTATION_VC_NAME)?,
                annotations.get(crds::wellknown::ANNOTATION_NAMESPACE)?,
                p.name_any()
            ))
        });
        // A pod created straight in the super cluster (the fairness run's control) is keyed by
        // `super/<namespace>/<name>`.
        synced.or_else(|| Some(format!("{DIRECT_CREATOR}/{}/{}", p.namespace()?, p.name_any())))
    });
    super_seen_watch.push(task);
    let mut tenant_seens = Vec::new();
    for tenant in &tenancy.tenants {
        let name = tenant.name.clone();
        let (seen, task) = observe(tenant.client(), move |p| {
            Some(format!("{name}/{}/{}", p.namespace()?, p.name_any()))
        });
        super_seen_watch.push(task);
        tenant_seens.push(seen);
        ensure_namespace(&tenant.client(), "bench").await?;
    }
    for tenant in &tenancy.tenants {
        wait_for_default_accounts(&tenant.client(), &["bench".to_owned()]).await?;
    }
    let peak = Arc::new(Mutex::new(0u64));
    let sampler = {
        let peak = peak.clone();
        let pid = syncer.process.pid();
        tokio::spawn(async move {
            loop {
                if let Some(kib) = pid.and_then(|pid| {
                    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
                    status
                        .lines()
                        .find(|l| l.starts_with("VmHWM:"))?
                        .split_whitespace()
                        .nth(1)?
                        .parse::<u64>()
                        .ok()
                }) {
                    let mut peak = peak.lock().expect("lock");
                    *peak = (*peak).max(kib);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    let mut parts = control_plane_parts();
    parts.push(("syncer".to_owned(), processes_cpu(pid_of(&syncer.process))));
    let tenant_clients: Vec<Client> = tenancy.tenants.iter().map(|t| t.client()).collect();
    let super_requests_before = request_counts(std::slice::from_ref(&super_client)).await;
    let tenant_requests_before = request_counts(&tenant_clients).await;
    let stages_before = syncer.stage_times().await;
    let scheduled_before = scheduled_seconds(syncer.process.pid());
    let synced_cpu = CpuMeter::start(parts);
    let synced_profile = profile("synced");
    // One tenant apiserver too: the tenants' side is what a synced pod adds.
    let tenant_profile = args
        .profile_dir
        .as_ref()
        .zip(tenancy.tenants.first())
        .map(|(dir, tenant)| {
            let path = dir.join(format!("tenant-apiserver-{}-synced.pprof", placement.name));
            capture_profile(tenant.client(), args.profile_seconds, path)
        });
    progress("creating the pods in the tenants");
    let creators = tenancy.tenants.iter().map(|t| {
        let name = t.name.clone();
        let client = t.client();
        let (pods, concurrency) = (args.pods, args.concurrency);
        async move {
            let started = create_pods(client, "bench".into(), "pod", pods, concurrency).await?;
            anyhow::Ok(
                started
                    .into_iter()
                    .map(move |(k, v)| (format!("{name}/{k}"), v))
                    .collect::<Vec<_>>(),
            )
        }
    });
    let started: HashMap<String, Instant> = futures::future::try_join_all(creators)
        .await?
        .into_iter()
        .flatten()
        .collect();
    let keys: Vec<String> = started.keys().cloned().collect();
    let merged_running = || {
        let mut all = HashMap::new();
        for seen in &tenant_seens {
            all.extend(
                seen.lock()
                    .expect("lock")
                    .running
                    .iter()
                    .map(|(k, v)| (k.clone(), *v)),
            );
        }
        all
    };
    let deadline = Instant::now() + Duration::from_secs(3600);
    loop {
        let running = merged_running();
        if keys.iter().all(|k| running.contains_key(k)) {
            break;
        }
        syncer.ensure_alive("synced pods Running in their tenants")?;
        if Instant::now() > deadline {
            bail!(
                "synced pods Running in their tenants: {} of {} after an hour",
                running.len(),
                keys.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tenant_running = merged_running();
    let synced = figures(&started, &tenant_running);
    let stages_after = syncer.stage_times().await;
    let scheduled_after = scheduled_seconds(syncer.process.pid());
    progress("synced pods Running in their tenants; collecting figures");
    for profile in [synced_profile, tenant_profile].into_iter().flatten() {
        finish_profile(profile, args.profile_seconds).await;
    }
    let synced_cpu = synced_cpu.report("synced", synced.seconds, total, &idle);
    let synced_super_requests = requests_per_pod(
        &super_requests_before,
        &request_counts(std::slice::from_ref(&super_client)).await,
        total,
    );
    let synced_tenant_requests = requests_per_pod(
        &tenant_requests_before,
        &request_counts(&tenant_clients).await,
        total,
    );
    let (to_super, up) = {
        let seen = super_seen.lock().expect("lock");
        let to_super: Vec<f64> = started
            .iter()
            .filter_map(|(k, at)| seen.created.get(k).map(|c| c.duration_since(*at).as_secs_f64()))
            .collect();
        let up: Vec<f64> = tenant_running
            .iter()
            .filter_map(|(k, t)| {
                seen.running
                    .get(k)
                    .map(|s| t.saturating_duration_since(*s).as_secs_f64())
            })
            .collect();
        (to_super, up)
    };
    let synced_bytes = PodBytes::of(&super_client, None, Some(crds::wellknown::LABEL_VC_NAME)).await?;
    let mut tenant_bytes = PodBytes::default();
    for client in &tenant_clients {
        tenant_bytes.add(PodBytes::of(client, Some("bench"), None).await?);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    syncer.ensure_alive("the figures of the synced run")?;
    let synced_rss = syncer.memory_kib("VmRSS:").unwrap_or(0);
    let synced_anon = syncer.memory_kib("RssAnon:").unwrap_or(0);
    let synced_connections = syncer.connections(super_port);
    sampler.abort();
    let peak_kib = (*peak.lock().expect("lock")).max(syncer.memory_kib("VmHWM:").unwrap_or(0));
    if args.pause_synced > 0 {
        progress(&format!(
            "synced: the syncer (pid {}) has {synced_rss} KiB resident; pausing {} s (--pause-synced)",
            syncer.process.pid().unwrap_or_default(),
            args.pause_synced
        ));
        tokio::time::sleep(Duration::from_secs(args.pause_synced)).await;
    }

    // 3. Restart with everything synced.
    progress("restart: stopping the first syncer");
    let before_restart = syncer.metric_sum("syncer_super_writes_total").await;
    drop(syncer);
    progress("restart: starting the second syncer");
    let (restarted, ready_seconds) = SyncerProcess::start(
        syncer_binary,
        tenancy.super_cluster.apiserver().kubeconfig_path(),
        &dir,
        "syncer-2",
        &args.syncer_arg,
        placement
            .other_cpus
            .as_deref()
            .map(|cpus| (cpus, args.syncer_nice)),
        &args.syncer_log,
    )
    .await?;
    // The VirtualClusters still say TenantSynced from the first syncer: the new one's own count of tenants
    // whose caches have listed says when its work can start.
    let restarted_at = Instant::now();
    let listed = wait::until_true(
        Duration::from_secs(300),
        "every tenant's caches listed",
        || async {
            restarted
                .metric_sum("syncer_tenant_list_duration_seconds_count")
                .await
                >= args.tenants as f64
        },
    )
    .await
    .map(|()| ready_seconds + restarted_at.elapsed().as_secs_f64());
    wait_attached(&tenancy).await?;
    // Let every tenant's initial resync run through.
    tokio::time::sleep(Duration::from_secs(20)).await;
    progress("fairness run");
    let restart_writes = restarted.metric_sum("syncer_super_writes_total").await.abs();
    syncer = restarted;

    // 4. Fairness: regular tenants alone, then next to greedy ones.
    let greedy: Vec<&local_cluster::tenancy::TenantMaster> =
        tenancy.tenants.iter().take(args.greedy).collect();
    let regular: Vec<&local_cluster::tenancy::TenantMaster> = tenancy
        .tenants
        .iter()
        .skip(args.greedy)
        .take(args.regular)
        .collect();
    let regular_creators: Vec<Creator> = regular.iter().map(|t| Creator::tenant(t)).collect();
    // The control: one client creating the same pods straight in the super cluster, one at a time, in
    // the same windows: how much the greedy burst slows the super cluster itself, which no syncer can
    // hide from the pods it copies there.
    let control = [Creator {
        name: DIRECT_CREATOR.to_owned(),
        client: tenancy.super_client(),
    }];
    let wait_before = syncer.queue_wait(&regular).await;
    let sync_before = syncer.pod_sync_time().await;
    let (unloaded, control_unloaded) = tokio::try_join!(
        regular_latencies(&regular_creators, &super_seen, "alone", args.regular_pods),
        regular_latencies(&control, &super_seen, "alone", args.regular_pods),
    )?;
    let wait_alone = syncer.queue_wait(&regular).await;
    let sync_alone = syncer.pod_sync_time().await;
    let greedy_before = syncer.queue_wait(&greedy).await;
    for tenant in &greedy {
        ensure_namespace(&tenant.client(), "greedy").await?;
    }
    for tenant in &greedy {
        wait_for_default_accounts(&tenant.client(), &["greedy".to_owned()]).await?;
    }
    let bursts: Vec<_> = greedy
        .iter()
        .map(|t| {
            tokio::spawn(create_pods(
                t.client(),
                "greedy".into(),
                "burst",
                args.greedy_pods,
                64,
            ))
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let slots_before = syncer.slot_wait().await;
    let sync_loaded_from = syncer.pod_sync_time().await;
    let (loaded, control_loaded) = tokio::try_join!(
        regular_latencies(&regular_creators, &super_seen, "loaded", args.regular_pods),
        regular_latencies(&control, &super_seen, "loaded", args.regular_pods),
    )?;
    let wait_loaded = syncer.queue_wait(&regular).await;
    let sync_loaded = syncer.pod_sync_time().await;
    let slots_loaded = syncer.slot_wait().await;
    for burst in bursts {
        burst.await??;
    }
    let greedy_after = syncer.queue_wait(&greedy).await;
    let mean_wait = |from: (f64, f64), to: (f64, f64)| (to.0 - from.0) / (to.1 - from.1).max(1.0);
    for task in super_seen_watch {
        task.abort();
    }
    drop(syncer);

    progress("figures");
    // Figures.
    let mut direct_latencies = direct.latencies.clone();
    let mut synced_latencies = synced.latencies.clone();
    let (mut to_super, mut up) = (to_super, up);
    let direct_p99 = percentile(&mut direct_latencies, 0.99);
    let synced_p99 = percentile(&mut synced_latencies, 0.99);
    println!();
    println!(
        "===== figures, topology {} (a shared, noisy machine: other engineers' builds run beside it) =====",
        placement.name
    );
    println!("== placement (read back from /proc/<pid>/task/*/status) ==");
    println!("{affinity_report}");
    println!("== throughput ({total} pods) ==");
    println!(
        "direct:        {:8.1} pods/s ({:.1}s)",
        direct.throughput(),
        direct.seconds
    );
    println!(
        "through syncer:{:8.1} pods/s ({:.1}s)",
        synced.throughput(),
        synced.seconds
    );
    println!(
        "ratio:         {:8.2}x (target >= 0.95)",
        synced.throughput() / direct.throughput()
    );
    println!("== CPU seconds per process (per pod: over the {total} pods of the run) ==");
    print!("{direct_cpu}");
    print!("{synced_cpu}");
    println!("== requests per pod, by apiserver, verb and resource ==");
    println!("direct requests, super apiserver: {direct_requests}");
    println!("synced requests, super apiserver: {synced_super_requests}");
    println!("synced requests, tenant apiservers: {synced_tenant_requests}");
    println!("== pod size (JSON, Running) ==");
    println!("direct pod, super cluster: {}", direct_bytes.report());
    println!("synced pod, super cluster: {}", synced_bytes.report());
    println!("synced pod, its tenant:    {}", tenant_bytes.report());
    if let Some(dir) = &args.dump_pod {
        direct_bytes.dump(dir, "direct")?;
        synced_bytes.dump(dir, "synced-super")?;
        tenant_bytes.dump(dir, "synced-tenant")?;
    }
    println!("== latency (seconds) ==");
    println!(
        "direct create->Running:          p50 {:6.2}  p99 {:6.2}",
        percentile(&mut direct_latencies, 0.5),
        direct_p99
    );
    println!(
        "synced create->tenant Running:   p50 {:6.2}  p99 {:6.2}  (p99 ratio {:.2}x, target <= 1.5)",
        percentile(&mut synced_latencies, 0.5),
        synced_p99,
        synced_p99 / direct_p99
    );
    println!(
        "synced create->super pod:        p50 {:6.2}  p99 {:6.2}",
        percentile(&mut to_super, 0.5),
        percentile(&mut to_super, 0.99)
    );
    println!(
        "super Running->tenant Running:   p50 {:6.2}  p99 {:6.2}",
        percentile(&mut up, 0.5),
        percentile(&mut up, 0.99)
    );
    let mean_ms = |i: usize| {
        let (sum, count) = (
            stages_after[i].0 - stages_before[i].0,
            stages_after[i].1 - stages_before[i].1,
        );
        if count > 0.0 {
            1000.0 * sum / count
        } else {
            f64::NAN
        }
    };
    println!(
        "in the syncer, down / up, mean: queue wait {:.1} / {:.1} ms, pod sync {:.1} / {:.1} ms ({:.0} / {:.0} pod syncs)",
        mean_ms(0),
        mean_ms(1),
        mean_ms(2),
        mean_ms(3),
        stages_after[2].1 - stages_before[2].1,
        stages_after[3].1 - stages_before[3].1,
    );
    println!(
        "the syncer's threads over the synced run: {:.1} s on a CPU, {:.1} s runnable but waiting for one{}",
        scheduled_after.0 - scheduled_before.0,
        scheduled_after.1 - scheduled_before.1,
        match placement.other_cpus {
            Some(_) => format!(
                " (niceness {}; the tenant side's other processes 5)",
                args.syncer_nice
            ),
            None => String::new(),
        },
    );
    println!("== memory ==");
    println!(
        "syncer RSS: idle {} KiB, with {total} pods synced {} KiB, peak {} KiB",
        baseline_rss, synced_rss, peak_kib
    );
    // The rest of the RSS is the binary's pages, more of them touched once pods are synced: code, not data.
    println!(
        "syncer anonymous RSS (heap and stacks): idle {baseline_anon} KiB, with {total} pods synced {synced_anon} KiB"
    );
    println!(
        "syncer TCP connections: idle {} to the super apiserver, {} to tenant apiservers; with {total} pods synced {}, {}",
        baseline_connections.0, baseline_connections.1, synced_connections.0, synced_connections.1
    );
    let per_pod = |idle: u64, synced: u64| (synced.saturating_sub(idle) * 1024) as f64 / total as f64;
    println!(
        "bytes per synced pod: {:.0} (target <= 4096); of anonymous memory: {:.0}",
        per_pod(baseline_rss, synced_rss),
        per_pod(baseline_anon, synced_anon)
    );
    println!("== restart with {total} pods synced ==");
    println!("first start ready in {first_ready:.2}s; super writes by the first syncer: {before_restart}");
    println!(
        "restart: ready in {ready_seconds:.2}s (target < 5), super writes after restart: {restart_writes} (target 0)"
    );
    match &listed {
        Ok(seconds) => println!("restart: every tenant's caches listed {seconds:.2}s after the start"),
        Err(error) => println!("restart: not every tenant's caches listed: {error}"),
    }
    println!(
        "== fairness ({} greedy x {} pods, {} regular x {} sequential pods) ==",
        args.greedy, args.greedy_pods, args.regular, args.regular_pods
    );
    let means = |times: &[RegularTimes]| {
        let total: Vec<f64> = times.iter().map(|t| t.total).collect();
        let call: Vec<f64> = times.iter().map(|t| t.create_call).collect();
        let after: Vec<f64> = times.iter().map(RegularTimes::after_create).collect();
        (mean(&total), mean(&call), mean(&after))
    };
    let (alone_total, alone_call, alone_after) = means(&unloaded);
    let (loaded_total, loaded_call, loaded_after) = means(&loaded);
    println!(
        "regular create->super mean: alone {alone_total:.3}s, next to greedy {loaded_total:.3}s, ratio {:.2}x (target <= 2)",
        loaded_total / alone_total
    );
    println!(
        "  of which the create request at the tenant apiserver: alone {:.1} ms, next to greedy {:.1} ms",
        alone_call * 1000.0,
        loaded_call * 1000.0
    );
    println!(
        "  of which create answered -> super watch shows the copy: alone {:.1} ms, next to greedy {:.1} ms",
        alone_after * 1000.0,
        loaded_after * 1000.0
    );
    let (control_alone, control_alone_call, _) = means(&control_unloaded);
    let (control_next_to_greedy, control_loaded_call, _) = means(&control_loaded);
    println!(
        "control, pods created straight in the super cluster one at a time in the same windows: create->super watch mean alone {control_alone:.3}s, next to greedy {control_next_to_greedy:.3}s, ratio {:.2}x (create request {:.1} / {:.1} ms)",
        control_next_to_greedy / control_alone,
        control_alone_call * 1000.0,
        control_loaded_call * 1000.0
    );
    println!(
        "syncer's downward pod syncs (one POST each, timed in the syncer), mean over all tenants: alone {:.1} ms, next to greedy {:.1} ms",
        mean_wait(sync_before, sync_alone) * 1000.0,
        mean_wait(sync_loaded_from, sync_loaded) * 1000.0
    );
    println!(
        "syncer queue wait (down), mean: regular alone {:.1} ms, regular next to greedy {:.1} ms, greedy {:.1} ms",
        mean_wait(wait_before, wait_alone) * 1000.0,
        mean_wait(wait_alone, wait_loaded) * 1000.0,
        mean_wait(greedy_before, greedy_after) * 1000.0
    );
    println!(
        "super write slot wait (all writes while regular tenants ran next to greedy): mean {:.1} ms over {:.0} writes",
        mean_wait(slots_before, slots_loaded) * 1000.0,
        slots_loaded.1 - slots_before.1
    );
    if last {
        // Every figure is printed. Exit without waiting for this run's processes to be reaped (they die
        // with this process, through their parent-death signal): that teardown has taken minutes. Their
        // folders go first, since no harness object is dropped.
        local_cluster::remove_own_folders();
        std::process::exit(0);
    }
    Ok(())
}

/// Where a regular pod's time from create to super pod went: the create request at its tenant apiserver,
/// and from its answer until the super cluster's watch showed the copy (the syncer's watch, queue and
/// write, and the super apiserver's watch).
#[derive(Clone, Copy, Debug)]
struct RegularTimes {
    total: f64,
    create_call: f64,
}

impl RegularTimes {
    fn after_create(&self) -> f64 {
        self.total - self.create_call
    }
}

/// The key prefix of pods the fairness run creates straight in the super cluster.
const DIRECT_CREATOR: &str = "super";

/// Who creates regular pods in the fairness run: a tenant (by its name and client), or the control
/// (`DIRECT_CREATOR` and the super cluster's client).
struct Creator {
    name: String,
    client: Client,
}

impl Creator {
    fn tenant(tenant: &local_cluster::tenancy::TenantMaster) -> Self {
        Self {
            name: tenant.name.clone(),
            client: tenant.client(),
        }
    }
}

/// Each creator makes pods one at a time; returns where each pod's create->super-pod time went.
async fn regular_latencies(
    creators: &[Creator],
    super_seen: &Arc<Mutex<Seen>>,
    label: &str,
    count: usize,
) -> anyhow::Result<Vec<RegularTimes>> {
    let runs = creators.iter().map(|creator| {
        let super_seen = super_seen.clone();
        let label = label.to_owned();
        let name = creator.name.clone();
        let client = creator.client.clone();
        async move {
            let namespace = format!("regular-{label}");
            ensure_namespace(&client, &namespace).await?;
            wait_for_default_accounts(&client, std::slice::from_ref(&namespace)).await?;
            let api: Api<Pod> = Api::namespaced(client, &namespace);
            let mut latencies = Vec::new();
            for i in 0..count {
                let pod_name = format!("one-{i}");
                let key = format!("{name}/{namespace}/{pod_name}");
                let at = Instant::now();
                api.create(&PostParams::default(), &pod(&pod_name))
                    .await
                    .context("regular create")?;
                let create_call = at.elapsed().as_secs_f64();
                wait_count(
                    &super_seen,
                    std::slice::from_ref(&key),
                    false,
                    Duration::from_secs(600),
                    "regular pod in the super cluster",
                )
                .await?;
                let seen = super_seen.lock().expect("lock").created[&key];
                latencies.push(RegularTimes {
                    total: seen.duration_since(at).as_secs_f64(),
                    create_call,
                });
            }
            anyhow::Ok(latencies)
        }
    });
    Ok(futures::future::try_join_all(runs)
        .await?
        .into_iter()
        .flatten()
        .collect())
}

async fn wait_for_default_accounts(client: &Client, namespaces: &[String]) -> anyhow::Result<()> {
    for namespace in namespaces {
        let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), namespace);
        wait::until_true(Duration::from_secs(120), "default ServiceAccount", || {
            let api = api.clone();
            async move { matches!(api.get_opt("default").await, Ok(Some(_))) }
        })
        .await?;
    }
    Ok(())
}

async fn wait_attached(tenancy: &Tenancy) -> anyhow::Result<()> {
    let api: Api<crds::VirtualCluster> =
        Api::namespaced(tenancy.super_client(), local_cluster::tenancy::VC_NAMESPACE);
    for name in tenancy.names() {
        wait::until_true(Duration::from_secs(120), &format!("{name} attached"), || {
            let api = api.clone();
            let name = name.clone();
            async move {
                api.get(&name)
                    .await
                    .ok()
                    .and_then(|vc| vc.status)
                    .is_some_and(|s| {
                        s.conditions.iter().any(|c| {
                            c.type_ == crds::wellknown::CONDITION_TENANT_SYNCED && c.status == "True"
                        })
                    })
            }
        })
        .await?;
    }
    Ok(())
}
