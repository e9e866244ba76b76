/// Errors of vc-dns. Each variant says what was being done.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag's value cannot be used.
    #[error("settings: {0}")]
    Settings(String),
    /// The DNS port could not be opened.
    #[error("listening on {addr} ({protocol})")]
    Listen {
        /// The address.
        addr: std::net::SocketAddr,
        /// `udp` or `tcp`.
        protocol: &'static str,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The upstream resolver could not be built.
    #[error("upstream resolver: {0}")]
    Upstream(String),
    /// A watch stopped before its first listing.
    #[error("the {0} watch stopped before it listed")]
    NeverSynced(&'static str),
    /// The server task failed.
    #[error("DNS server")]
    Server(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The server or its watches stopped without being asked to.
    #[error("{0}")]
    Stopped(&'static str),
    /// The shared runtime (admin endpoint, client) failed.
    #[error(transparent)]
    Runtime(#[from] vc_runtime::Error),
}

/// Results of vc-dns.
pub type Result<T, E = Error> = std::result::Result<T, E>;
