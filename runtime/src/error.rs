//! The runtime's error, and [`chain`]: one line naming an error and its causes, as every component logs
//! and reports them.

/// An error and every cause, joined by `: `, each told once: kube's API errors, which print the
/// apiserver's status twice (`ApiError: msg: Reason (Status {..})`, then the status again as their cause),
/// are told by their message and reason alone, and a cause whose text is already in the line is left out.
/// For log fields, conditions and events, which have no place for a cause chain.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut line = String::new();
    let mut next = Some(error);
    while let Some(cause) = next {
        let text = cause.to_string();
        let text = match text.split_once(" (Status {") {
            Some((short, _)) => short.to_owned(),
            None => text,
        };
        if !text.is_empty() && !line.contains(&text) {
            if !line.is_empty() {
                line.push_str(": ");
            }
            line.push_str(&text);
        }
        next = cause.source();
    }
    line
}

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

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    #[error("applying Secret ns/root-ca")]
    struct Applying(#[source] kube::Error);

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] std::io::Error);

    #[test]
    fn every_cause_is_told_once_and_kube_statuses_briefly() {
        let status = kube::core::Status {
            status: Some(kube::core::response::StatusSummary::Failure),
            code: 403,
            message: "secrets \"root-ca\" is forbidden".into(),
            reason: "Forbidden".into(),
            ..Default::default()
        };
        let line = chain(&Applying(kube::Error::Api(Box::new(status))));
        assert_eq!(
            line,
            "applying Secret ns/root-ca: ApiError: secrets \"root-ca\" is forbidden: Forbidden"
        );
        assert_eq!(
            chain(&Outer(std::io::Error::other("disk full"))),
            "outer: disk full"
        );
        assert_eq!(chain(&std::io::Error::other("alone")), "alone");
    }
}
