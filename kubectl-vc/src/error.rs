//! The errors of `kubectl vc`. Each one's message is a complete sentence for one line of stderr: what was
//! being done, on which object, and what the apiserver (or the file, or the clock) said.

use std::{path::PathBuf, time::Duration};

/// Errors of `kubectl vc`.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No kubeconfig could be loaded, or it has no usable context.
    #[error("loading the kubeconfig{}: {message}", path.as_ref().map(|p| format!(" {}", p.display())).unwrap_or_default())]
    Config {
        /// The `--kubeconfig` path, if one was given.
        path: Option<PathBuf>,
        /// What went wrong.
        message: String,
    },

    /// An object does not exist.
    #[error("{kind} {name:?} not found in namespace {namespace:?}")]
    NotFound {
        /// `VirtualCluster`, `Secret`...
        kind: &'static str,
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },

    /// A request to the super cluster failed (forbidden, invalid, conflict, unreachable...).
    #[error("{action}: {}", api_message(error))]
    Api {
        /// What was being done, e.g. `reading VirtualCluster team/vc-1`.
        action: String,
        /// kube's error.
        error: kube::Error,
    },

    /// The manifest file could not be read.
    #[error("reading {path}: {error}")]
    ReadFile {
        /// The path (`-` for stdin).
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
    /// A document of the manifest file is not valid YAML or not a valid object of its kind.
    #[error("{path}: document {document}: {message}")]
    InvalidDocument {
        /// The path.
        path: String,
        /// 1-based index of the document in the file.
        document: usize,
        /// What is wrong.
        message: String,
    },
    /// A document of the manifest file is of a kind `kubectl vc create` does not apply.
    #[error(
        "{path}: document {document} is a {kind} ({api_version}); kubectl vc create applies only VirtualCluster and ClusterVersion (tenancy.x-k8s.io/v1alpha1) — use kubectl apply for other objects"
    )]
    UnsupportedKind {
        /// The path.
        path: String,
        /// 1-based index of the document in the file.
        document: usize,
        /// Its `apiVersion`.
        api_version: String,
        /// Its `kind`.
        kind: String,
    },
    /// The manifest file has no objects.
    #[error("{path} has no VirtualCluster or ClusterVersion")]
    EmptyFile {
        /// The path.
        path: String,
    },
    /// An object's namespace differs from the `--namespace` given.
    #[error(
        "{kind} {name:?} in {path} is in namespace {object_namespace:?}, but --namespace is {namespace:?}; drop one of them or make them agree"
    )]
    NamespaceMismatch {
        /// The path.
        path: String,
        /// The kind.
        kind: &'static str,
        /// The object's name.
        name: String,
        /// `metadata.namespace` in the file.
        object_namespace: String,
        /// `--namespace`.
        namespace: String,
    },

    /// A provisioned VirtualCluster has no root namespace yet.
    #[error(
        "VirtualCluster {vc} has no cluster namespace yet (phase {phase}): vc-manager has not provisioned it; wait with `kubectl vc describe {name}` or `kubectl vc create -f ... --wait`"
    )]
    NotProvisioned {
        /// `namespace/name`.
        vc: String,
        /// Its name (for the hint).
        name: String,
        /// Its phase, or `none`.
        phase: String,
    },
    /// A Secret in the tenant's root namespace is missing a key or holds something unusable.
    #[error("Secret {namespace}/{name}: {problem}")]
    BadSecret {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A kubeconfig could not be read or written.
    #[error("kubeconfig from {origin}: {problem}")]
    Kubeconfig {
        /// Where it came from.
        origin: String,
        /// What is wrong with it.
        problem: String,
    },
    /// A kubeconfig file to write into cannot be read, parsed, locked or written.
    #[error("kubeconfig file {}: {problem}", path.display())]
    KubeconfigFile {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        problem: String,
    },
    /// Entries of the names `connect` writes exist in the kubeconfig file for something else.
    #[error(
        "kubeconfig file {} already has {entries} for something else; nothing was written: pass --overwrite to replace them, or --context-name to write under another name",
        path.display()
    )]
    KubeconfigConflict {
        /// The file.
        path: PathBuf,
        /// The entries, e.g. `cluster "team-a", context "team-a"`.
        entries: String,
    },
    /// The tenant apiserver does not answer from here and cannot be port-forwarded to.
    #[error("{0}")]
    Unreachable(String),
    /// The port-forward to the tenant apiserver could not be set up or does not work.
    #[error("port-forward to the tenant apiserver: {0}")]
    PortForward(String),
    /// Per-user certificates were asked for an adopted VirtualCluster.
    #[error(
        "VirtualCluster {vc} is adopted and vc-manager does not hold its certificate authority, so kubectl vc cannot mint user certificates for it; store the adopted apiserver's client CA (the certificate and key behind its --client-ca-file) as Secret {namespace}/{secret} with keys tls.crt and tls.key, or create users with the adopted cluster's own tooling"
    )]
    AdoptedNoCa {
        /// `namespace/name`.
        vc: String,
        /// The tenant's root namespace.
        namespace: String,
        /// The Secret that would hold the CA.
        secret: &'static str,
    },
    /// The tenant PKI's error: reading an adopted tenant's kubeconfig, or issuing a certificate.
    #[error("{}", vc_runtime::error::chain(.0.as_ref()))]
    Pki(Box<tenant_pki::Error>),
    /// A flag has an unusable value.
    #[error("{flag}: {problem}")]
    InvalidArgument {
        /// The flag, e.g. `--user`.
        flag: &'static str,
        /// What is wrong.
        problem: String,
    },

    /// `uninstall prepare --virtual-clusters refuse` found VirtualClusters.
    #[error(
        "{count} VirtualCluster(s) exist, so the platform is not removed (they would keep running unmanaged, and their finalizers would block their deletion): {listing}. Delete them first (kubectl vc delete NAME --wait), or choose what happens to them: helm uninstall with uninstall.virtualClusters=delete (delete them all) or orphan (leave them running), e.g. helm upgrade --reuse-values --set uninstall.virtualClusters=delete before helm uninstall"
    )]
    UninstallRefused {
        /// How many.
        count: usize,
        /// `namespace/name (phase)`, comma-separated.
        listing: String,
    },

    /// `--wait` saw the VirtualCluster fail.
    #[error("VirtualCluster {vc} failed: {condition} {reason}: {message}")]
    Failed {
        /// `namespace/name`.
        vc: String,
        /// The failing condition, e.g. `Ready=False`, or `phase Error`.
        condition: String,
        /// Its reason.
        reason: String,
        /// Its message.
        message: String,
    },
    /// `--wait` saw the VirtualCluster disappear before it was Running.
    #[error("VirtualCluster {vc} was deleted while waiting for it to be Running")]
    Vanished {
        /// `namespace/name`.
        vc: String,
    },
    /// `--wait` ran out of time.
    #[error("timed out after {} waiting for {what}; last seen: {last}", crate::duration::format(*after))]
    Timeout {
        /// What was waited for.
        what: String,
        /// The timeout.
        after: Duration,
        /// The last state seen.
        last: String,
    },

    /// The process plumbing of a long-running command (admin endpoint, Lease) failed.
    #[error("{}", runtime_message(.0))]
    Runtime(#[from] vc_runtime::Error),

    /// A snapshot folder cannot be written, read, or is not a valid snapshot.
    #[error("snapshot {}: {problem}", path.display())]
    Snapshot {
        /// The snapshot folder (or the folder it goes into).
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// A tenant's etcd refused or failed a request.
    #[error("etcd (through the port-forward at {address}): {action}: {problem}")]
    Etcd {
        /// The port-forward's local end.
        address: std::net::SocketAddr,
        /// What was being done.
        action: String,
        /// etcd's answer.
        problem: String,
    },
    /// A snapshot was asked of an adopted VirtualCluster, whose etcd vc-manager does not run.
    #[error(
        "VirtualCluster {vc} is not provisioned by vc-manager (adopted, or no clusterVersionName), so kubectl vc has no etcd to snapshot; back up the adopted cluster with its own tooling"
    )]
    NotNative {
        /// `namespace/name`.
        vc: String,
    },

    /// Writing the output failed (e.g. a closed pipe).
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
    /// An object could not be serialized.
    #[error("serializing {what}: {message}")]
    Serialize {
        /// What.
        what: String,
        /// The serializer's message.
        message: String,
    },
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The apiserver's message for an API error (`virtualclusters.tenancy.x-k8s.io "x" is forbidden: User ...`);
/// kube's own text otherwise.
pub fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) if !status.message.is_empty() => status.message.clone(),
        kube::Error::Api(status) => format!("{} ({})", status.reason, status.code),
        other => vc_runtime::error::chain(other),
    }
}

/// A runtime error with its causes, on one line.
fn runtime_message(error: &vc_runtime::Error) -> String {
    vc_runtime::error::chain(error)
}

impl From<tenant_pki::Error> for Error {
    fn from(error: tenant_pki::Error) -> Self {
        Self::Pki(Box::new(error))
    }
}

impl Error {
    /// An API error while `action`.
    pub fn api(action: impl Into<String>, error: kube::Error) -> Self {
        Self::Api {
            action: action.into(),
            error,
        }
    }

    /// A 404 of `kind` `namespace/name` becomes [`Error::NotFound`], anything else [`Error::Api`].
    pub fn reading(kind: &'static str, namespace: &str, name: &str, error: kube::Error) -> Self {
        match &error {
            kube::Error::Api(status) if status.code == 404 => Self::NotFound {
                kind,
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            },
            _ => Self::api(format!("reading {kind} {namespace}/{name}"), error),
        }
    }

    /// The one line printed on failure.
    pub fn one_line(&self) -> String {
        self.to_string().replace('\n', " ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16, reason: &str, message: &str) -> kube::Error {
        kube::Error::Api(Box::new(kube::core::Status {
            code,
            reason: reason.into(),
            message: message.into(),
            ..Default::default()
        }))
    }

    #[test]
    fn messages_are_one_line_with_the_apiservers_words() {
        let forbidden = Error::reading(
            "VirtualCluster",
            "team",
            "vc-1",
            api_error(
                403,
                "Forbidden",
                "virtualclusters.tenancy.x-k8s.io \"vc-1\" is forbidden: User \"bob\" cannot get resource",
            ),
        );
        assert_eq!(
            forbidden.one_line(),
            "reading VirtualCluster team/vc-1: virtualclusters.tenancy.x-k8s.io \"vc-1\" is forbidden: User \"bob\" cannot get resource"
        );
        let missing = Error::reading("VirtualCluster", "team", "vc-1", api_error(404, "NotFound", "x"));
        assert_eq!(
            missing.one_line(),
            "VirtualCluster \"vc-1\" not found in namespace \"team\""
        );
        let timeout = Error::Timeout {
            what: "VirtualCluster team/vc-1 to be Running".into(),
            after: Duration::from_secs(600),
            last: "phase Pending".into(),
        };
        assert_eq!(
            timeout.one_line(),
            "timed out after 10m waiting for VirtualCluster team/vc-1 to be Running; last seen: phase Pending"
        );
    }
}
