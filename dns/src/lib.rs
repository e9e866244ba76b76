//! vc-dns: cluster DNS for every tenant, served from the super cluster.
//!
//! Tenant pods are pointed at vc-dns by the syncer. vc-dns tells tenants apart by the source address of a
//! query (the super pod with that address carries its tenant's cluster key) and answers each one from its
//! own Services only, with the addresses that work in the super cluster:
//!
//! - [`index`]: the records and the record logic (pure); [`objects`]: super-cluster objects turned into
//!   records, tenant input checked as hostile;
//! - [`watch`]: the super-cluster watches that keep the index current;
//! - [`server`]: one query end to end; [`limits`]: per-tenant query rate and upstream concurrency;
//!   [`upstream`]: the platform's resolvers for everything outside the cluster domain;
//! - [`metrics`], [`settings`].

pub mod index;
pub mod limits;
pub mod metrics;
pub mod objects;
pub mod server;
pub mod settings;
pub mod upstream;
pub mod watch;

mod error;

use std::{
    net::SocketAddr,
    sync::{Arc, RwLock},
    time::Duration,
};

use hickory_server::Server;
use tokio::{
    net::{TcpListener, UdpSocket},
    task::JoinHandle,
};
use tokio_util::sync::CancellationToken;

pub use error::{Error, Result};
pub use metrics::Metrics;
pub use settings::{Args, Settings};
use watch::SharedIndex;

/// Receive buffer of the UDP socket: a burst of queries from many pods waits here rather than being dropped
/// by the kernel (the default is a few hundred KiB; the kernel caps it at `net.core.rmem_max`).
const UDP_RECEIVE_BUFFER: usize = 8 << 20;

fn udp_socket(address: SocketAddr) -> std::io::Result<UdpSocket> {
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(address),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if let Err(error) = socket.set_recv_buffer_size(UDP_RECEIVE_BUFFER) {
        tracing::debug!(%error, "UDP receive buffer left at the default");
    }
    socket.set_nonblocking(true)?;
    socket.bind(&address.into())?;
    UdpSocket::from_std(socket.into())
}

/// Binds UDP and TCP on the same address. With port 0 the kernel picks the UDP port, and that port may be
/// taken for TCP: then another is tried.
async fn bind(address: SocketAddr) -> Result<(UdpSocket, TcpListener, SocketAddr)> {
    let listen = |protocol: &'static str| {
        move |source| Error::Listen {
            addr: address,
            protocol,
            source,
        }
    };
    let mut attempts = 0;
    loop {
        let udp = udp_socket(address).map_err(listen("udp"))?;
        let local = udp.local_addr().map_err(listen("udp"))?;
        match TcpListener::bind(local).await {
            Ok(tcp) => return Ok((udp, tcp, local)),
            Err(error) if address.port() == 0 && attempts < 20 => {
                attempts += 1;
                tracing::debug!(%error, port = local.port(), "TCP port taken; another");
            }
            Err(error) => return Err(listen("tcp")(error)),
        }
    }
}

/// A running vc-dns.
pub struct Dns {
    local_addr: SocketAddr,
    index: SharedIndex,
    changes: watch::IndexChanges,
    synced: Option<watch::Synced>,
    watches: CancellationToken,
    server_shutdown: CancellationToken,
    server: JoinHandle<Result<()>>,
}

impl std::fmt::Debug for Dns {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dns")
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl Dns {
    /// Binds UDP and TCP, starts the super-cluster watches and serves. Until the watches have listed, every
    /// query is refused (no pod is known yet).
    pub async fn start(settings: Settings, client: kube::Client, metrics: Metrics) -> Result<Self> {
        let index: SharedIndex = Arc::new(RwLock::new(index::Index::new()));
        let changes = watch::index_changes();
        let watches = CancellationToken::new();
        let synced = watch::start(
            client,
            index.clone(),
            metrics.clone(),
            changes.clone(),
            watches.clone(),
        );
        let mut dns = Self::serve(settings, index, changes, metrics, watches.clone()).await?;
        dns.synced = Some(synced);
        Ok(dns)
    }

    /// Serves from `index`, filled by the caller (benchmarks, tests of the server alone), who tells
    /// [`Dns::index_changes`] of changes made while serving.
    pub async fn serve_index(settings: Settings, index: SharedIndex, metrics: Metrics) -> Result<Self> {
        Self::serve(
            settings,
            index,
            watch::index_changes(),
            metrics,
            CancellationToken::new(),
        )
        .await
    }

    async fn serve(
        settings: Settings,
        index: SharedIndex,
        changes: watch::IndexChanges,
        metrics: Metrics,
        watches: CancellationToken,
    ) -> Result<Self> {
        let forwarder = upstream::Forwarder::new(&settings.upstream, settings.upstream_timeout)?;
        let (udp, tcp, local_addr) = bind(settings.listen_address).await?;
        let limits = limits::Limits::new(
            settings.tenant_qps,
            settings.tenant_burst,
            settings.tenant_upstream_concurrency,
            settings.upstream_concurrency,
        );
        let shared = Arc::new(server::Shared {
            index: index.clone(),
            changes: changes.clone(),
            unknown_sources: server::UnknownSources::with_ranges(
                settings.unknown_source_wait,
                settings.unknown_source_waiters,
                settings.unknown_source_ranges,
            ),
            limits,
            forwarder,
            metrics,
            never_forward: settings.never_forward.clone(),
        });
        // Tenants that are gone leave no limiter state behind.
        tokio::spawn({
            let shared = Arc::downgrade(&shared);
            let stop = watches.clone();
            async move {
                loop {
                    tokio::select! {
                        _ = stop.cancelled() => return,
                        _ = tokio::time::sleep(Duration::from_secs(60)) => {}
                    }
                    let Some(shared) = shared.upgrade() else { return };
                    let index = shared.index.read().unwrap_or_else(|e| e.into_inner());
                    shared.limits.retain(|tenant| index.domain(tenant).is_some());
                }
            }
        });
        let mut server = Server::new(server::Handler::new(shared));
        server.register_socket(udp);
        server.register_listener(tcp, settings.tcp_idle, 65_535);
        let server_shutdown = server.shutdown_token().clone();
        let server = tokio::spawn(async move {
            server
                .block_until_done()
                .await
                .map_err(|e| Error::Server(Box::new(e)))
        });
        tracing::info!(address = %local_addr, upstream = ?settings.upstream, "vc-dns listening (UDP and TCP)");
        Ok(Self {
            local_addr,
            index,
            changes,
            synced: None,
            watches,
            server_shutdown,
            server,
        })
    }

    /// The address queries go to (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The index answered from.
    pub fn index(&self) -> SharedIndex {
        self.index.clone()
    }

    /// Where changes of the index are told (queries from unknown addresses wait on it).
    pub fn index_changes(&self) -> watch::IndexChanges {
        self.changes.clone()
    }

    /// Waits until every watch has listed once.
    pub async fn wait_ready(&self) -> Result<()> {
        match &self.synced {
            Some(synced) => synced.wait().await,
            None => Ok(()),
        }
    }

    /// Whether every watch has listed once.
    pub fn is_ready(&self) -> bool {
        self.synced.as_ref().is_none_or(watch::Synced::is_ready)
    }

    /// Whether the server stopped on its own.
    pub fn is_finished(&self) -> bool {
        self.server.is_finished()
    }

    /// Stops serving and watching.
    pub async fn shutdown(self) -> Result<()> {
        self.server_shutdown.cancel();
        self.watches.cancel();
        match self.server.await {
            Ok(result) => result,
            Err(error) => Err(Error::Server(Box::new(error))),
        }
    }
}

/// Runs vc-dns on the shared runtime until it is asked to stop: ready (`/readyz`) once the super-cluster
/// watches listed, and an error if the server or its watches stop on their own.
pub async fn run(mut runtime: vc_runtime::Runtime, settings: Settings) -> Result<()> {
    let metrics = Metrics::register(runtime.registry_mut());
    let (client, health, shutdown) = (runtime.client(), runtime.health(), runtime.shutdown());
    runtime
        .run(async move {
            let dns = Dns::start(settings, client, metrics).await?;
            let ready = async {
                match dns.wait_ready().await {
                    Ok(()) => {
                        tracing::info!("super-cluster watches listed; answering");
                        health.set_ready(true);
                        std::future::pending::<()>().await;
                    }
                    Err(error) => {
                        tracing::error!(error = &error as &dyn std::error::Error, "watches never listed")
                    }
                }
            };
            let stopped = async {
                while !dns.is_finished() {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            };
            tokio::select! {
                () = shutdown.requested() => {}
                () = stopped => {
                    health.set_dead();
                    return Err(Error::Stopped("the DNS server stopped on its own"));
                }
                () = ready => {
                    health.set_dead();
                    return Err(Error::Stopped("the watches stopped before they listed"));
                }
            }
            health.set_ready(false);
            dns.shutdown().await?;
            tracing::info!("vc-dns stopped");
            Ok(())
        })
        .await
}
