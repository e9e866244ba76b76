use std::{net::SocketAddr, path::PathBuf};

/// Errors of vn-agent. Each variant says what was being done; request refusals (401/403/404) are not
/// errors but [`crate::proxy::Refusal`]s.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A setting is missing or contradicts another.
    #[error("invalid settings: {0}")]
    Settings(String),
    /// A certificate, key or CA file could not be read or parsed.
    #[error("{what} {}", path.display())]
    PemFile {
        /// What the file holds.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// PEM data could not be parsed.
    #[error("parsing {what}")]
    Pem {
        /// What the data holds.
        what: String,
        /// The cause.
        #[source]
        source: rustls_pki_types::pem::Error,
    },
    /// A file held no certificate.
    #[error("{what} {} holds no certificate", path.display())]
    NoCertificate {
        /// What the file should hold.
        what: &'static str,
        /// The file.
        path: PathBuf,
    },
    /// A TLS configuration could not be built.
    #[error("TLS: {context}")]
    Tls {
        /// What was being configured.
        context: String,
        /// The cause.
        #[source]
        source: rustls::Error,
    },
    /// A certificate verifier could not be built.
    #[error("building the certificate verifier for {context}")]
    Verifier {
        /// Whose certificates it verifies.
        context: String,
        /// The cause.
        #[source]
        source: rustls::server::VerifierBuilderError,
    },
    /// The serving certificate could not be generated.
    #[error("generating a self-signed serving certificate")]
    GenerateCertificate(#[source] rcgen::Error),
    /// The proxy could not listen.
    #[error("listening on {addr}")]
    Listen {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A watch-fed cache stopped before it was filled.
    #[error("the {cache} cache stopped before it synced")]
    CacheSync {
        /// Which cache.
        cache: &'static str,
    },
    /// The backend (kubelet or super apiserver) could not be reached or answered badly.
    #[error("{backend} request {method} {path}")]
    Backend {
        /// `kubelet` or `super apiserver`.
        backend: &'static str,
        /// The method.
        method: http::Method,
        /// Path (without the query, which may carry commands).
        path: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The super apiserver refused or failed a lookup.
    #[error("super apiserver: {context}")]
    Kube {
        /// What was being done.
        context: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// A backend response could not be read or rewritten.
    #[error("rewriting the {what} response")]
    Rewrite {
        /// Which response.
        what: &'static str,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The proxy task ended with a panic or was aborted.
    #[error("the proxy task ended abnormally")]
    Task(#[source] tokio::task::JoinError),
    /// The proxy or its caches stopped while nothing asked them to.
    #[error("{0}")]
    Stopped(&'static str),
    /// The shared runtime (admin endpoint, client) failed.
    #[error(transparent)]
    Runtime(#[from] vc_runtime::Error),
}

/// Results of vn-agent.
pub type Result<T, E = Error> = std::result::Result<T, E>;
