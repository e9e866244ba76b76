//! vn-agent benchmark: what the proxy adds to kubelet requests, measured against the simulated kubelet
//! reached directly, and what authentication costs with many tenants. Prints figures; asserts nothing.
//!
//! `cargo run -p e2e --release --bin vn_agent_bench [-- --requests 2000 --pods 110 --stream-mib 64]`
//!
//! Needs etcd and kube-apiserver (see the e2e README section). Everything runs in one process on
//! loopback, so the figures are relative: the direct and the proxied path share the same machine.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use crds::{
    VirtualCluster,
    naming::{cluster_key_of, super_namespace},
    wellknown::{
        ANNOTATION_CLUSTER, ANNOTATION_NAMESPACE, ANNOTATION_UID, ANNOTATION_VC_NAME,
        ANNOTATION_VC_NAMESPACE, ANNOTATION_VC_UID, KUBELET_CLIENT_CA_KEY, LABEL_CLUSTER,
        LABEL_KUBELET_CLIENT, SECRET_KUBELET_CLIENT,
    },
};
use futures::{SinkExt, StreamExt};
use k8s_openapi::{
    ByteString,
    api::core::v1::{Namespace, Pod, Secret, ServiceAccount},
};
use kube::{
    Api, Client, ResourceExt,
    api::{Patch, PatchParams, PostParams},
};
use local_cluster::{
    Binary, ControlPlane, ControlPlaneOptions, NodeSimulator, NodeSimulatorOptions, WorkDir,
    http_client::{HttpsClient, client_tls},
    pki::{CertificateAuthority, CertifiedKey, Usage},
    wait,
};
use rustls_pki_types::{CertificateDer, UnixTime, pem::PemObject};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Res<T> = Result<T, BoxError>;

/// Fails with the message unless the condition holds.
macro_rules! ensure {
    ($condition:expr, $($message:tt)+) => {
        if !$condition {
            return Err(format!($($message)+).into());
        }
    };
}
use serde_json::json;
use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
use vn_agent::{
    Agent, Metrics,
    identity::TrustSet,
    settings::{BackendSettings, KubeletServerCa, KubeletSettings, NodeScope, ServingCertificate, Settings},
};

struct Options {
    requests: usize,
    pods: usize,
    stream_mib: usize,
    tenants: usize,
}

fn options() -> Res<Options> {
    let mut options = Options {
        requests: 2000,
        pods: 110,
        stream_mib: 64,
        tenants: 1000,
    };
    let args: Vec<String> = std::env::args().skip(1).collect();
    for pair in args.chunks(2) {
        let value: usize = pair.get(1).ok_or("a value after each flag")?.parse()?;
        match pair[0].as_str() {
            "--requests" => options.requests = value,
            "--pods" => options.pods = value,
            "--stream-mib" => options.stream_mib = value,
            "--tenants" => options.tenants = value,
            other => return Err(format!("unknown flag {other}").into()),
        }
    }
    Ok(options)
}

fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Res<T> {
    Ok(serde_json::from_value(value)?)
}

async fn ensure_namespace(client: &Client, name: &str) -> Res<()> {
    let params = PatchParams::apply("vn-agent-bench").force();
    Api::<Namespace>::all(client.clone())
        .patch(
            name,
            &params,
            &Patch::Apply(object::<Namespace>(
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
            )?),
        )
        .await?;
    Api::<ServiceAccount>::namespaced(client.clone(), name)
        .patch(
            "default",
            &params,
            &Patch::Apply(object::<ServiceAccount>(
                json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}),
            )?),
        )
        .await?;
    Ok(())
}

/// Latencies, sorted.
struct Samples(Vec<Duration>);

impl Samples {
    fn new(mut samples: Vec<Duration>) -> Self {
        samples.sort();
        Self(samples)
    }

    fn percentile(&self, p: f64) -> f64 {
        let index = ((self.0.len() as f64 - 1.0) * p).round() as usize;
        self.0[index].as_secs_f64() * 1000.0
    }

    fn line(&self, what: &str) -> String {
        let mean = self.0.iter().map(Duration::as_secs_f64).sum::<f64>() / self.0.len() as f64 * 1000.0;
        format!(
            "{what:<44} n={:<5} mean={mean:>7.3} ms  p50={:>7.3} ms  p99={:>7.3} ms",
            self.0.len(),
            self.percentile(0.5),
            self.percentile(0.99)
        )
    }
}

async fn sequential(client: &HttpsClient, url: &str, count: usize) -> Res<Samples> {
    let mut samples = Vec::with_capacity(count);
    for _ in 0..count {
        let started = Instant::now();
        let (code, _) = client.get(url).await?;
        ensure!(code == 200, "GET {url}: {code}");
        samples.push(started.elapsed());
    }
    Ok(Samples::new(samples))
}

async fn throughput(client: &HttpsClient, url: &str, workers: usize, duration: Duration) -> Res<f64> {
    let deadline = Instant::now() + duration;
    let mut tasks = Vec::new();
    for _ in 0..workers {
        let client = client.clone();
        let url = url.to_owned();
        tasks.push(tokio::spawn(async move {
            let mut done = 0usize;
            while Instant::now() < deadline {
                let (code, _) = client.get(&url).await?;
                ensure!(code == 200, "GET {url}: {code}");
                done += 1;
            }
            Ok::<_, BoxError>(done)
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await??;
    }
    Ok(total as f64 / duration.as_secs_f64())
}

/// Pushes `mib` MiB through a WebSocket exec of `cat` and waits for all of it to come back; MiB/s.
async fn stream(port: u16, ca: &str, identity: &CertifiedKey, path: &str, mib: usize) -> Res<f64> {
    let tls = client_tls(ca, Some(identity))?;
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect("127.0.0.1".try_into()?, tcp)
        .await?;
    let mut request = format!("wss://127.0.0.1:{port}{path}").into_client_request()?;
    request
        .headers_mut()
        .insert("sec-websocket-protocol", "v5.channel.k8s.io".parse()?);
    let (socket, _) = tokio_tungstenite::client_async(request, tls).await?;
    let (mut sink, mut incoming) = socket.split();
    let chunk = vec![b'x'; 32 * 1024];
    let chunks = mib * 32;
    let started = Instant::now();
    let sender = tokio::spawn(async move {
        for _ in 0..chunks {
            let mut message = Vec::with_capacity(chunk.len() + 1);
            message.push(0);
            message.extend_from_slice(&chunk);
            sink.send(Message::Binary(message.into())).await?;
        }
        // v5: close stdin, so cat ends.
        sink.send(Message::Binary(vec![255, 0].into())).await?;
        Ok::<_, BoxError>(sink)
    });
    let mut received = 0usize;
    while let Some(message) = incoming.next().await {
        match message? {
            Message::Binary(bytes) if bytes.first() == Some(&1) => received += bytes.len() - 1,
            Message::Close(_) => break,
            _ => {}
        }
    }
    let elapsed = started.elapsed();
    let _sink = sender.await??;
    ensure!(received == mib * 1024 * 1024, "received {received} bytes");
    Ok(mib as f64 / elapsed.as_secs_f64())
}

fn virtual_cluster(i: usize) -> Res<VirtualCluster> {
    let mut vc: VirtualCluster = object(json!({
        "apiVersion": "tenancy.x-k8s.io/v1alpha1", "kind": "VirtualCluster",
        "metadata": {"name": format!("vc-{i}"), "namespace": "tenants"},
        "spec": {"clusterVersionName": "cv"}
    }))?;
    vc.metadata.uid = Some(format!("uid-{i}"));
    Ok(vc)
}

fn kubelet_client_secret(vc: &VirtualCluster, ca: &CertificateAuthority) -> Res<Secret> {
    let key = cluster_key_of(vc).ok_or("key")?;
    let mut secret: Secret = object(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {
            "name": SECRET_KUBELET_CLIENT, "namespace": key,
            "labels": {LABEL_KUBELET_CLIENT: "true"},
            "annotations": {
                ANNOTATION_CLUSTER: key,
                ANNOTATION_VC_NAME: vc.name_any(),
                ANNOTATION_VC_NAMESPACE: vc.namespace().unwrap_or_default(),
                ANNOTATION_VC_UID: vc.uid().unwrap_or_default(),
            }
        }
    }))?;
    secret.data = Some(
        [(
            KUBELET_CLIENT_CA_KEY.to_owned(),
            ByteString(ca.cert_pem().as_bytes().to_vec()),
        )]
        .into_iter()
        .collect(),
    );
    Ok(secret)
}

/// Authentication with many tenants whose CAs share one subject: the claimed tenant's CA is tried first.
fn authentication(tenants: usize) -> Res<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let vcs: Vec<VirtualCluster> = (0..tenants).map(virtual_cluster).collect::<Res<_>>()?;
    let cas: Vec<CertificateAuthority> = (0..tenants)
        .map(|_| CertificateAuthority::new("kubelet-client-ca"))
        .collect::<Result<_, _>>()?;
    let secrets: Vec<Secret> = vcs
        .iter()
        .zip(&cas)
        .map(|(vc, ca)| kubelet_client_secret(vc, ca))
        .collect::<Res<_>>()?;
    let (entries, _) = vc_manager::ca_bundle::entries(&secrets);
    let entries: Vec<(String, String)> = entries.into_iter().collect();
    let started = Instant::now();
    let (set, untrusted) = TrustSet::build(1, &vcs, &entries, &provider);
    let build = started.elapsed();
    ensure!(
        untrusted.is_empty() && set.len() == tenants,
        "trust set incomplete"
    );
    let der = |cert: &CertifiedKey| -> Res<Vec<CertificateDer<'static>>> {
        Ok(CertificateDer::pem_slice_iter(cert.cert_pem.as_bytes()).collect::<Result<_, _>>()?)
    };
    let last = tenants - 1;
    let own = der(&cas[last].issue(&cluster_key_of(&vcs[last]).ok_or("key")?, &[], &[], Usage::Client)?)?;
    let impostor = der(&CertificateAuthority::new("kubelet-client-ca")?.issue(
        &cluster_key_of(&vcs[last]).ok_or("key")?,
        &[],
        &[],
        Usage::Client,
    )?)?;
    let rounds = 2000;
    for (what, chain, expect_ok) in [
        ("a tenant's own certificate", &own, true),
        ("an impostor CA's certificate", &impostor, false),
    ] {
        let started = Instant::now();
        for _ in 0..rounds {
            ensure!(
                set.authenticate(chain, UnixTime::now()).is_ok() == expect_ok,
                "unexpected result"
            );
        }
        println!(
            "authenticate, {tenants} tenants, {what:<30} {:>8.1} µs per check",
            started.elapsed().as_secs_f64() * 1e6 / rounds as f64
        );
    }
    println!(
        "trust set build, {tenants} tenants                          {:>8.1} ms",
        build.as_secs_f64() * 1000.0
    );
    Ok(())
}

#[tokio::main]
async fn main() -> Res<()> {
    let options = options()?;
    if !local_cluster::require("vn_agent_bench", &[Binary::Etcd, Binary::KubeApiserver]) {
        return Ok(());
    }
    let super_cluster = ControlPlane::start(ControlPlaneOptions::bare("bench")).await?;
    let client = super_cluster.client();
    local_cluster::install_crds(&client).await?;
    let client_ca = CertificateAuthority::new("vn-agent client CA")?;
    let simulator = NodeSimulator::start(
        &super_cluster,
        NodeSimulatorOptions {
            node_count: 1,
            extra_client_cas: vec![client_ca.cert_pem().to_owned()],
            ..Default::default()
        },
    )
    .await?;
    simulator.wait_ready(&client).await?;
    let node = simulator.nodes()[0].clone();
    let kubelet = simulator.kubelet().ok_or("kubelet")?;

    // One tenant with half the node's pods; the rest belong to nobody in particular.
    ensure_namespace(&client, "tenants").await?;
    let vc: VirtualCluster = Api::<VirtualCluster>::namespaced(client.clone(), "tenants")
        .create(&PostParams::default(), &virtual_cluster(0)?)
        .await?;
    let key = cluster_key_of(&vc).ok_or("key")?;
    ensure_namespace(&client, &key).await?;
    let tenant_ca = CertificateAuthority::new("kubelet-client-ca")?;
    let secret = kubelet_client_secret(&vc, &tenant_ca)?;
    Api::<Secret>::namespaced(client.clone(), &key)
        .create(&PostParams::default(), &secret)
        .await?;
    // vc-manager's part: the CA bundle vn-agent reads.
    let bundle_ref: vc_manager::ca_bundle::BundleRef = "default/kubelet-client-cas".parse()?;
    let (entries, _) = vc_manager::ca_bundle::entries([&secret]);
    Api::<k8s_openapi::api::core::v1::ConfigMap>::namespaced(client.clone(), &bundle_ref.namespace)
        .create(
            &PostParams::default(),
            &vc_manager::ca_bundle::bundle(&bundle_ref, entries),
        )
        .await?;
    let tenant_identity = tenant_ca.issue(&key, &[], &[], Usage::Client)?;
    let super_ns = super_namespace(&key, "team");
    ensure_namespace(&client, &super_ns).await?;
    ensure_namespace(&client, "others").await?;
    for i in 0..options.pods {
        let (namespace, labels, annotations) = match i % 2 {
            0 => (
                super_ns.clone(),
                json!({LABEL_CLUSTER: key}),
                json!({ANNOTATION_CLUSTER: key, ANNOTATION_NAMESPACE: "team", ANNOTATION_UID: format!("tenant-uid-{i}")}),
            ),
            _ => ("others".to_owned(), json!({}), json!({})),
        };
        let name = if i == 0 {
            "web".to_owned()
        } else {
            format!("pod-{i}")
        };
        Api::<Pod>::namespaced(client.clone(), &namespace)
            .create(
                &PostParams::default(),
                &object(json!({
                    "metadata": {"name": name, "labels": labels, "annotations": annotations},
                    "spec": {"nodeName": node, "containers": [{"name": "app", "image": "app"}]}
                }))?,
            )
            .await?;
    }
    local_cluster::nodes::wait_pods_running(
        &client,
        &super_ns,
        options.pods.div_ceil(2),
        Duration::from_secs(60),
    )
    .await?;

    let dir = WorkDir::new("vn-agent-bench")?;
    let serving_ca = CertificateAuthority::new("vn-agent serving CA")?;
    let serving = serving_ca.issue("vn-agent", &[], &["127.0.0.1"], Usage::Server)?;
    let agent_identity = client_ca.issue("vn-agent", &[], &[], Usage::Client)?;
    let agent = Agent::start(
        Settings {
            listen_address: "127.0.0.1:0".parse()?,
            serving_certificate: ServingCertificate::Files {
                cert: dir.write("serving.crt", &serving.cert_pem)?,
                key: dir.write("serving.key", &serving.key_pem)?,
            },
            nodes: NodeScope::Named(vec![node.clone()]),
            backend: BackendSettings::Kubelet(KubeletSettings {
                url: kubelet.url().parse()?,
                client_certificate: dir.write("client.crt", &agent_identity.cert_pem)?,
                client_key: dir.write("client.key", &agent_identity.key_pem)?,
                server_ca: KubeletServerCa::File(
                    dir.write("kubelet-ca.crt", super_cluster.apiserver().ca().cert_pem())?,
                ),
            }),
            shutdown_grace_period: Duration::from_secs(1),
            limits: Default::default(),
            ca_bundle: vn_agent::settings::CaBundle {
                namespace: bundle_ref.namespace.clone(),
                name: bundle_ref.name.clone(),
            },
        },
        client.clone(),
        Metrics::default(),
    )
    .await?;
    agent.wait_ready().await?;
    wait::until_true(Duration::from_secs(30), "tenant trusted", || {
        let trusted = agent.trusted_tenants().len();
        async move { trusted == 1 }
    })
    .await?;
    let agent_port = agent.local_addr().port();
    let via_agent = HttpsClient::new(serving_ca.cert_pem(), Some(&tenant_identity))?;
    let direct = HttpsClient::new(super_cluster.apiserver().ca().cert_pem(), Some(&agent_identity))?;
    let agent_url = format!("https://127.0.0.1:{agent_port}");

    println!(
        "vn-agent bench: {} requests, {} pods on the node ({} the tenant's)",
        options.requests,
        options.pods,
        options.pods.div_ceil(2)
    );
    for (what, client, url) in [
        (
            "containerLogs direct to the kubelet",
            &direct,
            format!("{}/containerLogs/{super_ns}/web/app", kubelet.url()),
        ),
        (
            "containerLogs through vn-agent",
            &via_agent,
            format!("{agent_url}/containerLogs/team/web/app"),
        ),
        (
            "stats/summary direct to the kubelet",
            &direct,
            format!("{}/stats/summary", kubelet.url()),
        ),
        (
            "stats/summary through vn-agent (filtered)",
            &via_agent,
            format!("{agent_url}/stats/summary"),
        ),
        (
            "pods direct to the kubelet",
            &direct,
            format!("{}/pods", kubelet.url()),
        ),
        (
            "pods through vn-agent (filtered)",
            &via_agent,
            format!("{agent_url}/pods"),
        ),
    ] {
        // Warm the connection pools first.
        sequential(client, &url, 20).await?;
        println!("{}", sequential(client, &url, options.requests).await?.line(what));
    }
    for (what, client, url) in [
        (
            "containerLogs direct, 16 concurrent",
            &direct,
            format!("{}/containerLogs/{super_ns}/web/app", kubelet.url()),
        ),
        (
            "containerLogs through vn-agent, 16 concurrent",
            &via_agent,
            format!("{agent_url}/containerLogs/team/web/app"),
        ),
    ] {
        let rate = throughput(client, &url, 16, Duration::from_secs(3)).await?;
        println!("{what:<44} {rate:>9.0} requests/s");
    }
    let query = "command=cat&input=1&output=1&error=1";
    let direct_rate = stream(
        kubelet.port(),
        super_cluster.apiserver().ca().cert_pem(),
        &agent_identity,
        &format!("/exec/{super_ns}/web/app?{query}"),
        options.stream_mib,
    )
    .await?;
    let agent_rate = stream(
        agent_port,
        serving_ca.cert_pem(),
        &tenant_identity,
        &format!("/exec/team/web/app?{query}"),
        options.stream_mib,
    )
    .await?;
    println!(
        "exec cat over WebSocket, {} MiB each way: direct {direct_rate:.0} MiB/s, through vn-agent {agent_rate:.0} MiB/s",
        options.stream_mib
    );
    authentication(options.tenants)?;
    agent.shutdown().await?;
    Ok(())
}
