//! Helpers shared by the vc-manager e2e tests: running vc-manager in process, waiting on VirtualClusters,
//! reading Secrets, verifying certificates with rustls' webpki (independently of vc-manager's own code),
//! and scraping the admin endpoint.

#![allow(dead_code)]

use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::Context as _;
use base64::{Engine, engine::general_purpose::STANDARD};
use crds::VirtualCluster;
use k8s_openapi::{api::core::v1::Secret, apimachinery::pkg::apis::meta::v1::Condition};
use kube::{Api, Client};
use rustls::{
    RootCertStore,
    client::{WebPkiServerVerifier, danger::ServerCertVerifier},
    server::WebPkiClientVerifier,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject};
use tokio::{io::AsyncReadExt, io::AsyncWriteExt, sync::oneshot, task::JoinHandle};
use vc_manager::{LeaderElection, Manager, Settings, metrics::Metrics};

/// Logs to the test output (`RUST_LOG` to tune; default: vc-manager at info).
pub fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,vc_manager=info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_test_writer()
        .try_init();
}

/// Settings for tests: quick retries and checks.
pub fn fast_settings() -> Settings {
    let mut settings = Settings {
        resync_interval: Duration::from_secs(30),
        adopt_check_interval: Duration::from_secs(1),
        deletion_poll_interval: Duration::from_millis(500),
        backoff_base: Duration::from_secs(1),
        backoff_max: Duration::from_secs(4),
        // Simulated nodes mark control-plane pods running; nothing serves.
        native_readiness: vc_manager::NativeReadiness::StatefulSetsReady,
        ..Settings::default()
    };
    settings.tenant_timeouts.connect = Duration::from_secs(2);
    settings.tenant_timeouts.read = Duration::from_secs(5);
    settings
}

/// vc-manager running in this process.
pub struct RunningManager {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<vc_manager::Result<()>>,
    /// Its metrics.
    pub metrics: Metrics,
    /// Its admin endpoint, when served.
    pub admin: Option<SocketAddr>,
}

impl RunningManager {
    /// Starts vc-manager on `client`, with an admin endpoint on a free port, and waits until the endpoint
    /// answers (so that the next free port is another one).
    pub async fn start(
        client: Client,
        settings: Settings,
        election: Option<LeaderElection>,
    ) -> anyhow::Result<Self> {
        let admin: SocketAddr = format!("127.0.0.1:{}", local_cluster::free_port()?).parse()?;
        let mut manager = Manager::new(client, settings).with_admin_endpoint(admin);
        if let Some(election) = election {
            manager = manager.with_leader_election(election);
        }
        let metrics = manager.metrics();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(Box::pin(manager.run(async move {
            let _ = stopped.await;
        })));
        let running = Self {
            stop: Some(stop),
            task,
            metrics,
            admin: Some(admin),
        };
        let start = tokio::time::Instant::now();
        while !matches!(running.admin_get("/healthz").await, Ok((200, _))) {
            anyhow::ensure!(
                !running.task.is_finished(),
                "vc-manager stopped right after starting"
            );
            anyhow::ensure!(
                start.elapsed() < Duration::from_secs(20),
                "admin endpoint {admin} does not answer"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(running)
    }

    /// Stops it and returns how it ended.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let task = &mut self.task;
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .context("vc-manager did not stop")??
            .context("vc-manager ended with an error")
    }

    /// `GET path` on the admin endpoint: status code and body.
    pub async fn admin_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_get(self.admin.context("no admin endpoint")?, path).await
    }
}

impl Drop for RunningManager {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A plain HTTP/1.0 GET: status code and body.
pub async fn http_get(address: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(address).await?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response.split_once("\r\n\r\n").context("HTTP response")?;
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("status code")?;
    Ok((code, body.to_owned()))
}

/// Waits until the VirtualCluster satisfies `check`; the error names `what` and shows the last status.
pub async fn wait_vc(
    api: &Api<VirtualCluster>,
    name: &str,
    timeout: Duration,
    what: &str,
    check: impl Fn(&VirtualCluster) -> bool,
) -> anyhow::Result<VirtualCluster> {
    let start = tokio::time::Instant::now();
    let mut last = None;
    loop {
        if let Ok(Some(vc)) = api.get_opt(name).await {
            if check(&vc) {
                return Ok(vc);
            }
            last = Some(vc);
        }
        if start.elapsed() > timeout {
            anyhow::bail!(
                "VirtualCluster {name}: {what} not reached within {} s; last status: {}",
                timeout.as_secs(),
                serde_json::to_string_pretty(&last.and_then(|v| v.status)).unwrap_or_default()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A condition of a VirtualCluster.
pub fn condition<'a>(vc: &'a VirtualCluster, type_: &str) -> Option<&'a Condition> {
    vc.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

/// Whether the phase is `phase`.
pub fn phase_is(vc: &VirtualCluster, phase: crds::ClusterPhase) -> bool {
    vc.phase() == Some(phase)
}

/// A Secret's key as text.
pub fn secret_text(secret: &Secret, key: &str) -> anyhow::Result<String> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .with_context(|| format!("key {key} of Secret {:?}", secret.metadata.name))?;
    Ok(String::from_utf8(bytes.0.clone())?)
}

fn der(pem: &str) -> anyhow::Result<CertificateDer<'static>> {
    Ok(CertificateDer::from_pem_slice(pem.as_bytes())?)
}

fn roots(ca_pem: &str) -> anyhow::Result<Arc<RootCertStore>> {
    let mut roots = RootCertStore::empty();
    roots.add(der(ca_pem)?)?;
    Ok(Arc::new(roots))
}

/// Verifies with webpki that `cert_pem` is a valid TLS server certificate for `name` (DNS name or IP)
/// issued by `ca_pem`.
pub fn verify_server_certificate(cert_pem: &str, ca_pem: &str, name: &str) -> anyhow::Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiServerVerifier::builder_with_provider(roots(ca_pem)?, provider).build()?;
    let server_name = ServerName::try_from(name.to_owned())?;
    verifier
        .verify_server_cert(&der(cert_pem)?, &[], &server_name, &[], UnixTime::now())
        .with_context(|| format!("server certificate for {name}"))?;
    Ok(())
}

/// Verifies with webpki that `cert_pem` is a valid TLS client certificate issued by `ca_pem`.
pub fn verify_client_certificate(cert_pem: &str, ca_pem: &str) -> anyhow::Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = WebPkiClientVerifier::builder_with_provider(roots(ca_pem)?, provider).build()?;
    verifier
        .verify_client_cert(&der(cert_pem)?, &[], UnixTime::now())
        .context("client certificate")?;
    Ok(())
}

/// Client certificate and key of a kubeconfig's first user.
pub fn kubeconfig_client(yaml: &str) -> anyhow::Result<(String, String, String)> {
    let value: serde_json::Value = serde_saphyr::from_str(yaml)?;
    let decode = |v: &serde_json::Value| -> anyhow::Result<String> {
        Ok(String::from_utf8(
            STANDARD.decode(v.as_str().context("base64 field")?)?,
        )?)
    };
    let user = &value["users"][0]["user"];
    Ok((
        decode(&user["client-certificate-data"])?,
        decode(&user["client-key-data"])?,
        value["clusters"][0]["cluster"]["server"]
            .as_str()
            .context("server")?
            .to_owned(),
    ))
}

/// Subject common name and organizations of a certificate (x509-parser, as used by rcgen).
pub fn subject(cert_pem: &str) -> anyhow::Result<(String, Vec<String>)> {
    let info = tenant_pki::pki::inspect(cert_pem).map_err(anyhow::Error::msg)?;
    Ok((
        info.common_name.unwrap_or_default(),
        info.organizations.into_iter().collect(),
    ))
}
