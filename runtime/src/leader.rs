//! Leader election on a `coordination.k8s.io` Lease, so that two replicas can run with one active.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::{sync::watch, task::JoinHandle};

use crate::Error;

/// Flags for leader election, shared by the components that need it.
#[derive(Clone, Debug, clap::Args)]
pub struct LeaderElectionArgs {
    /// Elect a leader among replicas; only the leader writes.
    #[arg(long, env = "LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_elect: bool,
    /// Namespace of the Lease (default: the pod's namespace from POD_NAMESPACE, else `default`).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub lease_namespace: String,
    /// Seconds a leader holds the Lease without renewing it.
    #[arg(long, default_value_t = 15)]
    pub lease_duration_seconds: u64,
}

impl LeaderElectionArgs {
    /// Leader election as the flags ask, `None` when it is off.
    pub fn leader_election(&self) -> Option<LeaderElection> {
        self.leader_elect.then(|| LeaderElection {
            namespace: self.lease_namespace.clone(),
            lease_duration: Duration::from_secs(self.lease_duration_seconds),
            identity: None,
        })
    }
}

/// Leader election settings (the Lease's name is the component's: see
/// [`Builder::with_leader_election`](crate::Builder::with_leader_election)).
#[derive(Clone, Debug)]
pub struct LeaderElection {
    /// Namespace of the Lease.
    pub namespace: String,
    /// How long a leader holds the Lease without renewing it.
    pub lease_duration: Duration,
    /// This replica's identity in the Lease (default: [`identity`]).
    pub identity: Option<String>,
}

/// This process's identity in the Lease: the pod name when set, else host name and pid.
pub fn identity() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| {
            let host = std::fs::read_to_string("/etc/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_default();
            format!(
                "{}-{}",
                if host.is_empty() { "unknown" } else { &host },
                std::process::id()
            )
        })
}

/// Held leadership. [`lost`](Self::lost) resolves when it ends.
pub struct Leadership {
    namespace: String,
    name: String,
    state: watch::Receiver<bool>,
    task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
}

impl Leadership {
    /// Waits until this process holds Lease `namespace/name`.
    pub async fn acquire(
        client: Client,
        namespace: &str,
        name: &str,
        duration: Duration,
    ) -> Result<Self, Error> {
        Self::acquire_as(client, namespace, name, duration, identity()).await
    }

    /// Like [`acquire`](Self::acquire) under an explicit identity, for several candidates in one process
    /// (tests running two replicas in process).
    pub async fn acquire_as(
        client: Client,
        namespace: &str,
        name: &str,
        duration: Duration,
        identity: String,
    ) -> Result<Self, Error> {
        let lease_error = |source| Error::Lease {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            source,
        };
        let duration_secs = duration.as_secs().max(3);
        let manager = LeaseManagerBuilder::new(client, name)
            .with_namespace(namespace)
            .with_identity(identity.clone())
            .with_duration(duration_secs)
            .with_grace((duration_secs / 3).max(1))
            .build()
            .await
            .map_err(lease_error)?;
        let (mut state, task) = manager.watch().await;
        tracing::info!(lease = %format!("{namespace}/{name}"), identity = %identity, "waiting for leadership");
        while !*state.borrow_and_update() {
            if state.changed().await.is_err() {
                return Err(Error::LeaseTaskEnded {
                    namespace: namespace.to_owned(),
                    name: name.to_owned(),
                });
            }
        }
        tracing::info!(lease = %format!("{namespace}/{name}"), "became leader");
        Ok(Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            state,
            task,
        })
    }

    /// Resolves when leadership is lost (another replica took the Lease, or renewing failed for too long).
    pub async fn lost(&mut self) -> Error {
        while *self.state.borrow_and_update() {
            if self.state.changed().await.is_err() {
                break;
            }
        }
        tracing::warn!(lease = %format!("{}/{}", self.namespace, self.name), "lost leadership");
        Error::LeaseTaskEnded {
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        self.task.abort();
    }
}
