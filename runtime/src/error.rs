/// Errors of the shared runtime. Each variant says what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The admin endpoint could not listen.
    #[error("admin endpoint on {addr}")]
    AdminListen {
        /// The address.
        addr: std::net::SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// No super-cluster configuration was found (neither KUBECONFIG nor an in-cluster service account).
    #[error("no super-cluster configuration (KUBECONFIG or in-cluster service account)")]
    SuperClusterConfig(#[source] kube::config::InferConfigError),
    /// A kubeconfig could not be read. The cause is told without the kubeconfig's content
    /// ([`crate::kubeconfig::without_content`]): parse errors quote their input, and a kubeconfig holds
    /// credentials.
    #[error("kubeconfig {what}: {problem}")]
    Kubeconfig {
        /// What failed.
        what: &'static str,
        /// Why, without a byte of the kubeconfig.
        problem: String,
    },
    /// A kubeconfig asks for something other than plain data: a file, a program, a proxy, clear text.
    #[error("kubeconfig field {field} is refused: {problem}")]
    KubeconfigRefused {
        /// The field, e.g. `users[admin].exec`.
        field: String,
        /// Why it is refused.
        problem: &'static str,
    },
    /// A native tenant's apiserver Service could not be resolved to its cluster IP.
    #[error("tenant apiserver {server}: {problem}")]
    ServiceAddress {
        /// The server URL of the kubeconfig.
        server: String,
        /// What is wrong.
        problem: String,
        /// The API error, when reading the Service failed.
        #[source]
        source: Option<kube::Error>,
    },
    /// A client could not be built.
    #[error("building a Kubernetes client")]
    Client(#[source] kube::Error),
    /// Leader election failed.
    #[error("leader election on Lease {namespace}/{name}")]
    Lease {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
        /// The cause.
        #[source]
        source: kube_lease_manager::LeaseManagerError,
    },
    /// The leader-election task ended.
    #[error("leader election on Lease {namespace}/{name} stopped")]
    LeaseTaskEnded {
        /// Lease namespace.
        namespace: String,
        /// Lease name.
        name: String,
    },
    /// The admin endpoint stopped serving while the component still ran.
    #[error("the admin endpoint stopped")]
    AdminStopped,
    /// A task of the runtime panicked or was cancelled.
    #[error("runtime task: {0}")]
    Task(String),
}
