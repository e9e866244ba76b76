//! The one error type of the crds crate.

use std::path::PathBuf;

/// Errors of the crds crate.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A VirtualCluster has no namespace or uid (it was not read from an apiserver), so it has no tenant
    /// identity yet.
    #[error("VirtualCluster {name} has no namespace or uid")]
    MissingIdentity {
        /// Name of the VirtualCluster.
        name: String,
    },
    /// A CRD could not be serialized.
    #[error("cannot render CRD {name} as YAML")]
    Render {
        /// Name of the CRD.
        name: String,
        /// The serializer's error.
        #[source]
        source: serde_saphyr::SerializeError,
    },
    /// A file could not be read or written.
    #[error("cannot access {}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}
