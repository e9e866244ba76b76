//! The one error type of tenant-pki. Each variant says what was being done; [`Error::reason`] gives the
//! stable CamelCase word vc-manager uses in conditions, events and metric labels.

/// Errors of tenant-pki.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A key or certificate could not be generated.
    #[error("issuing {what}")]
    Certificate {
        /// Which certificate or key.
        what: String,
        /// rcgen's error.
        #[source]
        source: rcgen::Error,
    },
    /// A certificate's validity period cannot be represented.
    #[error("validity period of {what}")]
    CertificateValidity {
        /// Which certificate.
        what: String,
        /// The time error.
        #[source]
        source: time::error::ComponentRange,
    },

    /// Adopt mode: the Secret holding the kubeconfig does not exist.
    #[error("kubeconfig Secret {namespace}/{name} does not exist")]
    KubeconfigSecretNotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// Adopt mode: the Secret holding the kubeconfig could not be read.
    #[error("reading kubeconfig Secret {namespace}/{name}")]
    KubeconfigSecretRead {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The apiserver's answer.
        #[source]
        source: kube::Error,
    },
    /// Adopt mode: the Secret has no such key.
    #[error("kubeconfig Secret {namespace}/{name} has no key {key:?}")]
    KubeconfigKeyMissing {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The missing key.
        key: String,
    },
    /// Adopt mode: the kubeconfig cannot be parsed or used. Why is told without its content: parse
    /// errors quote their input, and a kubeconfig holds credentials.
    #[error("kubeconfig from {origin} cannot be used: {problem}")]
    KubeconfigInvalid {
        /// Where it came from (Secret key or annotation).
        origin: String,
        /// What is wrong, without a byte of the kubeconfig.
        problem: String,
    },
    /// Adopt mode: the Secret named as the kubeconfig is not meant for this VirtualCluster (it lacks
    /// `tenancy.x-k8s.io/kubeconfig-for: <name>`); nothing of it is read.
    #[error("{problem}")]
    KubeconfigSecretRefused {
        /// What is missing, naming the Secret.
        problem: String,
    },
}

impl Error {
    /// A stable CamelCase word for this failure: the reason of conditions and events, the `result` label of
    /// metrics.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Certificate { .. } | Self::CertificateValidity { .. } => "CertificateIssueFailed",
            Self::KubeconfigSecretNotFound { .. } => "KubeconfigSecretNotFound",
            Self::KubeconfigSecretRead { .. } => "KubeconfigSecretReadFailed",
            Self::KubeconfigKeyMissing { .. } => "KubeconfigKeyMissing",
            Self::KubeconfigInvalid { .. } => "KubeconfigInvalid",
            Self::KubeconfigSecretRefused { .. } => crds::wellknown::REASON_KUBECONFIG_SECRET_REFUSED,
        }
    }

    /// Whether this is about an adopted tenant's kubeconfig (as opposed to issuing certificates).
    pub fn about_kubeconfig(&self) -> bool {
        !matches!(self, Self::Certificate { .. } | Self::CertificateValidity { .. })
    }

    /// Whether the adopted tenant's kubeconfig itself is unusable (missing, refused or invalid), as opposed
    /// to a failure to read it.
    pub fn kubeconfig_unusable(&self) -> bool {
        matches!(
            self,
            Self::KubeconfigSecretNotFound { .. }
                | Self::KubeconfigKeyMissing { .. }
                | Self::KubeconfigInvalid { .. }
                | Self::KubeconfigSecretRefused { .. }
        )
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
