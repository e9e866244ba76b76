//! One shape for every component's `main`: a [`Builder`] sets up logging, the super-cluster client, the
//! admin endpoint and leader election; the [`Runtime`] it builds hands those to the component and runs it
//! until SIGTERM / SIGINT (or the program embedding it) asks it to stop.
//!
//! ```no_run
//! # async fn component(
//! #     client: kube::Client,
//! #     shutdown: vc_runtime::Shutdown,
//! # ) -> Result<(), vc_runtime::Error> { Ok(()) }
//! # async fn main_() -> Result<(), vc_runtime::Error> {
//! let runtime = vc_runtime::Runtime::builder()
//!     .with_log(vc_runtime::logging::LogFormat::Text)
//!     .with_admin("0.0.0.0:8080".parse().unwrap())
//!     .build()
//!     .await?;
//! let work = component(runtime.client(), runtime.shutdown());
//! runtime.run(work).await
//! # }
//! ```
//!
//! What the runtime does, the same for every component:
//! - logging is installed by [`Builder::build`] (when [`Builder::with_log`] was given);
//! - the admin endpoint (`/metrics`, `/healthz`, `/readyz`; `/metrics` apart when
//!   [`Builder::with_metrics_address`] names another address) serves from the start of [`Runtime::run`] until
//!   the component has stopped, so probes see it through a graceful stop; if it cannot listen, the run ends
//!   with that error;
//! - the first signal (or [`Builder::with_shutdown_on`]) sets `/readyz` to 503 and resolves
//!   [`Shutdown::requested`]; the component then stops in its own way and returns;
//! - leader election is the component's to use: [`Runtime::lease`] acquires the Lease when the component
//!   wants it (vc-manager keeps its caches warm while it waits; the syncer starts only once it leads).

use std::{future::Future, net::SocketAddr, pin::Pin, sync::Arc};

use kube::Client;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::{
    Error,
    admin::{self, Health},
    leader::{LeaderElection, Leadership},
    logging::LogFormat,
};

type Trigger = Pin<Box<dyn Future<Output = ()> + Send>>;

/// Configures a [`Runtime`]. Every part is optional; [`build`](Self::build) fills in what is missing.
#[must_use]
#[derive(Default)]
pub struct Builder {
    log: Option<LogFormat>,
    admin: Option<SocketAddr>,
    metrics: Option<SocketAddr>,
    client: Option<Client>,
    registry: Option<Registry>,
    health: Option<Health>,
    lease: Option<(String, LeaderElection)>,
    shutdown: Option<Trigger>,
}

impl Builder {
    /// Installs the global log subscriber in this format (filter from `RUST_LOG`).
    pub fn with_log(mut self, format: LogFormat) -> Self {
        self.log = Some(format);
        self
    }

    /// Serves `/metrics`, `/healthz` and `/readyz` on `address`.
    pub fn with_admin(mut self, address: SocketAddr) -> Self {
        self.admin = Some(address);
        self
    }

    /// Serves `/metrics` on `address` instead of the admin address, when the two differ (the health routes
    /// stay on the admin address). Without [`with_admin`](Self::with_admin) nothing is served.
    pub fn with_metrics_address(mut self, address: SocketAddr) -> Self {
        self.metrics = Some(address);
        self
    }

    /// Uses `client` for the super cluster (default: KUBECONFIG, else the pod's service account).
    pub fn with_client(mut self, client: Client) -> Self {
        self.client = Some(client);
        self
    }

    /// Serves the metrics registered in `registry` (default: an empty registry without prefix).
    pub fn with_registry(mut self, registry: Registry) -> Self {
        self.registry = Some(registry);
        self
    }

    /// Reports liveness and readiness through `health` (default: a new one, not ready).
    pub fn with_health(mut self, health: Health) -> Self {
        self.health = Some(health);
        self
    }

    /// Elects a leader among replicas on Lease `name` when `election` is `Some` (see [`Runtime::lease`]).
    pub fn with_leader_election(mut self, name: &str, election: Option<LeaderElection>) -> Self {
        self.lease = election.map(|election| (name.to_owned(), election));
        self
    }

    /// Stops when `shutdown` resolves instead of on SIGTERM / SIGINT (a component run inside another
    /// program, such as a test).
    pub fn with_shutdown_on(mut self, shutdown: impl Future<Output = ()> + Send + 'static) -> Self {
        self.shutdown = Some(Box::pin(shutdown));
        self
    }

    /// Installs logging and connects to the super cluster (unless a client was given).
    pub async fn build(self) -> Result<Runtime, Error> {
        if let Some(format) = self.log {
            crate::logging::init(format);
        }
        let client = match self.client {
            Some(client) => client,
            None => crate::clients::super_cluster().await?,
        };
        let lease = self.lease.map(|(name, election)| Lease {
            client: client.clone(),
            name,
            election,
        });
        Ok(Runtime {
            client,
            health: self.health.unwrap_or_default(),
            registry: self.registry.unwrap_or_default(),
            admin: self.admin.map(|admin| AdminAddresses {
                admin,
                metrics: self.metrics.unwrap_or(admin),
            }),
            lease,
            shutdown: Shutdown::default(),
            trigger: self
                .shutdown
                .unwrap_or_else(|| Box::pin(crate::shutdown::signal())),
        })
    }
}

#[derive(Clone, Copy, Debug)]
struct AdminAddresses {
    admin: SocketAddr,
    metrics: SocketAddr,
}

/// A component's process plumbing, ready to run it. See the [module](self) documentation.
pub struct Runtime {
    client: Client,
    health: Health,
    registry: Registry,
    admin: Option<AdminAddresses>,
    lease: Option<Lease>,
    shutdown: Shutdown,
    trigger: Trigger,
}

impl Runtime {
    /// A builder with nothing configured.
    pub fn builder() -> Builder {
        Builder::default()
    }

    /// The super-cluster client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// Liveness and readiness, shared with the admin endpoint.
    pub fn health(&self) -> Health {
        self.health.clone()
    }

    /// The registry `/metrics` serves; register the component's metrics here before [`run`](Self::run).
    pub fn registry_mut(&mut self) -> &mut Registry {
        &mut self.registry
    }

    /// Resolves when the component is asked to stop.
    pub fn shutdown(&self) -> Shutdown {
        self.shutdown.clone()
    }

    /// The Lease to acquire before writing, when leader election is on.
    pub fn lease(&self) -> Option<Lease> {
        self.lease.clone()
    }

    /// Serves the admin endpoint and runs `component` until it returns. The first signal (or the future
    /// given to [`Builder::with_shutdown_on`]) marks the component not ready and resolves
    /// [`Shutdown::requested`]; the admin endpoint stops once the component has returned. An admin endpoint
    /// that cannot listen ends the run with its error.
    pub async fn run<E>(self, component: impl Future<Output = Result<(), E>>) -> Result<(), E>
    where
        E: From<Error>,
    {
        let Self {
            health,
            registry,
            admin,
            shutdown,
            trigger,
            ..
        } = self;
        let admin_stop = CancellationToken::new();
        let mut admin_task = admin.map(|addresses| {
            tokio::spawn(serve_admin(
                addresses,
                Arc::new(registry),
                health.clone(),
                admin_stop.clone(),
            ))
        });
        let trigger_task = tokio::spawn({
            let (shutdown, health) = (shutdown.clone(), health.clone());
            async move {
                trigger.await;
                health.set_ready(false);
                shutdown.request();
            }
        });

        let admin_failed = async {
            match admin_task.as_mut() {
                Some(task) => match task.await {
                    Ok(result) => result,
                    Err(join) => Err(Error::Task(join.to_string())),
                },
                None => std::future::pending().await,
            }
        };
        let outcome = tokio::select! {
            outcome = component => outcome,
            // Serving ends only with an error before the component returns.
            failed = admin_failed => Err(E::from(failed.err().unwrap_or(Error::AdminStopped))),
        };
        health.set_ready(false);
        trigger_task.abort();
        admin_stop.cancel();
        if let Some(task) = admin_task.filter(|task| !task.is_finished()) {
            let served = task.await.map_err(|join| Error::Task(join.to_string()));
            if outcome.is_ok() {
                served.and_then(|served| served).map_err(E::from)?;
            }
        }
        outcome
    }
}

async fn serve_admin(
    addresses: AdminAddresses,
    registry: Arc<Registry>,
    health: Health,
    stop: CancellationToken,
) -> Result<(), Error> {
    if addresses.admin == addresses.metrics {
        return admin::serve(addresses.admin, registry, health, stop.cancelled_owned()).await;
    }
    // Probes reach the health routes; the metrics (which may name tenants) only their own address.
    let health_routes = admin::serve_routes(
        addresses.admin,
        admin::health_router(health),
        stop.clone().cancelled_owned(),
    );
    let metrics_routes = admin::serve_routes(
        addresses.metrics,
        admin::metrics_router(registry),
        stop.cancelled_owned(),
    );
    tokio::try_join!(health_routes, metrics_routes).map(|_| ())
}

/// Whether the component has been asked to stop. Cheap to clone; every clone sees the same request.
#[derive(Clone, Debug, Default)]
pub struct Shutdown(CancellationToken);

impl Shutdown {
    /// Resolves once a stop is requested (at once if it already was).
    pub fn requested(&self) -> impl Future<Output = ()> + Send + 'static {
        self.0.clone().cancelled_owned()
    }

    /// Whether a stop was requested.
    pub fn is_requested(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Requests a stop.
    pub fn request(&self) {
        self.0.cancel();
    }
}

/// The Lease a component acquires before it writes, from [`Builder::with_leader_election`].
#[derive(Clone)]
pub struct Lease {
    client: Client,
    name: String,
    election: LeaderElection,
}

impl Lease {
    /// Waits until this replica holds the Lease. [`Leadership::lost`] then resolves when it no longer does.
    pub async fn acquire(&self) -> Result<Leadership, Error> {
        let identity = self
            .election
            .identity
            .clone()
            .unwrap_or_else(crate::leader::identity);
        Leadership::acquire_as(
            self.client.clone(),
            &self.election.namespace,
            &self.name,
            self.election.lease_duration,
            identity,
        )
        .await
    }

    /// The Lease's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::sync::oneshot;

    use super::*;

    /// A client nothing answers (these tests make no API call).
    fn client() -> Client {
        mock_apiserver::pair().0
    }

    async fn get(address: SocketAddr, path: &str) -> Option<u16> {
        let mut stream = tokio::net::TcpStream::connect(address).await.ok()?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.ok()?;
        answer.split(' ').nth(1)?.parse().ok()
    }

    fn free_address() -> SocketAddr {
        std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
    }

    async fn answered(address: SocketAddr, path: &str) -> u16 {
        for _ in 0..200 {
            if let Some(status) = get(address, path).await {
                return status;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("{address}{path} does not answer");
    }

    /// The stop request reaches the component and turns readiness off; the admin endpoint serves until the
    /// component has returned, then stops.
    #[tokio::test]
    async fn a_stop_request_reaches_the_component_and_the_endpoint_outlives_it() {
        let admin = free_address();
        let (stop, stopped) = oneshot::channel::<()>();
        let runtime = Runtime::builder()
            .with_client(client())
            .with_admin(admin)
            .with_shutdown_on(async move {
                let _ = stopped.await;
            })
            .build()
            .await
            .expect("runtime");
        let shutdown = runtime.shutdown();
        runtime.health().set_ready(true);
        let (returned_tx, returned_rx) = oneshot::channel::<()>();
        let run = tokio::spawn(runtime.run(async move {
            shutdown.requested().await;
            // Stopping: the endpoint still answers, not ready.
            assert_eq!(answered(admin, "/readyz").await, 503);
            assert_eq!(answered(admin, "/healthz").await, 200);
            let _ = returned_tx.send(());
            Ok::<(), Error>(())
        }));
        assert_eq!(answered(admin, "/readyz").await, 200);
        assert_eq!(answered(admin, "/metrics").await, 200);
        stop.send(()).expect("running");
        returned_rx.await.expect("component returned");
        run.await.expect("task").expect("clean stop");
        assert_eq!(get(admin, "/healthz").await, None, "stopped serving");
    }

    /// With a metrics address of its own, `/metrics` is served there and not on the admin address.
    #[tokio::test]
    async fn metrics_can_be_served_apart() {
        let (admin, metrics) = (free_address(), free_address());
        let runtime = Runtime::builder()
            .with_client(client())
            .with_admin(admin)
            .with_metrics_address(metrics)
            .with_shutdown_on(std::future::pending())
            .build()
            .await
            .expect("runtime");
        let shutdown = runtime.shutdown();
        let run = tokio::spawn(runtime.run(async move {
            assert_eq!(answered(metrics, "/metrics").await, 200);
            assert_eq!(answered(admin, "/metrics").await, 404);
            assert_eq!(answered(admin, "/healthz").await, 200);
            assert!(!shutdown.is_requested());
            Ok::<(), Error>(())
        }));
        run.await.expect("task").expect("ran");
    }

    /// An admin address that cannot be listened on ends the run with that error.
    #[tokio::test]
    async fn an_admin_endpoint_that_cannot_listen_ends_the_run() {
        let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let runtime = Runtime::builder()
            .with_client(client())
            .with_admin(taken.local_addr().expect("addr"))
            .with_shutdown_on(std::future::pending())
            .build()
            .await
            .expect("runtime");
        let error = runtime
            .run(std::future::pending::<Result<(), Error>>())
            .await
            .expect_err("cannot listen");
        assert!(matches!(error, Error::AdminListen { .. }), "{error}");
    }
}
