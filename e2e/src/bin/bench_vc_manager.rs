//! Benchmark: vc-manager provisioning many tenants on a real super cluster.
//!
//! Starts etcd, kube-apiserver and kube-controller-manager, simulated nodes that run the StatefulSets'
//! pods, and vc-manager in this process; creates N VirtualClusters at once (default 100) from the
//! ClusterIP example ClusterVersion; and prints how long until every tenant's control-plane objects exist
//! (root namespace, 12 Secrets, 2 Services, 3 StatefulSets) and until every VirtualCluster is Running,
//! then how long deleting them all takes.
//!
//! ```sh
//! cargo run --release -p e2e --bin bench_vc_manager -- [count] [--concurrency N] [--debounce-millis M]
//! ```

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use crds::{ClusterPhase, VirtualCluster, VirtualClusterSpec};
use futures::{StreamExt, stream};
use k8s_openapi::api::{
    apps::v1::StatefulSet,
    core::v1::{Namespace, Secret, Service},
};
use kube::{
    Api, Client,
    api::{DeleteParams, ListParams, ObjectMeta, PostParams},
};
use local_cluster::{Binary, ControlPlane, ControlPlaneOptions, NodeSimulator, NodeSimulatorOptions, apply};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use vc_manager::{Manager, Settings};

/// Errors end the benchmark with a message.
type Result<T, E = Box<dyn std::error::Error + Send + Sync>> = std::result::Result<T, E>;

fn fail(message: String) -> Box<dyn std::error::Error + Send + Sync> {
    message.into()
}

const NAMESPACE: &str = "bench";
const SECRETS_PER_TENANT: usize = 12;
const SERVICES_PER_TENANT: usize = 2;
const STATEFULSETS_PER_TENANT: usize = 3;

struct Options {
    count: usize,
    concurrency: u16,
    debounce: Duration,
}

fn options() -> Result<Options> {
    let mut options = Options {
        count: 100,
        concurrency: Settings::default().concurrency,
        debounce: Settings::default().debounce,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--concurrency" => {
                options.concurrency = args
                    .next()
                    .ok_or_else(|| fail("--concurrency needs a number".into()))?
                    .parse()?;
            }
            "--debounce-millis" => {
                let millis: u64 = args
                    .next()
                    .ok_or_else(|| fail("--debounce-millis needs a number".into()))?
                    .parse()?;
                options.debounce = Duration::from_millis(millis);
            }
            count => {
                options.count = count
                    .parse()
                    .map_err(|_| fail(format!("expected a count of VirtualClusters, not {count:?}")))?;
            }
        }
    }
    Ok(options)
}

/// Counts of what vc-manager created, across the super cluster.
#[derive(Debug, Default, PartialEq, Eq)]
struct Objects {
    namespaces: usize,
    secrets: usize,
    services: usize,
    statefulsets: usize,
}

async fn objects(client: &Client) -> Result<Objects> {
    let managed = ListParams::default().labels("app.kubernetes.io/managed-by=vc-manager");
    Ok(Objects {
        namespaces: Api::<Namespace>::all(client.clone())
            .list_metadata(&managed)
            .await?
            .items
            .len(),
        secrets: Api::<Secret>::all(client.clone())
            .list_metadata(&managed)
            .await?
            .items
            .len(),
        services: Api::<Service>::all(client.clone())
            .list_metadata(&managed)
            .await?
            .items
            .len(),
        statefulsets: Api::<StatefulSet>::all(client.clone())
            .list_metadata(&managed)
            .await?
            .items
            .len(),
    })
}

async fn running(api: &Api<VirtualCluster>) -> Result<usize> {
    Ok(api
        .list(&ListParams::default())
        .await?
        .items
        .iter()
        .filter(|vc| vc.phase() == Some(ClusterPhase::Running))
        .count())
}

async fn scrape(address: SocketAddr) -> Result<String> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    Ok(response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default())
}

/// Sum of a metric's samples whose line starts with `prefix`.
fn sum(metrics: &str, prefix: &str) -> f64 {
    metrics
        .lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

fn resident_megabytes() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn cpu_seconds() -> f64 {
    // utime + stime of this process (vc-manager, the node simulator and the benchmark's polling).
    let ticks = 100.0;
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            let after = s.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            Some((fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?) / ticks)
        })
        .unwrap_or(0.0)
}

#[tokio::main]
async fn main() -> Result<()> {
    let options = options()?;
    if !local_cluster::require(
        "bench_vc_manager",
        &[Binary::Etcd, Binary::KubeApiserver, Binary::KubeControllerManager],
    ) {
        return Ok(());
    }
    let cluster = ControlPlane::start(ControlPlaneOptions::super_cluster()).await?;
    let client = cluster.client();
    local_cluster::install_crds(&client).await?;
    let _nodes = NodeSimulator::start(
        &cluster,
        NodeSimulatorOptions {
            node_count: 4,
            kubelet: false,
            ..Default::default()
        },
    )
    .await?;
    let example = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/clusterversion-clusterip.yaml");
    apply::apply_yaml(&client, &std::fs::read_to_string(example)?, "default").await?;
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(NAMESPACE.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await?;

    let admin: SocketAddr = format!("127.0.0.1:{}", local_cluster::free_port()?).parse()?;
    let settings = Settings {
        concurrency: options.concurrency,
        debounce: options.debounce,
        deletion_poll_interval: Duration::from_millis(500),
        // Simulated nodes mark control-plane pods running; nothing serves.
        native_readiness: vc_manager::NativeReadiness::StatefulSetsReady,
        ..Settings::default()
    };
    let manager = Manager::new(client.clone(), settings).with_admin_endpoint(admin);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let manager = tokio::spawn(Box::pin(manager.run(async move {
        let _ = stopped.await;
    })));
    let cpu_before = cpu_seconds();

    let vcs: Api<VirtualCluster> = Api::namespaced(client.clone(), NAMESPACE);
    let start = Instant::now();
    stream::iter(0..options.count)
        .map(|i| {
            let vcs = vcs.clone();
            async move {
                let vc = VirtualCluster::new(
                    &format!("tenant-{i:03}"),
                    VirtualClusterSpec {
                        cluster_version_name: Some("cv-v1-33-clusterip".into()),
                        ..Default::default()
                    },
                );
                vcs.create(&PostParams::default(), &vc).await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, kube::Error>>()?;
    let created = start.elapsed();

    let want = Objects {
        namespaces: options.count,
        secrets: options.count * SECRETS_PER_TENANT,
        services: options.count * SERVICES_PER_TENANT,
        statefulsets: options.count * STATEFULSETS_PER_TENANT,
    };
    let deadline = Duration::from_secs(600);
    let mut pki_and_etcd = None;
    let mut all_objects = None;
    let mut all_running = None;
    while all_running.is_none() || all_objects.is_none() {
        if start.elapsed() > deadline {
            return Err(fail(format!(
                "not done after {} s: {:?} of {want:?}",
                deadline.as_secs(),
                objects(&client).await?
            )));
        }
        let now = objects(&client).await?;
        if pki_and_etcd.is_none()
            && now.namespaces == want.namespaces
            && now.secrets == want.secrets
            && now.services == want.services
            && now.statefulsets >= options.count
        {
            pki_and_etcd = Some(start.elapsed());
        }
        if all_objects.is_none() && now == want {
            all_objects = Some(start.elapsed());
        }
        if all_running.is_none() && running(&vcs).await? == options.count {
            all_running = Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let provision_cpu = cpu_seconds() - cpu_before;
    let metrics = scrape(admin).await?;
    let reconciles = sum(
        &metrics,
        "vc_manager_reconcile_total{controller=\"virtualcluster\"",
    );
    let failures = reconciles
        - sum(
            &metrics,
            "vc_manager_reconcile_total{controller=\"virtualcluster\",result=\"success\"}",
        );
    let duration_sum = sum(
        &metrics,
        "vc_manager_reconcile_duration_seconds_sum{controller=\"virtualcluster\"",
    );
    let rss = resident_megabytes();

    let delete_start = Instant::now();
    vcs.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    loop {
        if delete_start.elapsed() > deadline {
            return Err(fail(format!("deletion not done after {} s", deadline.as_secs())));
        }
        let left = vcs.list_metadata(&ListParams::default()).await?.items.len();
        let remaining = objects(&client).await?;
        if left == 0 && remaining == Objects::default() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let deleted = delete_start.elapsed();
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(30), manager).await;

    let seconds = |d: Option<Duration>| d.map_or(f64::NAN, |d| d.as_secs_f64());
    println!(
        "vc-manager benchmark: {} VirtualClusters, concurrency {}, debounce {} ms",
        options.count,
        options.concurrency,
        options.debounce.as_millis()
    );
    println!(
        "  created (API calls)                       {:>8.2} s",
        created.as_secs_f64()
    );
    println!(
        "  PKI, Services and etcd StatefulSet for all {:>8.2} s",
        seconds(pki_and_etcd)
    );
    println!(
        "  all control-plane objects exist           {:>8.2} s  ({} namespaces, {} Secrets, {} Services, {} StatefulSets)",
        seconds(all_objects),
        want.namespaces,
        want.secrets,
        want.services,
        want.statefulsets
    );
    println!(
        "  all Running (simulated nodes)             {:>8.2} s",
        seconds(all_running)
    );
    println!(
        "  all deleted, nothing left                 {:>8.2} s",
        deleted.as_secs_f64()
    );
    println!(
        "  reconciles {reconciles:.0} ({failures:.0} failed), mean {:.1} ms; process CPU while provisioning {provision_cpu:.1} s, RSS {rss:.0} MiB",
        if reconciles > 0.0 {
            duration_sum / reconciles * 1000.0
        } else {
            0.0
        }
    );
    Ok(())
}
