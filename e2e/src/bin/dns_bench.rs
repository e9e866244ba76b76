//! vc-dns benchmark: many tenants' Services, queries from many tenant pods' addresses on loopback. Prints
//! figures; asserts nothing.
//!
//! `cargo run -p e2e --release --bin dns_bench [-- --tenants 100 --services 100 --clients 1000 --senders 50 --qps 10000
//! --seconds 10]`
//!
//! The index is filled through the same conversions the watches use (super-cluster Services,
//! EndpointSlices, namespaces and pods as JSON objects), without an apiserver: what is measured is the
//! server. Each client is a tenant pod: a UDP socket bound to its loopback address (127.x.y.z), so the
//! server identifies its tenant exactly as it does in a cluster. Three figures:
//!
//! 1. memory: the process's resident size before and after filling the index, per Service (each with an
//!    EndpointSlice of three endpoints) and per object;
//! 2. paced load: `--qps` queries per second spread over the clients for `--seconds`, each query's latency
//!    from send to answer (p50, p99, p99.9, max), and the answers per second achieved;
//! 3. saturation: every client asking as fast as it is answered, for the answers per second the server
//!    can give on this machine (clients and server share its cores).
//!
//! Queries are A lookups of `svc-<n>.ns-<m>.svc.cluster.local.` of the client's own tenant (90%), of a
//! headless Service (5%) and of names that do not exist (5%). No query leaves the machine: the upstream
//! is a stand-in on loopback, and no bench query is forwarded.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::{Arc, RwLock},
    time::{Duration, Instant},
};

use clap::Parser;
use hickory_proto::{
    op::{Message, MessageType, OpCode, Query, ResponseCode},
    rr::{Name, RecordType},
};
use serde_json::json;
use vc_dns::{Dns, Metrics, Settings, index::Index, objects};

#[derive(Debug, Parser)]
struct Options {
    /// Tenants.
    #[arg(long, default_value_t = 100)]
    tenants: usize,
    /// Services per tenant (one in ten headless, with three endpoints).
    #[arg(long, default_value_t = 100)]
    services: usize,
    /// Client pods (spread over the tenants), each a socket on its own loopback address.
    #[arg(long, default_value_t = 1000)]
    clients: usize,
    /// Tasks sending the queries, each taking turns over its share of the client sockets.
    #[arg(long, default_value_t = 50)]
    senders: usize,
    /// Paced query rate.
    #[arg(long, default_value_t = 10_000)]
    qps: u64,
    /// Worker threads of the server's runtime (the clients have two of their own).
    #[arg(long, default_value_t = 2)]
    server_threads: usize,
    /// Seconds of the paced run (the saturation run takes a third of it).
    #[arg(long, default_value_t = 10)]
    seconds: u64,
}

const NAMESPACES_PER_TENANT: usize = 4;

fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

fn key(tenant: usize) -> String {
    format!("tenants-{:06x}-t{tenant}", tenant * 7919 % 0xffffff)
}

fn client_ip(client: usize) -> Ipv4Addr {
    let n = client + 1;
    Ipv4Addr::new(127, 200, (n >> 8) as u8, (n & 255) as u8)
}

/// Fills the index through the watches' conversions; returns the number of Services.
fn fill(index: &mut Index, options: &Options) -> usize {
    let mut services = 0;
    for tenant in 0..options.tenants {
        let key = key(tenant);
        index.set_domain(key.as_str().into(), "cluster.local");
        for ns in 0..NAMESPACES_PER_TENANT {
            let tenant_ns = format!("ns-{ns}");
            let super_ns = crds::naming::super_namespace(&key, &tenant_ns);
            let annotations =
                json!({"tenancy.x-k8s.io/cluster": key, "tenancy.x-k8s.io/namespace": tenant_ns});
            let namespace: k8s_openapi::api::core::v1::Namespace =
                serde_json::from_value(json!({"metadata": {"name": super_ns, "annotations": annotations}}))
                    .expect("namespace");
            index.set_namespace(&super_ns, objects::namespace_owner(&namespace));
        }
        for s in 0..options.services {
            let tenant_ns = format!("ns-{}", s % NAMESPACES_PER_TENANT);
            let super_ns = crds::naming::super_namespace(&key, &tenant_ns);
            let name = format!("svc-{s}");
            let headless = s % 10 == 9;
            let n = tenant * options.services + s;
            let cluster_ip = match headless {
                true => "None".to_owned(),
                false => format!("10.{}.{}.{}", 96 + (n >> 16), (n >> 8) & 255, n & 255),
            };
            let service: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": super_ns,
                    "annotations": {"tenancy.x-k8s.io/cluster": key, "tenancy.x-k8s.io/namespace": tenant_ns}},
                "spec": {"clusterIP": cluster_ip, "ports": [{"name": "http", "port": 80}]}
            }))
            .expect("service");
            index.set_service(&super_ns, &name, objects::service_record(&service));
            let endpoints: Vec<serde_json::Value> = (0..3)
                .map(|e| {
                    let ip = format!(
                        "10.{}.{}.{}",
                        128 + (n >> 14),
                        (n >> 6) & 255,
                        ((n & 63) << 2) | e
                    );
                    json!({"addresses": [ip], "conditions": {"ready": true}})
                })
                .collect();
            let slice: k8s_openapi::api::discovery::v1::EndpointSlice = serde_json::from_value(json!({
                "metadata": {"name": format!("{name}-abcde"), "namespace": super_ns,
                    "labels": {"kubernetes.io/service-name": name}},
                "addressType": "IPv4",
                "endpoints": endpoints,
                "ports": [{"name": "http", "port": 8080}]
            }))
            .expect("slice");
            index.set_slice(&super_ns, &format!("{name}-abcde"), objects::slice_record(&slice));
            services += 1;
        }
    }
    for client in 0..options.clients {
        let tenant = client % options.tenants;
        let key = key(tenant);
        let super_ns = crds::naming::super_namespace(&key, "ns-0");
        let pod: objects::PodView = serde_json::from_value(json!({
            "metadata": {"name": format!("client-{client}"), "namespace": super_ns,
                "labels": {"tenancy.x-k8s.io/cluster": key}, "annotations": {"tenancy.x-k8s.io/cluster": key}},
            "spec": {},
            "status": {"phase": "Running", "podIP": client_ip(client).to_string()}
        }))
        .expect("pod");
        index.set_pod(
            &super_ns,
            &format!("client-{client}"),
            objects::pod_addresses(&pod),
        );
    }
    services
}

fn query_name(options: &Options, draw: u64) -> Name {
    let service = (draw % options.services as u64) as usize;
    let name = match draw % 20 {
        // Names that do not exist.
        0 => format!("missing-{service}.ns-0.svc.cluster.local."),
        // A headless Service.
        1 => format!("svc-9.ns-{}.svc.cluster.local.", 9 % NAMESPACES_PER_TENANT),
        _ => format!(
            "svc-{service}.ns-{}.svc.cluster.local.",
            service % NAMESPACES_PER_TENANT
        ),
    };
    Name::from_ascii(name).expect("name")
}

/// Latencies in microseconds and answer counts.
#[derive(Default)]
struct Tally {
    latencies: Vec<u32>,
    answered: u64,
    lost: u64,
    bad: u64,
}

/// One sender: asks from its clients' addresses in turn, `interval` apart (`None`: as fast as it is
/// answered), until `until`.
async fn sender(
    server: SocketAddr,
    index: usize,
    options: Arc<Options>,
    interval: Option<Duration>,
    start: Instant,
    until: Instant,
) -> Tally {
    let mut sockets = Vec::new();
    for client in (index..options.clients).step_by(options.senders) {
        let socket = tokio::net::UdpSocket::bind(SocketAddr::new(IpAddr::V4(client_ip(client)), 0))
            .await
            .expect("client socket");
        socket.connect(server).await.expect("connect");
        sockets.push(socket);
    }
    let mut tally = Tally::default();
    let mut buffer = vec![0u8; 4096];
    let mut next = start
        + interval.map_or(Duration::ZERO, |i| {
            i.mul_f64(index as f64 / options.senders as f64)
        });
    let mut id: u16 = (index as u16).wrapping_mul(31);
    let mut draw = index as u64 * 7;
    let mut turn = 0;
    loop {
        if let Some(interval) = interval {
            tokio::time::sleep_until(next.into()).await;
            next += interval;
        }
        let now = Instant::now();
        if now >= until || sockets.is_empty() {
            return tally;
        }
        let socket = &sockets[turn % sockets.len()];
        turn += 1;
        id = id.wrapping_add(1);
        draw = draw
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let mut message = Message::new(id, MessageType::Query, OpCode::Query);
        message.metadata.recursion_desired = true;
        message.add_query(Query::query(query_name(&options, draw >> 33), RecordType::A));
        let bytes = message.to_vec().expect("encode");
        if socket.send(&bytes).await.is_err() {
            tally.lost += 1;
            continue;
        }
        loop {
            match tokio::time::timeout(Duration::from_secs(1), socket.recv(&mut buffer)).await {
                Ok(Ok(length)) => {
                    let elapsed = now.elapsed();
                    match Message::from_vec(&buffer[..length]) {
                        // A late answer to an earlier query of this socket: wait for this one.
                        Ok(reply) if reply.metadata.id != id => continue,
                        Ok(reply)
                            if matches!(
                                reply.metadata.response_code,
                                ResponseCode::NoError | ResponseCode::NXDomain
                            ) =>
                        {
                            tally.answered += 1;
                            tally
                                .latencies
                                .push(elapsed.as_micros().min(u32::MAX as u128) as u32);
                        }
                        _ => tally.bad += 1,
                    }
                }
                _ => tally.lost += 1,
            }
            break;
        }
    }
}

async fn run(server: SocketAddr, options: &Arc<Options>, interval: Option<Duration>, seconds: f64) -> Tally {
    let start = Instant::now() + Duration::from_millis(100);
    let until = start + Duration::from_secs_f64(seconds);
    let tasks: Vec<_> = (0..options.senders)
        .map(|i| tokio::spawn(sender(server, i, options.clone(), interval, start, until)))
        .collect();
    let mut total = Tally::default();
    for task in tasks {
        let tally = task.await.expect("sender");
        total.latencies.extend(tally.latencies);
        total.answered += tally.answered;
        total.lost += tally.lost;
        total.bad += tally.bad;
    }
    total.latencies.sort_unstable();
    total
}

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    f64::from(sorted[rank]) / 1000.0
}

fn report(what: &str, tally: &Tally, seconds: f64) {
    println!(
        "{what}: {:.0} answers/s ({} answered, {} lost, {} bad), latency ms p50 {:.3} p99 {:.3} p99.9 {:.3} max {:.3}",
        tally.answered as f64 / seconds,
        tally.answered,
        tally.lost,
        tally.bad,
        percentile(&tally.latencies, 0.50),
        percentile(&tally.latencies, 0.99),
        percentile(&tally.latencies, 0.999),
        percentile(&tally.latencies, 1.0),
    );
}

fn main() -> anyhow::Result<()> {
    let options = Arc::new(Options::parse());
    anyhow::ensure!(
        options.clients <= 65_000,
        "at most 65000 clients (one loopback address each)"
    );
    anyhow::ensure!(
        options.senders >= 1 && options.senders <= options.clients,
        "1 to --clients senders"
    );
    // The server and the clients on runtimes of their own, as they would be in separate processes (they
    // still share this machine's cores).
    let server_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.server_threads.max(1))
        .thread_name("dns-server")
        .enable_all()
        .build()?;
    let client_runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("dns-clients")
        .enable_all()
        .build()?;
    let before = rss_bytes();
    let mut index = Index::new();
    let filling = Instant::now();
    let services = fill(&mut index, &options);
    let filled = filling.elapsed();
    let after = rss_bytes();
    let objects = index.records();
    println!(
        "index: {} tenants, {services} Services (each with an EndpointSlice of 3 endpoints), {} client pods: {objects} objects, filled in {filled:?}",
        options.tenants, options.clients
    );
    println!(
        "memory: {:.1} MiB resident for the index, {:.0} bytes per Service with its endpoints, {:.0} bytes per object",
        (after.saturating_sub(before)) as f64 / 1048576.0,
        after.saturating_sub(before) as f64 / services as f64,
        after.saturating_sub(before) as f64 / objects as f64,
    );
    let (dns, _upstream) = server_runtime.block_on(async {
        let upstream =
            local_cluster::dns::FakeUpstream::start(SocketAddr::from(([127, 0, 0, 1], 0)), &[]).await?;
        let mut settings = Settings::local(vec![upstream.address()]);
        settings.tenant_qps = 0;
        let dns = Dns::serve_index(settings, Arc::new(RwLock::new(index)), Metrics::default()).await?;
        anyhow::Ok((dns, upstream))
    })?;
    let server = dns.local_addr();
    client_runtime.block_on(async {
        // Warm up (sockets, caches).
        run(server, &options, None, 0.5).await;
        let interval = Duration::from_secs_f64(options.senders as f64 / options.qps as f64);
        let seconds = options.seconds as f64;
        let paced = run(server, &options, Some(interval), seconds).await;
        report(
            &format!(
                "paced at {} queries/s from {} clients ({} senders)",
                options.qps, options.clients, options.senders
            ),
            &paced,
            seconds,
        );
        let saturation_seconds = (seconds / 3.0).max(1.0);
        let saturated = run(server, &options, None, saturation_seconds).await;
        report(
            &format!(
                "saturation ({} senders, one query in flight each)",
                options.senders
            ),
            &saturated,
            saturation_seconds,
        );
    });
    server_runtime.block_on(dns.shutdown())?;
    Ok(())
}
