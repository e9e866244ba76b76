/// Errors of the harness. Each variant says what the harness was doing.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A binary could not be found.
    #[error("{binary} not found (looked in {searched})")]
    MissingBinary {
        /// File name of the binary.
        binary: &'static str,
        /// Where it was looked for.
        searched: String,
    },
    /// A file or process operation failed.
    #[error("{context}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A process exited or never became ready.
    #[error("{name} did not become ready: {reason}; last log lines:\n{log_tail}")]
    NotReady {
        /// The process.
        name: String,
        /// Why.
        reason: String,
        /// The end of its log.
        log_tail: String,
    },
    /// Certificate generation failed.
    #[error("generating {what}")]
    Pki {
        /// What was being generated.
        what: String,
        /// The PKI's error.
        #[source]
        source: Box<tenant_pki::Error>,
    },
    /// A Kubernetes API call failed.
    #[error("{context}")]
    Kube {
        /// What was being done.
        context: String,
        /// The kube error.
        #[source]
        source: kube::Error,
    },
    /// A kubeconfig could not be built or read.
    #[error("kubeconfig {context}")]
    Kubeconfig {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A wait ran out of time.
    #[error("timed out after {seconds:.1}s waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        seconds: f64,
    },
    /// TLS configuration failed.
    #[error("TLS: {context}")]
    Tls {
        /// What was being configured.
        context: String,
        /// The rustls error.
        #[source]
        source: rustls::Error,
    },
    /// A component run in process (vc-manager, syncer, vn-agent) failed to start.
    #[error("{component} did not start")]
    Component {
        /// The component.
        component: &'static str,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A host command of the real-node harness (ip, iptables, runc, ...) failed.
    #[error("{context}: `{command}` exited with {status}: {stderr}")]
    Command {
        /// What was being done.
        context: String,
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// The end of what it wrote to stderr.
        stderr: String,
    },
    /// A part that real nodes need is missing from this machine.
    #[error("real nodes need {part}: {hint}")]
    MissingPart {
        /// What is missing.
        part: String,
        /// How to get it.
        hint: String,
    },
    /// An HTTP request of the harness failed.
    #[error("HTTP {context}")]
    Http {
        /// The request.
        context: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

/// Result of harness operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }

    pub(crate) fn kube(context: impl Into<String>) -> impl FnOnce(kube::Error) -> Self {
        let context = context.into();
        move |source| Self::Kube { context, source }
    }
}

/// An error and its causes on one line.
pub use vc_runtime::error::chain as error_chain;
