//! vn-agent: the kubelet API of virtual nodes.
//!
//! A tenant apiserver reaches "kubelets" through vNodes whose kubelet port is vn-agent's. vn-agent runs on
//! every super node and makes `kubectl logs`, `exec`, `attach`, `port-forward` and `top` work for tenants
//! while keeping them apart:
//!
//! - [`identity`]: the caller is the tenant whose kubelet-client CA signed its client certificate and whose
//!   cluster key is the certificate's common name; the CAs come from live VirtualClusters' `kubelet-client`
//!   Secrets ([`caches`]).
//! - [`route`]: which kubelet endpoint a request is for.
//! - [`translate`]: tenant namespaces to super namespaces (the syncer's mapping), the ownership check on
//!   super pods, the super-apiserver form of each request, and `/pods`, `/stats/summary` and
//!   `/metrics/resource` cut down to the caller's pods and translated back.
//! - [`backend`]: the node's kubelet or the super apiserver.
//! - [`proxy`]: one request end to end, streams spliced without buffering; [`server`]: connections and
//!   graceful shutdown; [`tls`]: certificates; [`metrics`]; [`settings`]: flags; [`run`]: the binary's
//!   component on the shared runtime.

pub mod backend;
pub mod caches;
pub mod identity;
pub mod limits;
pub mod metrics;
pub mod proxy;
pub mod response;
pub mod route;
pub mod server;
pub mod settings;
pub mod tls;
pub mod translate;

mod error;

use std::{net::SocketAddr, sync::Arc};

use rustls_pki_types::CertificateDer;
use tokio::{net::TcpListener, task::JoinHandle};
use tokio_util::{sync::CancellationToken, task::TaskTracker};
use vc_runtime::Runtime;

pub use error::{Error, Result};
pub use metrics::Metrics;
pub use settings::{Args, Settings};

/// A running vn-agent.
pub struct Agent {
    local_addr: SocketAddr,
    caches: Arc<caches::Caches>,
    serving: Arc<tls::KeyPairSource>,
    shutdown: CancellationToken,
    stopped: CancellationToken,
    server: JoinHandle<()>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl Agent {
    /// Binds the listener, starts the caches and serves. Requests get 503 until the caches are synced.
    /// `client` is the super cluster's (watches, pod lookups, and the super-apiserver backend).
    pub async fn start(settings: Settings, client: kube::Client, metrics: Metrics) -> Result<Self> {
        let provider = tls::provider();
        let stopped = CancellationToken::new();
        let serving = tls::KeyPairSource::serving(&settings.serving_certificate, provider.clone())?;
        serving
            .clone()
            .watch("serving", std::time::Duration::from_secs(30), stopped.clone());
        let tls_config = Arc::new(tls::server_config(serving.clone(), provider.clone())?);
        let backend = backend::Backend::new(&settings.backend, client.clone(), provider, &stopped)?;
        let listener = TcpListener::bind(settings.listen_address)
            .await
            .map_err(|source| Error::Listen {
                addr: settings.listen_address,
                source,
            })?;
        let local_addr = listener.local_addr().map_err(|source| Error::Listen {
            addr: settings.listen_address,
            source,
        })?;
        let caches = caches::Caches::start(
            client,
            settings.nodes.clone(),
            &settings.ca_bundle,
            metrics.clone(),
            stopped.clone(),
        );
        let ctx = Arc::new(proxy::Context {
            caches: caches.clone(),
            backend,
            metrics,
            streams: TaskTracker::new(),
            cut_streams: CancellationToken::new(),
            gate: limits::Gate::new(settings.limits),
        });
        let shutdown = CancellationToken::new();
        tracing::info!(
            address = %local_addr,
            backend = ctx.backend.name(),
            nodes = ?settings.nodes,
            "vn-agent listening"
        );
        let server = tokio::spawn({
            let shutdown = shutdown.clone();
            let stopped = stopped.clone();
            let grace = settings.shutdown_grace_period;
            async move {
                server::serve(listener, tls_config, ctx, shutdown, grace).await;
                stopped.cancel();
            }
        });
        Ok(Self {
            local_addr,
            caches,
            serving,
            shutdown,
            stopped,
            server,
        })
    }

    /// The address the kubelet API listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The serving certificate chain in use.
    pub fn serving_chain(&self) -> Vec<CertificateDer<'static>> {
        self.serving.chain()
    }

    /// Waits until the caches are synced and requests are answered.
    pub async fn wait_ready(&self) -> Result<()> {
        self.caches.wait_ready().await
    }

    /// Whether requests are answered.
    pub fn is_ready(&self) -> bool {
        self.caches.is_ready()
    }

    /// How many tenants are trusted now.
    pub fn trusted_tenants(&self) -> Vec<String> {
        self.caches
            .trust()
            .tenant_keys()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// Resolves when the server stopped (after [`shutdown`](Self::shutdown), or on its own).
    pub async fn stopped(&self) {
        self.stopped.cancelled().await;
    }

    /// Stops accepting, lets open requests and streams finish within the grace period, then stops the
    /// caches.
    pub async fn shutdown(self) -> Result<()> {
        self.shutdown.cancel();
        let result = self.server.await.map_err(Error::Task);
        self.stopped.cancel();
        result
    }
}

/// Runs vn-agent on `runtime` until it is asked to stop: `/readyz` answers once the caches are synced; a
/// stop lets open requests and streams finish within the grace period. A proxy or caches that stop on
/// their own make `/healthz` fail and end the run with an error.
pub async fn run(mut runtime: Runtime, settings: Settings) -> Result<()> {
    let metrics = Metrics::register(runtime.registry_mut());
    let (client, health, shutdown) = (runtime.client(), runtime.health(), runtime.shutdown());
    runtime
        .run(async move {
            let agent = Agent::start(settings, client, metrics).await?;
            let ready = async {
                match agent.wait_ready().await {
                    Ok(()) => {
                        health.set_ready(true);
                        std::future::pending::<()>().await;
                    }
                    Err(error) => {
                        tracing::error!(error = &error as &dyn std::error::Error, "caches never synced")
                    }
                }
            };
            tokio::select! {
                () = shutdown.requested() => {}
                () = agent.stopped() => {
                    health.set_dead();
                    return Err(Error::Stopped("the proxy stopped on its own"));
                }
                () = ready => {
                    health.set_dead();
                    return Err(Error::Stopped("the caches stopped before they synced"));
                }
            }
            health.set_ready(false);
            agent.shutdown().await?;
            tracing::info!("vn-agent stopped");
            Ok(())
        })
        .await
}
